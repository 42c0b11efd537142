"""``rlsched plan | apply | state | force-unlock`` through the real CLI (subprocess) against the sim backend."""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from rlsched.plan.render import NO_CHANGES
from rlsched.plan.state import StateStore

from .conftest import Workspace, needs_real

pytestmark = needs_real

WS = Callable[..., Workspace]
BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


def desired(gpu: Any) -> bool:
    """Whether a sim GPU already has what pool.hcl asks for it."""
    return bool(gpu.mig_current) and gpu.layout_counts() == BALANCED


def test_plan_apply_plan_shows_no_changes(ws: WS) -> None:
    w = ws()
    p = w.run("plan", str(w.spec), "--detailed-exitcode")
    assert p.returncode == 2, p.stderr
    assert "Plan: 2 to adopt, 6 to add, 0 to change, 0 to destroy. 4 GPUs to reconfigure, 2 nodes to drain." \
        in p.stdout
    assert '-/+ gpu "gpu-h100-02/0" { ~ mig_layout = {} -> {"1g.10gb"=2,"2g.20gb"=1,"3g.40gb"=1} }' in p.stdout
    a = w.run("apply", str(w.spec), "--auto-approve")
    assert a.returncode == 0, a.stderr
    assert "Apply complete! Resources: 2 adopted, 6 added, 0 changed, 0 destroyed. 4 GPUs reconfigured, " \
           "2 nodes drained." in a.stdout
    assert w.state.exists()  # default path: beside the spec
    again = w.run("plan", str(w.spec), "--detailed-exitcode")
    assert again.returncode == 0 and again.stdout == NO_CHANGES + "\n", again.stdout + again.stderr
    for n in w.backend().inventory():
        assert not n.cordoned
        if n.hostname != "gpu-h100-01":
            assert all(desired(g) for g in n.gpus)
    listing = w.run("state", "list", "--state", str(w.state)).stdout.split()
    assert listing[:3] == ["pool.rollout", "pool.train", "quota.team_rl"] and "gpu.gpu-h100-02/1" in listing
    show = w.run("state", "show", "gpu.gpu-h100-02/1", "--state", str(w.state))
    assert show.returncode == 0 and 'mig_layout  = {"1g.10gb"=2,"2g.20gb"=1,"3g.40gb"=1}' in show.stdout
    missing = w.run("state", "show", "gpu.gpu-h100-02/9", "--state", str(w.state))
    assert missing.returncode == 1 and "no resource" in missing.stderr


def test_detailed_exitcode_error_is_1(ws: WS) -> None:
    w = ws()
    w.spec.write_text(w.spec.read_text().replace('"gpu-h100-01"]', '"gpu-h100-01", "gpu-h100-02"]'))
    p = w.run("plan", str(w.spec), "--detailed-exitcode")
    assert p.returncode == 1 and "Node in two pools" in p.stderr
    w.spec.write_text(w.spec.read_text().replace('"gpu-h100-01", "gpu-h100-02"]', '"gpu-h100-01"]'))
    p = w.run("plan", str(w.spec), "--detailed-exitcode", "--backend", "sim:nope.json")
    assert p.returncode == 1 and p.stderr.startswith("error: ")


@pytest.mark.parametrize("args", [("--detailed-exitcode", "--bogus"), ("--detailed-exitcode", "--out"),
                                  ("--detailed-exitcode", "--lock-timeout", "soon"), ("--detailed-exitcode",)])
def test_detailed_exitcode_usage_error_is_1(ws: WS, args: tuple[str, ...]) -> None:
    """An option error exits 1 like every other error; 2 means "changes present" to CI."""
    w = ws()
    p = w.run("plan", *((str(w.spec),) if args != ("--detailed-exitcode",) else ()), *args)
    assert p.returncode == 1 and "Error:" in p.stderr and "Traceback" not in p.stderr, p.stderr
    for cmd in (("apply", "--bogus"), ("validate", "--bogus"), ("fmt", "--bogus")):
        assert w.run(*cmd).returncode == 1


def test_apply_asks_for_literal_yes(ws: WS) -> None:
    w = ws()
    no = w.run("apply", str(w.spec), input="y\n")
    assert no.returncode == 1 and "Only 'yes' will be accepted" in no.stdout and "Apply cancelled." in no.stderr
    assert not w.state.exists()
    yes = w.run("apply", str(w.spec), input="yes\n")
    assert yes.returncode == 0 and "Apply complete!" in yes.stdout


def test_saved_plan_applies_once_then_is_stale(ws: WS) -> None:
    w = ws()
    p = w.run("plan", str(w.spec), "-out", "plan.rlplan")
    assert p.returncode == 0, p.stderr
    assert "Saved plan.rlplan (lineage " in p.stdout and "serial 0). Apply with: rlsched apply plan.rlplan" in p.stdout
    doc = json.loads((w.root / "plan.rlplan").read_text())
    assert doc["kind"] == "rlsched-plan" and doc["config_hash"].startswith("sha256:")
    assert set(doc["plan"]["nodes"]) == {"gpu-h100-01", "gpu-h100-02", "gpu-h100-03"}
    first = w.run("apply", "plan.rlplan")  # saved plans apply without a prompt
    assert first.returncode == 0, first.stderr
    st = StateStore(w.state).read()
    assert st is not None
    serial = st.serial
    again = w.run("apply", "plan.rlplan")
    assert again.returncode == 1
    assert "Saved plan is stale: there is no state, but" not in again.stderr
    assert again.stderr.startswith(f"error: Saved plan is stale: state serial {serial} != plan serial 0 (lineage ")
    # a plan made against the new state, then the state moves on: stale too
    w.spec.write_text(w.spec.read_text().replace('max_slices = { "1g.10gb" = 4 }', 'max_slices = { "1g.10gb" = 2 }'))
    assert w.run("plan", str(w.spec), "--out", "p2.rlplan").returncode == 0
    assert w.run("apply", str(w.spec), "--auto-approve").returncode == 0
    stale = w.run("apply", "p2.rlplan")
    assert stale.returncode == 1 and "Saved plan is stale: state serial" in stale.stderr


def test_fingerprint_change_between_plan_and_apply_is_refused(ws: WS) -> None:
    w = ws()
    assert w.run("apply", str(w.spec), "--auto-approve").returncode == 0
    w.spec.write_text(w.spec.read_text().replace('"3g.40gb" = 1 }', '"3g.40gb" = 1, "1g.10gb+me" = 0 }')
                      .replace('"1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1, "1g.10gb+me" = 0', '"3g.40gb" = 2'))
    assert w.run("plan", str(w.spec), "--out", "plan.rlplan").returncode == 0
    be = w.backend()
    g = be.node("gpu-h100-03").gpus[1]
    be.set_mig_layout("gpu-h100-03", g.uuid, {"1g.10gb": 7})
    a = w.run("apply", "plan.rlplan")
    assert a.returncode == 1
    assert "error: gpu-h100-03 changed since plan (GPU 1 MIG layout now 1g.10gb×7); run plan again" in a.stderr  # noqa: RUF001
    # gpu-h100-02 (its own batch, before 03) was done; 03 was never touched
    assert all(x.layout_counts() == {"3g.40gb": 2} for x in be.node("gpu-h100-02").gpus)
    assert be.node("gpu-h100-03").gpus[0].layout_counts() == BALANCED
    assert not be.node("gpu-h100-03").cordoned


def test_drain_timeout_leaves_node_cordoned_and_plan_shows_the_rest(ws: WS) -> None:
    w = ws(drain="1s")
    be = w.backend()
    busy = be.node("gpu-h100-02").gpus[0]
    be.set_processes("gpu-h100-02", busy.uuid, 2)
    a = w.run("apply", str(w.spec), "--auto-approve")
    assert a.returncode == 1 and "gpu-h100-02: drain: timed out after 1s (2 jobs still running)" in a.stderr
    assert be.node("gpu-h100-02").cordoned
    rest = w.plan_json()
    todo = sorted(c["address"] for c in rest["changes"] if c["action"] != "=" or c["adopt"])
    assert todo == [f"gpu.gpu-h100-0{n}/{i}" for n in (2, 3) for i in (0, 1)]
    be.set_processes("gpu-h100-02", busy.uuid, 0)
    assert w.run("apply", str(w.spec), "--auto-approve").returncode == 0
    assert w.run("plan", str(w.spec), "--detailed-exitcode").returncode == 0
    assert not be.node("gpu-h100-02").cordoned


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_kill_9_mid_apply_leaves_valid_state_and_plan_shows_exactly_the_rest(ws: WS, seed: int) -> None:
    w = ws()
    full = w.plan_json()
    planned = {c["address"] for c in full["changes"] if c["action"] != "=" or c["adopt"]}
    proc = w.popen("apply", str(w.spec), "--auto-approve", env={"RLSCHED_APPLY_STEP_DELAY": "0.04"})
    time.sleep(random.Random(seed).uniform(0.5, 2.5))  # interpreter start-up is ~0.4s; apply is ~40 steps
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    st = StateStore(w.state).read()  # valid (or absent if killed before the first write)
    rest = w.plan_json()
    assert rest["lineage"] == (st.lineage if st else rest["lineage"])
    be = w.backend()
    gpus = {f"gpu.{n.hostname}/{g.index}": g for n in be.inventory() for g in n.gpus}
    todo = {c["address"]: c for c in rest["changes"] if c["action"] not in ("=", "?")}
    for addr in (a for a in planned if a.startswith("gpu.gpu-h100-0") and not a.startswith("gpu.gpu-h100-01")):
        done = desired(gpus[addr])
        assert (addr in todo) == (not done), (addr, done, sorted(todo))
    for addr, c in todo.items():  # nothing new: only what the first plan had, or uncordoning what it cordoned
        assert addr in planned or (c["type"] == "node" and "uncordon" in c["reasons"][0]), addr
    fin = w.run("apply", str(w.spec), "--auto-approve")
    assert fin.returncode == 0, fin.stdout + fin.stderr
    assert w.run("plan", str(w.spec), "--detailed-exitcode").returncode == 0
    assert not any(n.cordoned for n in be.inventory())


def _wait_for_lock(w: Workspace, timeout: float = 30) -> dict[str, Any]:
    lock = w.root / "rlsched.state.json.lock"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if lock.exists() and lock.read_text().strip():
            return json.loads(lock.read_text())
        time.sleep(0.05)
    raise AssertionError("apply never took the lock")


def test_concurrent_applies_one_fails_naming_the_holder_one_waits(ws: WS) -> None:
    w = ws()
    slow = w.popen("apply", str(w.spec), "--auto-approve", env={"RLSCHED_APPLY_STEP_DELAY": "0.3"})
    try:
        holder = _wait_for_lock(w)
        assert holder["op"] == "apply" and holder["pid"] == slow.pid
        fail = w.run("apply", str(w.spec), "--auto-approve")
        assert fail.returncode == 1
        assert fail.stderr.startswith(f"error: state locked by apply (pid {slow.pid} on ")
        assert f"wait or run rlsched force-unlock {holder['id']}" in fail.stderr
        wait = w.run("apply", str(w.spec), "--auto-approve", "--lock-timeout", "120")
        assert wait.returncode == 0, wait.stderr
        assert slow.wait(timeout=120) == 0
        assert wait.stdout.strip() == NO_CHANGES  # the first apply did everything
    finally:
        slow.kill()
        slow.wait()


def test_force_unlock_via_cli(ws: WS) -> None:
    w = ws()
    slow = w.popen("apply", str(w.spec), "--auto-approve", env={"RLSCHED_APPLY_STEP_DELAY": "1.0"})
    try:
        holder = _wait_for_lock(w)
        bad = w.run("force-unlock", "nope", "--state", str(w.state), "--force")
        assert bad.returncode == 1 and "does not match" in bad.stderr
        cancel = w.run("force-unlock", holder["id"], "--state", str(w.state), input="no\n")
        assert cancel.returncode == 1
        ok = w.run("force-unlock", holder["id"], "--state", str(w.state), input="yes\n")
        assert ok.returncode == 0 and "successfully unlocked" in ok.stdout
    finally:
        slow.kill()
        slow.wait()


def test_killed_apply_lock_is_taken_over_with_a_warning(ws: WS) -> None:
    w = ws()
    slow = w.popen("apply", str(w.spec), "--auto-approve", env={"RLSCHED_APPLY_STEP_DELAY": "1.0"})
    holder = _wait_for_lock(w)
    slow.send_signal(signal.SIGKILL)
    slow.wait()
    p = w.run("plan", str(w.spec))
    assert p.returncode == 0
    assert f"pid {holder['pid']}" in p.stderr and "exited without releasing it" in p.stderr
