"""The lookahead teacher: rollouts on copies, picks with a margin, labels per state, experiments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlsched.envs.gpu_pool import GpuPoolEnv
from rlsched.train.config import ExperimentError, load_experiment
from rlsched.train.lookahead import LookaheadTeacher, pick_by_rollouts, rollout_penalty
from rlsched.train.teacher import teacher_action
from tests.train.test_config import write

NOMINATORS = ("weighted-priority", "sjf", "fair-share", "fifo")


def _trace(tmp_path: Path) -> Path:
    """One 8-GPU node: long 8-GPU jobs of one user arrive first, then a stream of short 1-GPU jobs.

    In submission order (weighted-priority and fifo with equal priorities) each long job holds the
    node for hours while the short ones wait; shortest-first runs the short ones in between, so
    sjf's jobs-in-system integral is far lower.
    """
    rows = ["job_id,submit_time,duration,num_gpus,user"]
    rows += [f"long{i},{i * 30},{14_400 + i * 60},8,long" for i in range(6)]
    rows += [f"short{i},{200 + i * 20},{300 + (i % 4) * 60},1,short" for i in range(120)]
    # finished jobs of both users teach the estimator before the episode: later arrivals repeat them
    rows += [f"late-long{i},{40_000 + i * 30},{14_400 + i * 60},8,long" for i in range(4)]
    rows += [f"late-short{i},{40_200 + i * 20},{300 + (i % 4) * 60},1,short" for i in range(80)]
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _env(tmp_path: Path) -> GpuPoolEnv:
    scenario = {"cluster": "1x8xA100-80GB", "workload": [{"path": str(_trace(tmp_path))}]}
    return GpuPoolEnv(scenario, nominators=NOMINATORS)


def _at_a_choice(env: GpuPoolEnv, seed: int = 3) -> np.ndarray:
    """Reset and follow weighted-priority to the first decision with more than one legal action."""
    env.reset(seed=seed)
    for _ in range(10_000):
        mask = env.action_masks()
        if mask.sum() > 1 and len(env.engine.state.queue) > 20:
            return mask
        env.step(teacher_action(env.codec, env.engine.state, mask, rule="follow:weighted-priority"))
    raise AssertionError("no decision with a choice and a queue")


def _fingerprint(env: GpuPoolEnv) -> tuple[Any, ...]:
    st = env.engine.state
    return (env.engine.now, tuple(st.queue), tuple(sorted(st.running)),
            env.action_masks().tobytes())


def test_a_rollout_leaves_the_environment_alone_and_is_what_stepping_it_would_give(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _at_a_choice(env)
    before = _fingerprint(env)
    first = rollout_penalty(env, "follow:sjf", 6 * 3600.0)
    assert _fingerprint(env) == before
    assert rollout_penalty(env, "follow:sjf", 6 * 3600.0) == first  # same random state, same draws
    # the copy is faithful: stepping the environment itself the same way charges the same penalty
    start, penalty = env.engine.now, 0.0
    while True:
        a = teacher_action(env.codec, env.engine.state, env.action_masks(), rule="follow:sjf")
        _, reward, term, trunc, _ = env.step(a)
        penalty -= reward
        if term or trunc or env.engine.now - start >= 6 * 3600.0:
            break
    assert penalty == pytest.approx(first, rel=1e-12)
    assert first > 0.0


def test_the_default_is_kept_unless_another_candidate_saves_the_margin(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _at_a_choice(env)
    name, penalties = pick_by_rollouts(env, ("weighted-priority", "sjf"), 12 * 3600.0, margin=0.02)
    assert set(penalties) == {"weighted-priority", "sjf"}
    assert penalties["sjf"] < 0.9 * penalties["weighted-priority"]  # the world is built for that
    assert name == "sjf"
    saved = 1.0 - penalties["sjf"] / penalties["weighted-priority"]
    kept, _ = pick_by_rollouts(env, ("weighted-priority", "sjf"), 12 * 3600.0, margin=min(0.99, saved + 0.01))
    assert kept == "weighted-priority"
    # the order of the candidates names the default
    assert pick_by_rollouts(env, ("sjf", "weighted-priority"), 12 * 3600.0, margin=0.02)[0] == "sjf"


def test_labels_come_on_an_episodes_first_choice_and_every_n_choices(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import rlsched.train.lookahead as lookahead

    picks = iter(["sjf", "fair-share", "weighted-priority"] * 100)
    calls: list[float] = []

    def fake_pick(env: Any, candidates: tuple[str, ...], horizon_s: float, margin: float) -> tuple[str, dict]:
        calls.append(env.engine.now)
        return next(picks), {}

    monkeypatch.setattr(lookahead, "pick_by_rollouts", fake_pick)
    teacher = LookaheadTeacher(("weighted-priority", "sjf", "fair-share"), every=5)
    env = _env(tmp_path)
    env.reset(seed=1)
    rules, choices = [], 0
    for _ in range(40):
        mask = env.action_masks()
        rule = teacher.rule_for(env, mask)
        choices += int(mask.sum() > 1)
        rules.append(rule)
        env.step(teacher_action(env.codec, env.engine.state, mask, rule=rule))
    assert choices >= 10
    assert len(calls) == -(-choices // 5)  # a label on the first choice, then every 5th
    assert sum(teacher.labels.values()) == len(calls)
    assert rules[-1] in {"follow:sjf", "follow:fair-share", "follow:weighted-priority"}
    # a new episode labels its first choice again, whatever the countdown was
    env.reset(seed=2)
    n = len(calls)
    while not env.action_masks().sum() > 1:
        teacher.rule_for(env, env.action_masks())
        env.step(env.codec.wait_action)
    teacher.rule_for(env, env.action_masks())
    assert len(calls) == n + 1


def test_bad_lookahead_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="candidate"):
        LookaheadTeacher(())
    with pytest.raises(ValueError, match="every >= 1"):
        LookaheadTeacher(("sjf",), every=0)
    with pytest.raises(ValueError, match="margin"):
        LookaheadTeacher(("sjf",), margin=1.0)


def _experiment(tmp_path: Path, bc: str, nominators: str = "[weighted-priority, sjf, fair-share, fifo]") -> Path:
    return write(tmp_path, f"""
name: smoke-lookahead
scenarios:
  - name: long-and-short
    scenario: {{cluster: 1x8xA100-80GB, workload: [{{path: "{_trace(tmp_path)}"}}]}}
    train_window_h: [0, 10]
    eval_windows_h: [[10, 13]]
episode_jobs: 150
eval_max_jobs: 30
n_envs: 1
vec_env: dummy
total_steps: 128
ppo: {{n_steps: 64, batch_size: 32, n_epochs: 1}}
bc: {bc}
{"nominators: " + nominators if nominators else ""}
checkpoint_every_steps: 100000
gate: off
output: {tmp_path / 'model'}
""")


LOOKAHEAD_BC = ("{steps: 400, epochs: 1, teacher: lookahead, candidates: [weighted-priority, sjf], "
                "label_every: 20, label_horizon_s: 21600}")


def test_collected_teacher_data_follows_the_labels(tmp_path: Path) -> None:
    from rlsched.train.run_steps import prepare_worlds
    from rlsched.train.trainer import collect_teacher

    exp = load_experiment(_experiment(tmp_path, LOOKAHEAD_BC))
    assert exp.bc.lookahead_candidates(exp.nominators) == ("weighted-priority", "sjf")
    lines: list[str] = []
    data = collect_teacher(exp, prepare_worlds(exp, lambda _: None).training, 400, log=lines.append)
    assert data.masks[np.arange(len(data.actions)), data.actions].all()  # every label's action is legal
    assert set(data.labels) <= {"weighted-priority", "sjf"} and data.labels.get("sjf", 0) >= 1
    assert any(line.startswith("lookahead labels (6 h rollouts every 20 choices): weighted-priority ")
               for line in lines)


def test_a_lookahead_experiment_trains_and_its_card_counts_the_labels(tmp_path: Path) -> None:
    from rlsched.train.trainer import train

    exp = load_experiment(_experiment(tmp_path, LOOKAHEAD_BC))
    res = train(exp, run_dir=tmp_path / "run", log=lambda _: None, quiet=True, track=False)
    card = json.loads((res.model_dir / "card.json").read_text())
    cloning = card["behaviour_cloning"]
    assert cloning["teacher"] == "lookahead"
    assert cloning["bc/labels_sjf"] >= 1
    assert {"teacher:follow:weighted-priority", "teacher:follow:sjf"} <= set(card["metrics"]["eval"])


@pytest.mark.parametrize(("bc", "nominators", "message"), [
    ("{teacher: lookahead}", "", "lookahead and follow:NAME need nominators"),
    ("{teacher: lookahead, candidates: [sjf, tiresias]}", "[sjf, fifo]", "'tiresias' not among the nominators"),
    ("{teacher: lookahead, candidates: [sjf, sjf]}", "[sjf, fifo]", "names a nominator twice"),
    ("{teacher: lookahead, label_every: 0}", "[sjf, fifo]", "bc.label_every must be >= 1"),
    ("{teacher: lookahead, label_horizon_s: -1}", "[sjf, fifo]", "bc.label_horizon_s > 0"),
    ("{teacher: lookahead, label_margin: 1.5}", "[sjf, fifo]", "bc.label_margin in"),
    ("{teacher: lookahead, label_every: often}", "[sjf, fifo]", "must be numbers"),
    ("{teacher: 'follow:sjf', candidates: [sjf]}", "[sjf, fifo]", "only applies to bc.teacher: lookahead"),
])
def test_bad_lookahead_keys_are_one_line_errors(tmp_path: Path, bc: str, nominators: str, message: str) -> None:
    with pytest.raises(ExperimentError, match=message) as err:
        load_experiment(_experiment(tmp_path, bc, nominators))
    assert "\n" not in str(err.value)
