"""Issue 20 end to end: a served model runs real jobs, its history is exported, replayed and fine-tuned on.

A real ``rlsched serve`` on a simulated fleet (two nodes of 8 GPUs) serves the registered champion of a real
``mlflow server``; 300 real short jobs (``sleep``) of a seeded trace are submitted over HTTP at the trace's
submission times. Then: ``GET /v1/trace`` and ``rlsched trace export`` give the history as a canonical trace;
``rlsched advise`` replays it under the served policy and every heuristic, and the served policy's
counterfactual is compared with what really happened (the simulator's error on this cluster, printed);
``rlsched retrain`` fine-tunes the champion on it and the gate accepts (a challenger is registered) or refuses
it with its reason; ``rlsched promote`` applies the same gate, comparing with the champion replayed on the
challenger's evaluation windows (no ``--force``); ``POST /v1/reload`` serves the champion again.
"""

from __future__ import annotations

import csv
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from rlsched.runtime.sim_backend import build_fleet, write_json_atomic
from rlsched.workload import read_canonical
from tests.service.serving import Served, http, start_serve, wait_for

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "rlsched"]
N_JOBS = 300

SPEC = """
pool "train" {
  gpu_model     = "H100-80GB"
  nodes         = [%(nodes)s]
  gpus_per_node = 8
  mig           = "disabled"
}

policy "default" {
  scheduler = "rl"
  model     = "models:/%(model)s@champion"
  fallback  = "weighted-priority"
}
"""


def seeded_trace(path: Path) -> list[dict[str, float | int | str]]:
    """300 jobs, about 0.8 offered load on 16 GPUs: 1-4 GPUs, 0.3-2.5 s, three users, some priorities."""
    rng = random.Random(20)
    t, rows = 0.0, []
    for i in range(N_JOBS):
        t += rng.expovariate(8.0)
        rows.append({"job_id": str(i), "submit_time": round(t, 3),
                     "duration": round(min(max(rng.lognormvariate(-0.4, 0.6), 0.3), 2.5), 3),
                     "num_gpus": rng.choice([1, 1, 1, 2, 2, 4]), "user": rng.choice(["ana", "bo", "cy"]),
                     "priority": rng.choice([0, 0, 1])})
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def submit_trace(served: Served, rows: list[dict[str, float | int | str]]) -> list[str]:
    """Submit each job at its trace time (from now), from a few threads so a slow answer delays no other."""
    start = time.monotonic() + 0.5
    ids: list[str] = [""] * len(rows)
    errors: list[str] = []

    def worker(part: int) -> None:
        for i in range(part, len(rows), 4):
            row = rows[i]
            delay = start + float(row["submit_time"]) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            status, _, body = http("POST", served.url + "/v1/jobs", token=served.token,
                                   body={"argv": ["sleep", str(row["duration"])], "gpus": row["num_gpus"],
                                         "user": row["user"], "priority": row["priority"]})
            if status != 201:
                errors.append(f"{status} {body[:200]!r}")
            else:
                ids[i] = json.loads(body)["id"]

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    return ids


def rl(*args: str, env: dict[str, str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def test_weekly_loop_on_a_served_cluster(registry: str, model_name: str, tmp_path: Path) -> None:
    from rlsched.train.registry import promote, register_policy

    # the champion the service serves: the shipped default model, registered and promoted
    version = register_policy(ROOT / "models" / "scorer", name=model_name)
    assert promote(model_name, version, force=True, reason="e2e test seed").promoted

    fleet = tmp_path / "fleet.json"
    data = build_fleet("2x8xH100-80GB")
    write_json_atomic(fleet, data)
    spec = tmp_path / "pool.hcl"
    spec.write_text(SPEC % {"nodes": ", ".join(f'"{n["hostname"]}"' for n in data["nodes"]), "model": model_name})
    state = tmp_path / "state"
    served = start_serve(spec, fleet, state)
    env = served.env(MLFLOW_TRACKING_URI=registry, RLSCHED_MODEL_CACHE=str(tmp_path / "cache"),
                     RLSCHED_AUDIT_FILE=str(tmp_path / "audit.jsonl"))
    try:
        rows = seeded_trace(tmp_path / "trace.csv")
        t0 = time.monotonic()
        ids = submit_trace(served, rows)
        assert all(ids)

        def all_done() -> bool:
            status, _, body = http("GET", served.url + "/v1/jobs?state=queued&state=running&state=preempted",
                                   token=served.token)
            return status == 200 and json.loads(body) == []

        wait_for(all_done, timeout=300, interval=0.5, what="every job to finish")
        ran_s = time.monotonic() - t0

        # 1. the history as a canonical trace: over the API (token required) and from the CLI, read-only
        assert http("GET", served.url + "/v1/trace")[0] == 401
        status, headers, body = http("GET", served.url + "/v1/trace", token=served.token)
        assert status == 200 and headers["content-type"].startswith("text/csv")
        (tmp_path / "api.csv").write_bytes(body)
        api_trace = read_canonical(tmp_path / "api.csv")
        assert len(api_trace.jobs) == N_JOBS and "sleep" not in body.decode()
        res = rl("trace", "export", "--state-dir", str(state), "--out", str(tmp_path / "jobs.csv"), env=env,
                 cwd=tmp_path)
        assert res.returncode == 0 and f"wrote {N_JOBS} jobs" in res.stdout, res.stdout + res.stderr
        exported = {j.job_id: j for j in read_canonical(tmp_path / "jobs.csv").jobs}
        wanted = {ids[i]: r for i, r in enumerate(rows)}
        overheads: list[float] = []
        for jid, row in wanted.items():
            job = exported[jid]
            assert job.num_gpus == row["num_gpus"] and job.user == row["user"]
            # the real run time: the sleep plus the launch and the exit noticed at the next loop pass,
            # never less than the sleep
            assert float(row["duration"]) <= job.duration < float(row["duration"]) + 5.0
            overheads.append(job.duration - float(row["duration"]))
        # one launch on a busy 2-core CI machine took 1.4 s over its sleep, so a per-job bound of a second
        # flaked; the typical job's overhead (a loop pass, not its queue wait) is what the median says
        assert statistics.median(overheads) < 1.0, sorted(overheads)

        # 2. the twin: the served model and every heuristic on the same jobs; the simulator's error
        res = rl("advise", "--state-dir", str(state), "--backend", f"sim:{fleet}", "--json", env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        twin = json.loads(res.stdout)
        assert not twin["failed"], twin["failed"]
        served_row = next(p for p in twin["policies"] if p["policy"] == twin["served"])
        assert twin["jobs"] == N_JOBS and twin["served"] == f"rl:models:/{model_name}@champion"
        assert {"fifo", "sjf", "weighted-priority"} <= {p["policy"] for p in twin["policies"]}
        actual = twin["actual"]
        error = twin["simulator_error"]
        report = (f"simulator error on this cluster ({N_JOBS} real jobs, {ran_s:.0f} s): served model's "
                  f"counterfactual mean JCT {served_row['mean_jct_s']:.3f} s vs real {actual['mean_jct_s']:.3f} s "
                  f"({error:+.1%}); mean wait {served_row['mean_wait_s']:.3f} s vs {actual['mean_wait_s']:.3f} s")
        print(report)
        (tmp_path / "simulator_error.txt").write_text(report + "\n")
        assert abs(error) < 0.25, report
        table = rl("advise", "--state-dir", str(state), "--backend", f"sim:{fleet}", env=env, cwd=tmp_path)
        assert "actual (what" in table.stdout and "(served)" in table.stdout, table.stdout + table.stderr

        # 3. the weekly fine-tune: a challenger only when the gate passes, else its reason
        res = rl("retrain", "--state-dir", str(state), "--from", f"models:/{model_name}@champion", "--days", "1",
                 "--steps", "256", "--generated", "2", "--backend", f"sim:{fleet}", "--work-dir",
                 str(tmp_path / "retrain"), env=env, cwd=tmp_path)
        out = res.stdout + res.stderr
        print(out[-2500:])
        assert "warm start: the scorer's weights from models:/" in out and "promotion gate:" in out
        assert (tmp_path / "retrain" / "experiment.yaml").exists()
        if res.returncode == 0:
            assert f"registered version {version + 1} (alias challenger)" in out
            # promote compares with the champion replayed on the challenger's windows (its champion_eval tag):
            # the numbers the retrain gate passed on, so it promotes without --force
            decision = rl("promote", model_name, str(version + 1), env=env, cwd=tmp_path)
            print(decision.stdout + decision.stderr)
            assert decision.returncode == 0, decision.stdout + decision.stderr
            assert f"promoted {model_name} version {version + 1} to champion (was version {version})" \
                in decision.stdout
            assert "mean JCT vs champion replayed on the candidate's evaluation windows" in decision.stdout
        else:
            assert "refused: not registered (" in out and "FAIL" in out, out[-3000:]

        # 4. the service reloads the champion (whichever version the gate left there)
        from rlsched.learned.ppo import make_ppo_policy
        from rlsched.runtime.fallback import model_version
        from rlsched.train.registry import download_model

        champion = model_version(make_ppo_policy(f"models:/{model_name}@champion", fetch=download_model))
        status, _, body = http("POST", served.url + "/v1/reload", token=served.token, body={})
        assert status == 200, body
        info = json.loads(body)
        assert info["policy"] == "default" and info["model_version"] == champion, info
        switches = [r for r in json.loads(http("GET", served.url + "/v1/audit?limit=100000", token=served.token)[2])
                    if r["event"] == "policy-switch"]
        assert switches[-1]["reason"] == "reload" and switches[-1]["policy"].startswith("guarded:rl:models:/")
    finally:
        assert served.stop() == 0, served.log_text()[-3000:]
    assert "Traceback" not in served.log_text(), served.log_text()[-5000:]

