"""Training and family evaluation on a real two-node Ray cluster (``rlsched train --ray``).

One local ``ray.cluster_utils.Cluster`` (a head and a worker node, one CPU each, on a port of its
own: never ``auto``, which could find another test's cluster) serves the module. The rollouts of
:class:`~rlsched.train.ray_vec_env.RayVecEnv` must equal ``DummyVecEnv``'s, so a tiny MaskablePPO run
from the same seed must end with bit-identical parameters; the family replays as Ray tasks must
give the process pool's numbers; a bad address must be one line and a non-zero exit, in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("ray")
pytest.importorskip("sb3_contrib")


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A two-node Ray cluster of this module's own, with this process connected as its driver."""
    from rlsched.ray_connect import connect
    from tests.raycluster import ray_cluster

    with ray_cluster() as cluster:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield connect(cluster.address, "test")


def _tiny_experiment() -> Any:
    from rlsched.train.config import load_experiment

    exp = load_experiment(ROOT / "experiments" / "smoke.yaml")
    return replace(exp, n_envs=2, vec_env="dummy", total_steps=512, seed=7, network={"hidden": 16}, episode_jobs=20,
                   ppo=replace(exp.ppo, n_steps=128, batch_size=64, n_epochs=2))


def _train(exp: Any, ray: str | None) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """MaskablePPO as ``rlsched train`` builds it, ``exp.total_steps`` steps; its parameters, episodes, steps/s."""
    from rlsched.train.run_steps import Worlds, worlds_actions
    from rlsched.train.trainer import SlotTrainingRun, make_vec_env, scaled
    from rlsched.train.worlds import training_worlds

    worlds = training_worlds(exp.scenarios)
    venv = scaled(make_vec_env(exp, worlds, exp.seed, ray=ray), 0.05)
    try:
        run = SlotTrainingRun(exp, Worlds(worlds, [], [], worlds_actions(worlds, exp), {}), lambda _: None, None)
        model, _ = run.model(venv, None, None, 1.0)
        initial = {k: v.clone() for k, v in model.policy.state_dict().items()}
        t0 = time.perf_counter()
        model.learn(total_timesteps=exp.total_steps)
        rate = exp.total_steps / (time.perf_counter() - t0)
        learned = model.policy.state_dict()
        assert any(not v.equal(initial[k]) for k, v in learned.items()), "PPO changed no parameter"
        return learned, list(model.ep_info_buffer), rate
    finally:
        venv.close()


def test_ray_rollouts_learn_the_same_parameters_as_dummy(ray_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from rlsched.train import trainer

    # episodes cut at 100 steps, so that the run crosses several auto-resets (an untrained policy
    # rarely finishes a window in a few hundred steps)
    env_kwargs = trainer._env_kwargs
    monkeypatch.setattr(trainer, "_env_kwargs", lambda exp: {**env_kwargs(exp), "max_steps": 100})
    exp = _tiny_experiment()
    local, local_eps, local_rate = _train(exp, None)
    remote, remote_eps, remote_rate = _train(exp, ray_address)
    assert list(local) == list(remote)
    differ = [k for k in local if not torch.equal(local[k], remote[k])]
    assert not differ, f"parameters differ: {differ}"
    # the finished episodes (Monitor's info, through the actors) are the same ones, with the same returns
    assert [e["r"] for e in local_eps] == [e["r"] for e in remote_eps]
    assert len(local_eps) >= 4, "too few episodes: the comparison would not cover auto-reset"
    print(f"steps/s: DummyVecEnv {local_rate:.0f}, RayVecEnv {remote_rate:.0f}")


def test_ray_vec_env_answers_like_dummy(ray_address: str) -> None:
    from stable_baselines3.common.monitor import Monitor

    from rlsched.train.ray_vec_env import RayVecEnv
    from rlsched.train.trainer import make_vec_env
    from rlsched.train.worlds import training_worlds

    exp = _tiny_experiment()
    worlds = training_worlds(exp.scenarios)
    local, remote = make_vec_env(exp, worlds, 3), make_vec_env(exp, worlds, 3, ray=ray_address, actor_cpus=0.25)
    try:
        assert isinstance(remote, RayVecEnv) and remote.num_envs == 2
        for v in (local, remote):
            v.seed(11)
        a, b = local.reset(), remote.reset()
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
        assert local.reset_infos == remote.reset_infos
        assert np.array_equal(np.stack(local.env_method("action_masks")), np.stack(remote.env_method("action_masks")))
        assert remote.get_attr("labels") == local.get_attr("labels")
        assert remote.has_attr("action_masks") and not remote.has_attr("no_such_attribute")
        with pytest.raises(AttributeError):
            remote.get_attr("no_such_attribute")
        # a method comes back as a callable that runs in the actor, not the pickled environment
        assert np.array_equal(remote.get_attr("action_masks", indices=[1])[0](), local.env_method("action_masks")[1])
        assert remote.env_is_wrapped(Monitor) == [True, True]
        remote.set_attr("marker", 5, indices=[0])
        assert remote.get_attr("marker", indices=[0]) == [5]
        for _ in range(3):
            acts = np.array([int(np.flatnonzero(m)[0]) for m in local.env_method("action_masks")])
            la, lr, ld, _ = local.step(acts)
            ra, rr, rd, _ = remote.step(acts)
            assert all(np.array_equal(la[k], ra[k]) for k in la)
            assert np.array_equal(lr, rr) and rr.dtype == lr.dtype and np.array_equal(ld, rd)
    finally:
        local.close()
        remote.close()


def test_an_environment_that_cannot_start_is_one_line(ray_address: str) -> None:
    from rlsched.train.ray_vec_env import RayVecEnv, RayVecEnvError

    # defined here: Ray ships them by value (the test module is not importable in its workers)
    def _broken_env() -> Any:
        raise ValueError("no training worlds on this node")

    def _cartpole() -> Any:
        import gymnasium

        return gymnasium.make("CartPole-v1")

    t0 = time.monotonic()
    with pytest.raises(RayVecEnvError) as err:
        RayVecEnv([_broken_env])
    text = str(err.value)
    assert "\n" not in text and "no training worlds on this node" in text, text
    # not a speed target: a guard against waiting forever for an actor that never comes up (Ray's own
    # default); actors start in a few seconds on a quiet machine and took 66 s on a loaded one
    assert time.monotonic() - t0 < 300
    # more actors than the cluster's two CPUs hold: refused with the arithmetic, not a wait forever
    with pytest.raises(RayVecEnvError, match=r"3 environment actors of 1 CPU each did not start within 3 s "
                                             r"\(the Ray cluster has 2 CPUs\)"):
        RayVecEnv([_cartpole] * 3, num_cpus=1, start_timeout_s=3)


def test_families_on_ray_equal_the_process_pool(ray_address: str) -> None:
    from rlsched.train.families import resolve
    from rlsched.train.generalisation import evaluate_families

    fams = resolve(["gen-tiny-fleet"])
    model = str(ROOT / "models" / "scorer")
    seen: list[int] = []
    on_ray = evaluate_families(fams, model, windows=2, max_jobs=60, ray=ray_address,
                               progress=lambda done, total, _: seen.append(done))
    pooled = evaluate_families(fams, model, windows=2, max_jobs=60, processes=2)
    assert on_ray.windows == pooled.windows and on_ray.summaries == pooled.summaries
    assert "model_vs_best" in on_ray.summaries["gen-tiny-fleet"]
    assert seen == list(range(1, len(seen) + 1)) and len(seen) == 2 * 9  # every replay reported, in order
    # a selector's choices come back from Ray tasks as from worker processes
    selector = str(ROOT / "models" / "default")
    on_ray = evaluate_families(fams, selector, windows=1, max_jobs=60, ray=ray_address)
    here = evaluate_families(fams, selector, windows=1, max_jobs=60)
    assert on_ray.choices == here.choices and sum(on_ray.choices["gen-tiny-fleet"].values()) >= 1


def test_final_evaluation_on_ray_equals_local(ray_address: str) -> None:
    from rlsched.learned.ppo import PpoScheduler, load_policy_ref
    from rlsched.train.evaluate import evaluate
    from rlsched.train.ray_evaluate import evaluate_on_ray
    from rlsched.train.run_steps import ruled_baselines, teacher_rows
    from rlsched.train.worlds import evaluation_worlds

    exp = _tiny_experiment()
    worlds = evaluation_worlds(exp.scenarios + exp.holdout, 60)
    model = load_policy_ref(str(ROOT / "models" / "scorer"))
    # the trainer's extra rows: the teacher and every heuristic behind the smoke experiment's deadline guard
    extra = [*teacher_rows(exp), *ruled_baselines(exp.rule_params())]
    here = evaluate(worlds, lambda: PpoScheduler(model), bound=True, extra=extra)
    there = evaluate_on_ray(ray_address, worlds, model, bound=True, extra=extra)
    assert len(worlds) == 2 and {"ppo", "sjf-oracle-bound", "weighted-priority+rules"} <= set(there["summary"])
    assert _numbers(there) == _numbers(here)


def _numbers(result: Any) -> Any:
    """``result`` without its timings (``wall_s``, ``*latency*``), NaN made comparable."""
    if isinstance(result, dict):
        return {k: _numbers(v) for k, v in result.items() if k != "wall_s" and "latency" not in k}
    if isinstance(result, float) and result != result:
        return "nan"
    return result


@pytest.mark.slow
def test_cli_train_on_ray_is_the_local_run(ray_address: str, tmp_path: Path) -> None:
    """``rlsched train smoke.yaml --ray HOST:PORT``: the local run's policy and numbers, in a tagged MLflow run."""
    import torch

    text = (ROOT / "experiments" / "smoke.yaml").read_text()
    models = {}
    for where in ("local", "ray"):
        exp = tmp_path / f"{where}.yaml"
        exp.write_text(text.replace("output: ../runs/smoke/model", f"output: {tmp_path / where / 'model'}")
                       + "mlflow: {experiment: ray-tests, registered_model: ray-tests-model}\n")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
        args = ["--ray", ray_address] if where == "ray" else ["--no-track"]
        proc = subprocess.run([sys.executable, "-m", "rlsched", "train", str(exp), "-q", "--run-dir",
                               str(tmp_path / where / "run"), *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        models[where] = tmp_path / where / "model"
    assert "2 environment actors on the Ray cluster at" in proc.stdout
    local = torch.load(models["local"] / "policy.pt", weights_only=False)
    remote = torch.load(models["ray"] / "policy.pt", weights_only=False)
    local, remote = local.get("state_dict", local), remote.get("state_dict", remote)
    assert [k for k in local if not torch.equal(local[k], remote[k])] == []
    cards = {w: json.loads((m / "card.json").read_text()) for w, m in models.items()}
    for part in ("eval", "holdout", "families"):
        assert _numbers(cards["ray"]["metrics"][part]) == _numbers(cards["local"]["metrics"][part]), part
    import mlflow

    run = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(cards["ray"]["mlflow"]["run_id"])
    assert run.data.tags["ray_address"] == ray_address and run.data.tags["ray_env_actors"] == "2"
    assert "ray" not in run.data.params


@pytest.mark.parametrize("address", ["127.0.0.1:1", "not-an-address"])
def test_bad_ray_address_is_one_line_in_seconds(address: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlsched", "train", str(ROOT / "experiments" / "smoke.yaml"),
                           "-q", "--no-track", "--run-dir", str(tmp_path / "run"), "--ray", address],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and address in lines[0] and lines[0].startswith("error: --ray"), proc.stderr
    # not a speed target: a guard against waiting forever for an actor that never comes up (Ray's own
    # default); actors start in a few seconds on a quiet machine and took 66 s on a loaded one
    assert time.monotonic() - t0 < 300
    assert not (tmp_path / "run").exists()  # nothing was built before the address was checked
