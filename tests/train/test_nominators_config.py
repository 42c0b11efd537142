"""Experiment keys of the nominated window: ``nominators:`` and the follow teachers."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.train.config import ExperimentError, load_experiment
from tests.train.test_config import BASE, write


def test_nominators_and_best_follow_load(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, BASE + "nominators: [sjf, fair-share]\nbc: {teacher: best-follow}\n"))
    assert exp.nominators == ("sjf", "fair-share")
    assert exp.bc.teacher == "best-follow"
    exp = load_experiment(write(tmp_path, BASE + "nominators: [sjf, fifo]\nbc: {teacher: 'follow:fifo'}\n"))
    assert exp.bc.teacher == "follow:fifo"
    assert load_experiment(write(tmp_path, BASE)).nominators == ()


@pytest.mark.parametrize(("extra", "needle"), [
    ("nominators: sjf\n", "nominators must be a list"),
    ("nominators: [sjf, lifo]\n", "unknown heuristic 'lifo'"),
    ("nominators: [sjf, sjf]\n", "at most once"),
    ("bc: {teacher: best-follow}\n", "need nominators"),
    ("nominators: [sjf]\nbc: {teacher: 'follow:fifo'}\n", "follow:NAME for a nominator"),
])
def test_bad_nominator_settings_are_one_line(tmp_path: Path, extra: str, needle: str) -> None:
    with pytest.raises(ExperimentError, match=needle) as info:
        load_experiment(write(tmp_path, BASE + extra))
    assert "\n" not in str(info.value)


def test_best_follow_keeps_the_default_unless_another_wins_by_the_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import rlsched.train.teacher as teacher

    class FakeEnv:
        """An episode is one step; its mean JCT depends only on the teacher rule followed."""

        codec = None
        engine = SimpleNamespace(state=None)

        def __init__(self, jct: dict[str, float]) -> None:
            self.jct, self.rule = jct, ""

        def reset(self, seed: int | None = None) -> None:
            pass

        def action_masks(self) -> None:
            return None

        def step(self, action: str):  # type: ignore[no-untyped-def]
            return None, 0.0, True, False, {"report": {"mean_jct_s": self.jct[action]}}

    monkeypatch.setattr(teacher, "teacher_action", lambda codec, state, mask, rule: rule)
    envs = [FakeEnv({"follow:sjf": 100.0, "follow:fifo": 98.0}),   # 2% better: noise, keep the default
            FakeEnv({"follow:sjf": 100.0, "follow:fifo": 90.0})]   # 10% better: taught
    assert teacher.best_follow_rules(envs, ("sjf", "fifo"), episodes=2) == ["follow:sjf", "follow:fifo"]


def test_best_follow_judges_on_episodes_of_the_given_length_and_restores_the_env(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Orderings only differ once a backlog builds: a pick on short episodes ties, a long one decides."""
    from types import SimpleNamespace

    import rlsched.train.teacher as teacher

    class FakeEnv:
        codec = None
        engine = SimpleNamespace(state=None)
        episode_jobs = 300

        def __init__(self) -> None:
            self.jobs_seen: list[int] = []

        def reset(self, seed: int | None = None) -> None:
            self.jobs_seen.append(self.episode_jobs)

        def action_masks(self) -> None:
            return None

        def step(self, action: str):  # type: ignore[no-untyped-def]
            long = self.jobs_seen[-1] >= 1000
            jct = 80.0 if long and action == "follow:sjf" else 100.0  # sjf wins only on a deep backlog
            return None, 0.0, True, False, {"report": {"mean_jct_s": jct}}

    monkeypatch.setattr(teacher, "teacher_action", lambda codec, state, mask, rule: rule)
    env = FakeEnv()
    assert teacher.best_follow_rules([env], ("weighted-priority", "sjf"), episodes=1) == ["follow:weighted-priority"]
    assert teacher.best_follow_rules([env], ("weighted-priority", "sjf"), episodes=1, jobs=1500) == ["follow:sjf"]
    assert env.jobs_seen == [300, 300, 1500, 1500] and env.episode_jobs == 300
