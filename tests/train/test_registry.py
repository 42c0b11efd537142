"""The model registry against a real MLflow server: register, serve, download, promote, fail cleanly.

Server tests share one ``mlflow server`` per session (about 10 s to start); each
test uses its own registered-model name.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from rlsched.errors import RlschedError
from rlsched.learned.ppo import ModelError, PolicyModel
from rlsched.train.tracking import TrackingError

CLI = "import rlsched.cli.registry_cmd; from rlsched.cli import main; main()"

pytestmark = pytest.mark.slow  # one real MLflow server start (~10 s) plus a dozen registrations


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd or Path.cwd())


def _world() -> tuple[list[object], list[object]]:
    """Two small pools and a handful of jobs (some that must queue)."""
    from rlsched.cluster.catalog import gpu_model
    from rlsched.cluster.job import Job
    from rlsched.cluster.model import PoolKind, PoolSpec

    a100 = gpu_model("A100-80GB")
    pools = [
        PoolSpec(name="onprem", kind=PoolKind.ONPREM, model=a100, gpus_per_node=8, min_nodes=1, max_nodes=1,
                 cost_per_gpu_hour=1.0),
        PoolSpec(name="cloud", kind=PoolKind.ONDEMAND, model=a100, gpus_per_node=8, min_nodes=0, max_nodes=2,
                 cost_per_gpu_hour=3.0, provision_delay_s=120.0),
    ]
    jobs = [Job(f"j{i}", float(60 * i), 1800.0 + 300 * i, num_gpus=n) for i, n in enumerate([4, 4, 8, 2, 1, 8])]
    return pools, jobs


def _encoded_state() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A real encoded observation and mask at the first decision point of :func:`_world`."""
    from rlsched.envs.codec import ObservationCodec
    from rlsched.sim import Engine

    pools, jobs = _world()
    engine = Engine(pools, jobs)  # type: ignore[arg-type]
    assert engine.advance()
    codec = ObservationCodec()
    return codec.encode(engine.state), codec.mask(engine.state)


# ---------------------------------------------------------------------- register / serve / download
def test_register_creates_version_with_challenger_alias_and_tags(
    registry: str, model_name: str, smoke_model: Callable[..., Path]
) -> None:
    from mlflow import MlflowClient

    from rlsched.train.registry import register_policy

    folder = smoke_model(ppo=(3600.0, 90.0))
    version = register_policy(folder, name=model_name, tags={"training_data": "philly-3day"})
    assert version == 1
    client = MlflowClient(registry)
    mv = client.get_model_version_by_alias(model_name, "challenger")
    assert int(mv.version) == 1
    sig = PolicyModel.load(folder).signature
    assert mv.tags["observation_signature"] == sig
    assert mv.tags["training_data"] == "philly-3day"
    assert mv.tags["git_commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert float(mv.tags["eval_mean_jct_s"]) == 3600.0 and float(mv.tags["eval_cost_usd"]) == 90.0
    assert float(mv.tags["eval_baseline_mean_jct_s"]) == 7200.0
    assert json.loads(mv.tags["eval_metrics"])["weighted-priority"]["cost_usd"] == 100.0
    assert mv.run_id  # logged inside a run
    # a second registration is version 2 and takes the challenger alias
    assert register_policy(smoke_model(seed=1), name=model_name) == 2
    assert int(client.get_model_version_by_alias(model_name, "challenger").version) == 2


def test_pyfunc_predicts_legal_actions(registry: str, model_name: str, smoke_model: Callable[..., Path]) -> None:
    import mlflow

    from rlsched.train.registry import register_policy

    register_policy(smoke_model(), name=model_name)
    pyfunc = mlflow.pyfunc.load_model(f"models:/{model_name}@challenger")
    obs, mask = _encoded_state()
    assert mask[:-1].any(), "the test state should allow more than waiting"
    single = pyfunc.predict({**obs, "mask": mask})
    assert isinstance(single, np.ndarray) and single.shape == (1,) and np.issubdtype(single.dtype, np.integer)
    assert mask[int(single[0])]
    # the served action is the model's own greedy action
    local = PolicyModel.load(_downloaded_folder(model_name))
    assert int(single[0]) == local.act(obs, mask)
    # batched: row 1 only allows waiting
    only_wait = np.zeros_like(mask)
    only_wait[-1] = True
    batch = {k: np.stack([v, v]) for k, v in obs.items()} | {"mask": np.stack([mask, only_wait])}
    actions = pyfunc.predict(batch)
    assert actions.shape == (2,) and mask[int(actions[0])] and int(actions[1]) == len(mask) - 1
    with pytest.raises(ModelError, match="mask"):
        pyfunc.predict({**obs, "mask": mask[:-1]})


def _downloaded_folder(model_name: str) -> Path:
    from rlsched.train.registry import download_model

    return download_model(f"models:/{model_name}@challenger")


def test_download_round_trip(registry: str, model_name: str, smoke_model: Callable[..., Path], tmp_path: Path) -> None:
    import torch

    from rlsched.train.registry import download_model, register_policy

    folder = smoke_model(name="original")
    register_policy(folder, name=model_name)
    for uri in (f"models:/{model_name}@challenger", f"models:/{model_name}/1"):
        local = download_model(uri, tmp_path / uri.replace(":", "_").replace("/", "_").replace("@", "_"))
        assert sorted(p.name for p in local.iterdir()) == ["card.json", "codec.json", "policy.pt"]
        a, b = PolicyModel.load(folder), PolicyModel.load(local)
        assert a.signature == b.signature and a.card == b.card
        for (ka, va), (kb, vb) in zip(a.net.state_dict().items(), b.net.state_dict().items(), strict=True):
            assert ka == kb and torch.equal(va, vb)
    # default destination: the model cache, reused while the version is unchanged
    cached = download_model(f"models:/{model_name}@challenger")
    assert cached.is_relative_to(tmp_path / "model-cache") and (cached / "policy.pt").exists()
    assert download_model(f"models:/{model_name}/1") == cached


def test_unknown_model_alias_and_version_are_model_errors(
    registry: str, model_name: str, smoke_model: Callable[..., Path]
) -> None:
    from rlsched.train.registry import download_model, register_policy

    with pytest.raises(ModelError, match="no registered model"):
        download_model(f"models:/{model_name}@champion")
    register_policy(smoke_model(), name=model_name)
    with pytest.raises(ModelError, match=r"no alias 'champion' \(aliases: challenger->v1\)"):
        download_model(f"models:/{model_name}@champion")
    with pytest.raises(ModelError, match="no version 7"):
        download_model(f"models:/{model_name}/7")
    with pytest.raises(ModelError, match="expected models:/NAME@ALIAS"):
        download_model("models:/only-a-name")


def test_ppo_scheduler_from_registry_runs_a_simulation(
    registry: str, model_name: str, smoke_model: Callable[..., Path]
) -> None:
    from rlsched.learned.ppo import make_ppo_policy
    from rlsched.sim import Engine, SimConfig
    from rlsched.train.registry import download_model, register_policy

    register_policy(smoke_model(), name=model_name)
    sched = make_ppo_policy(f"models:/{model_name}@challenger", fetch=download_model)
    assert sched.name == f"ppo:models:/{model_name}@challenger"
    pools, jobs = _world()
    report = Engine(pools, jobs, config=SimConfig(horizon_s=6 * 3600.0)).run(sched)  # type: ignore[arg-type]
    assert report.refused_decisions == 0  # masked actions are always feasible
    assert report.jobs_completed + report.jobs_unschedulable + report.jobs_skipped <= len(jobs)


# ---------------------------------------------------------------------- atomic registration
def test_failed_alias_leaves_no_partial_version(
    registry: str, model_name: str, smoke_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from rlsched.train.registry import register_policy

    def boom(self: object, *args: object, **kwargs: object) -> None:
        raise MlflowException("simulated failure while setting the alias")

    # brand-new model: neither the version nor the registered model may remain
    with monkeypatch.context() as m:
        m.setattr(MlflowClient, "set_registered_model_alias", boom)
        with pytest.raises(TrackingError, match="nothing left registered"):
            register_policy(smoke_model(), name=model_name)
    client = MlflowClient(registry)
    assert not client.search_registered_models(filter_string=f"name='{model_name}'")
    # existing model: v1 stays, the failed v2 is gone, challenger still points at v1
    assert register_policy(smoke_model(), name=model_name) == 1
    with monkeypatch.context() as m:
        m.setattr(MlflowClient, "set_registered_model_alias", boom)
        with pytest.raises(TrackingError):
            register_policy(smoke_model(seed=2), name=model_name)
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{model_name}'"))
    assert versions == [1]
    assert int(client.get_model_version_by_alias(model_name, "challenger").version) == 1


def test_register_refuses_a_non_model_folder(registry: str, model_name: str, tmp_path: Path) -> None:
    from rlsched.train.registry import register_policy

    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"codec\.json"):
        register_policy(tmp_path / "empty", name=model_name)


# ---------------------------------------------------------------------- promotion
def test_promotion_rule_better_worse_and_forced(
    registry: str, model_name: str, smoke_model: Callable[..., Path], tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    from rlsched.train.registry import promote, register_policy

    audit = tmp_path / "audit" / "audit.jsonl"
    v1 = register_policy(smoke_model(ppo=(5000.0, 95.0)), name=model_name)
    r1 = promote(model_name, v1, actor="alice", audit_path=audit)
    assert r1.promoted and not r1.forced and r1.previous_champion is None and all(c.ok for c in r1.checks)

    # beats weighted-priority but not the champion: refused, and says why
    v2 = register_policy(smoke_model(ppo=(6000.0, 90.0)), name=model_name)
    r2 = promote(model_name, v2, audit_path=audit)
    assert not r2.promoted and "mean JCT vs champion" in r2.reason and "NOT <" in r2.reason
    # dearer than weighted-priority: refused on cost
    v3 = register_policy(smoke_model(ppo=(3000.0, 120.0)), name=model_name)
    r3 = promote(model_name, v3, audit_path=audit)
    assert not r3.promoted and "cost vs weighted-priority" in r3.reason
    client = MlflowClient(registry)
    assert int(client.get_model_version_by_alias(model_name, "champion").version) == v1

    # strictly better on JCT, no dearer: promoted over v1
    v4 = register_policy(smoke_model(ppo=(4000.0, 95.0)), name=model_name)
    r4 = promote(model_name, v4, actor="bob", audit_path=audit)
    assert r4.promoted and r4.previous_champion == v1
    assert int(client.get_model_version_by_alias(model_name, "champion").version) == v4

    # forced: skips the rule, audited in tags and the audit file
    r5 = promote(model_name, v2, force=True, actor="carol", reason="rollback drill", audit_path=audit)
    assert r5.promoted and r5.forced and r5.previous_champion == v4
    mv = client.get_model_version(model_name, str(v2))
    assert mv.tags["forced"] == "true" and mv.tags["promoted_by"] == "carol"
    assert mv.tags["promote_reason"] == "rollback drill" and mv.tags["promoted_at"]
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    assert [(x["version"], x["forced"], x["actor"]) for x in lines] == [(v1, False, "alice"), (v4, False, "bob"),
                                                                       (v2, True, "carol")]
    assert lines[-1]["reason"] == "rollback drill" and lines[-1]["previous_champion"] == v4
    # promoting the champion again is a no-op success
    again = promote(model_name, v2, audit_path=audit)
    assert again.promoted and "already the champion" in again.reason
    assert len(audit.read_text().splitlines()) == 3


def test_promotion_refuses_policies_that_finish_fewer_jobs_or_other_eval_sets(
    registry: str, model_name: str, smoke_model: Callable[..., Path], tmp_path: Path
) -> None:
    from rlsched.train.registry import check_promotion, promote, register_policy

    # a policy that leaves jobs queued has a low mean JCT over the few it finished
    lazy = {"ppo": {"mean_jct_s": 10.0, "cost_usd": 1.0, "jobs_completed": 3.0},
            "weighted-priority": {"mean_jct_s": 7200.0, "cost_usd": 100.0, "jobs_completed": 50.0}}
    assert [c.ok for c in check_promotion(lazy)] == [True, True, False]
    assert not all(c.ok for c in check_promotion({"ppo": {"mean_jct_s": float("nan"), "cost_usd": 1.0},
                                                  "weighted-priority": {"mean_jct_s": 1.0, "cost_usd": 1.0}}))
    v1 = register_policy(smoke_model(ppo=(5000.0, 90.0), eval_set="windows-a"), name=model_name)
    assert promote(model_name, v1, audit_path=tmp_path / "a.jsonl").promoted
    v2 = register_policy(smoke_model(ppo=(1000.0, 50.0), eval_set="windows-b"), name=model_name)
    res = promote(model_name, v2, audit_path=tmp_path / "a.jsonl")
    assert not res.promoted and "evaluation set differs" in res.reason


def test_promotion_compares_a_retrained_version_with_the_champion_replayed_on_its_windows(
    registry: str, model_name: str, smoke_model: Callable[..., Path], tmp_path: Path
) -> None:
    from rlsched.train.registry import CHAMPION_EVAL_TAG, ChampionReplay, promote, register_policy

    audit = tmp_path / "a.jsonl"
    v1 = register_policy(smoke_model(ppo=(500.0, 50.0), eval_set="windows-a"), name=model_name)
    assert promote(model_name, v1, audit_path=audit).promoted

    def challenger(replayed_jct: float, replayed_version: int) -> int:
        tag = ChampionReplay(model_name, replayed_version, {"ppo": {"mean_jct_s": replayed_jct, "cost_usd": 60.0}},
                             "windows-b").tag()
        return register_policy(smoke_model(ppo=(1000.0, 50.0), eval_set="windows-b"), name=model_name,
                               tags={CHAMPION_EVAL_TAG: tag})

    # worse than the champion replayed on its windows: refused on the numbers, which say what they are
    worse = promote(model_name, challenger(800.0, v1), audit_path=audit)
    assert not worse.promoted and "evaluation set differs" not in worse.reason
    assert "mean JCT vs champion replayed on the candidate's evaluation windows: candidate 1000 NOT < champion 800" \
        in worse.reason
    # better than it (though not than the champion's own numbers on other windows): promoted
    v3 = challenger(1200.0, v1)
    better = promote(model_name, v3, audit_path=audit)
    assert better.promoted and not better.forced and better.previous_champion == v1
    assert any(f"comparing with {model_name} version {v1} replayed" in c.text for c in better.checks)
    # a replay of a version that is no longer the champion: not comparable, as without the tag
    v5 = register_policy(smoke_model(ppo=(100.0, 50.0), eval_set="windows-c"), name=model_name,
                         tags={CHAMPION_EVAL_TAG: ChampionReplay(model_name, v1, {"ppo": {"mean_jct_s": 5000.0,
                                                                                          "cost_usd": 60.0}},
                                                                 "windows-c").tag()})
    res = promote(model_name, v5, audit_path=audit)
    assert not res.promoted and "metrics are not comparable" in res.reason
    assert f"replays {model_name} version {v1}, not the champion {model_name} version {v3}" in res.reason


def test_cli_promote_exit_codes_and_audit(
    registry: str, model_name: str, smoke_model: Callable[..., Path], tmp_path: Path
) -> None:
    from rlsched.train.registry import register_policy

    env = {"MLFLOW_TRACKING_URI": registry, "MLFLOW_DISABLE_TELEMETRY": "true", "RLSCHED_ACTOR": "ci"}
    audit = tmp_path / "cli-audit.jsonl"
    v1 = register_policy(smoke_model(ppo=(5000.0, 95.0)), name=model_name)
    v2 = register_policy(smoke_model(ppo=(6000.0, 95.0)), name=model_name)
    ok = _cli("promote", model_name, str(v1), "--audit-file", str(audit), env=env)
    assert ok.returncode == 0, ok.stderr
    assert f"promoted {model_name} version 1 to champion" in ok.stdout
    refused = _cli("promote", model_name, str(v2), "--audit-file", str(audit), env=env)
    assert refused.returncode == 1
    assert "refused" in refused.stderr and "mean JCT vs champion" in refused.stderr
    assert "Traceback" not in refused.stderr
    no_reason = _cli("promote", model_name, str(v2), "--force", env=env)
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    forced = _cli("promote", model_name, str(v2), "--force", "--reason", "hotfix", "--audit-file", str(audit),
                  env=env)
    assert forced.returncode == 0, forced.stderr
    assert "force-promoted" in forced.stdout
    last = json.loads(audit.read_text().splitlines()[-1])
    assert last["forced"] is True and last["actor"] == "ci" and last["reason"] == "hotfix"
    listing = _cli("models", "list", model_name, "--json", env=env)
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert [(r["version"], r["aliases"]) for r in rows] == [(1, ["champion"]), (2, ["challenger"])] or [
        (r["version"], r["aliases"]) for r in rows] == [(1, []), (2, ["challenger", "champion"])]
    table = _cli("models", "list", model_name, env=env)
    assert table.returncode == 0 and "challenger" in table.stdout and "FORCED" in table.stdout


# ---------------------------------------------------------------------- server down
def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the socket is closed


def test_server_down_fails_fast_and_clearly(
    quiet_mlflow: None, monkeypatch: pytest.MonkeyPatch, smoke_model: Callable[..., Path], tmp_path: Path
) -> None:
    from rlsched.train.registry import ModelRegistryUnavailable, download_model, promote, register_policy
    from rlsched.train.tracking import start_run

    url = _dead_url()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.chdir(tmp_path)
    folder = smoke_model()
    t0 = time.monotonic()
    with pytest.raises(TrackingError, match="not reachable"):
        register_policy(folder, name="x")
    with pytest.raises(ModelError, match="not reachable") as err:
        download_model("models:/x@champion")
    assert isinstance(err.value, ModelRegistryUnavailable) and isinstance(err.value, RlschedError)
    with pytest.raises(TrackingError, match="not reachable"):
        promote("x", 1)
    with pytest.raises(TrackingError, match="not reachable"), start_run("exp", run_name="r"):
        pass
    # not a speed target: MLflow's own retries would take minutes; one attempt is seconds, more under load
    assert time.monotonic() - t0 < 120.0
    t1 = time.monotonic()
    res = _cli("promote", "x", "1", env={"MLFLOW_TRACKING_URI": url, "MLFLOW_DISABLE_TELEMETRY": "true"},
               cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith("error: MLflow tracking server")
    assert "Traceback" not in res.stderr
    assert time.monotonic() - t1 < 120.0
    from rlsched.learned.ppo import make_ppo_policy

    with pytest.raises(ModelError, match="not reachable"):  # what --policy ppo:models:/... callers catch
        make_ppo_policy("models:/x@champion", fetch=download_model)


def test_family_gate_refuses_a_candidate_worse_than_the_best_heuristic_on_an_unseen_family(
    registry: str, model_name: str, smoke_model: Callable[..., Path], tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    from rlsched.train.registry import FAMILY_TAG, promote, register_policy

    audit = tmp_path / "a.jsonl"
    worse = {"summary": {"gen-steady": {"windows": 3, "best": "sjf", "best_vs_wp": 0.97, "model_vs_best": 0.99},
                         "gen-gang": {"windows": 3, "best": "fair-share", "best_vs_wp": 0.9, "model_vs_best": 1.05},
                         "philly-early": {"windows": 3, "best": "sjf", "best_vs_wp": 0.8, "model_vs_best": 1.5}},
             "exposure": {"gen-steady": "unseen", "gen-gang": "unseen", "philly-early": "trained"}}
    v1 = register_policy(smoke_model(families=worse), name=model_name)
    assert json.loads(MlflowClient(registry).get_model_version(model_name, str(v1)).tags[FAMILY_TAG])[
        "summary"]["gen-gang"]["model_vs_best"] == 1.05
    r1 = promote(model_name, v1, audit_path=audit)
    assert not r1.promoted
    assert "family gen-gang: candidate 1.050x the best heuristic (fair-share)" in r1.reason
    assert "gen-steady" not in r1.reason  # it passed there
    assert "philly-early" not in r1.reason  # trained on: never counts, however bad
    # within 2% of the best heuristic everywhere unseen: the gate passes
    ok = {"summary": {**worse["summary"], "gen-gang": {**worse["summary"]["gen-gang"], "model_vs_best": 1.019}},
          "exposure": worse["exposure"]}
    assert promote(model_name, register_policy(smoke_model(families=ok), name=model_name), audit_path=audit).promoted
    # a version that was never judged on families is refused, and told how to get judged
    v3 = register_policy(smoke_model(ppo=(1000.0, 50.0), families=None), name=model_name)
    r3 = promote(model_name, v3, audit_path=audit)
    assert not r3.promoted and "rlsched models gate NAME VERSION" in r3.reason
    # only unseen families that the evaluation could not cut: also refused
    seen_only = {"summary": {"philly-early": worse["summary"]["philly-early"]},
                 "exposure": {"philly-early": "trained"}}
    v4 = register_policy(smoke_model(ppo=(1000.0, 50.0), families=seen_only), name=model_name)
    assert "no unseen workload family" in promote(model_name, v4, audit_path=audit).reason


def test_gate_version_evaluates_a_registered_model_and_tags_it(
    registry: str, model_name: str, smoke_model: Callable[..., Path]
) -> None:
    from mlflow import MlflowClient

    from rlsched.train.registry import FAMILY_TAG, gate_version, register_policy

    v = register_policy(smoke_model(families=None), name=model_name)
    report, checks = gate_version(model_name, v, families=["gen-tiny-fleet"], windows=1, max_jobs=60)
    s = report.summaries["gen-tiny-fleet"]
    assert s["windows"] == 1 and "model_vs_best" in s and report.exposure["gen-tiny-fleet"] == "unseen"
    assert len(checks) == 1 and ("gen-tiny-fleet" in checks[0].text)
    tag = json.loads(MlflowClient(registry).get_model_version(model_name, str(v)).tags[FAMILY_TAG])
    assert tag["summary"]["gen-tiny-fleet"]["model_vs_best"] == s["model_vs_best"]


def test_cli_gate_prints_the_family_table_and_promote_then_reads_it(
    registry: str, model_name: str, smoke_model: Callable[..., Path]
) -> None:
    from mlflow import MlflowClient

    from rlsched.train.registry import FAMILY_TAG, register_policy

    env = {"MLFLOW_TRACKING_URI": registry, "MLFLOW_DISABLE_TELEMETRY": "true"}
    v = register_policy(smoke_model(families=None), name=model_name)
    proc = _cli("models", "gate", model_name, str(v), "--families", "gen-light", "--windows", "1",
                "--max-jobs", "60", env=env)
    assert proc.returncode in (0, 1), proc.stderr  # an untrained net may pass or fail; both are answers
    assert "| gen-light | unseen | 1 |" in proc.stdout
    assert ("gate passed" in proc.stdout) == (proc.returncode == 0)
    assert FAMILY_TAG in MlflowClient(registry).get_model_version(model_name, str(v)).tags
    bad = _cli("models", "gate", model_name, str(v), "--families", "gen-lite", env=env)
    assert bad.returncode == 1 and "unknown family 'gen-lite' (did you mean 'gen-light'?)" in bad.stderr
    assert "Traceback" not in bad.stderr
