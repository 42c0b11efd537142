"""``rlsched plan | apply | state list | state show | force-unlock``: Terraform's workflow over GPU pools.

Thin layer: parse options, take the state lock, call :mod:`rlsched.plan`, render.
Exit codes follow Terraform: ``plan --detailed-exitcode`` exits 0 (no changes),
1 (error) or 2 (changes); everything else 0 or 1. Options also accept Terraform's
single-dash spelling (``-out``, ``-auto-approve``, ``-detailed-exitcode``...).

The backend defaults to ``$RLSCHED_BACKEND``; the state to ``rlsched.state.json``
beside the first spec file (``--state`` changes it). ``RLSCHED_APPLY_STEP_DELAY``
(seconds) slows apply down between steps: a test hook for crash tests.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from rlsched.cli.app import SectionedGroup, app
from rlsched.errors import RlschedError

if TYPE_CHECKING:
    from rlsched.plan.diff import Plan
    from rlsched.plan.state import StateStore
    from rlsched.runtime.backend import GpuBackend
    from rlsched.spec.model import Diagnostic, Spec

state_app = typer.Typer(cls=SectionedGroup, rich_markup_mode=None,
                   help="Inspect rlsched state.", no_args_is_help=True)
app.add_typer(state_app, name="state")

BackendOpt = Annotated[str | None, typer.Option(
    "--backend", "-backend", help="sim:PATH.json (simulated fleet), nvml or ray:auto / ray:HOST:PORT "
                                  "(a Ray cluster); default: $RLSCHED_BACKEND.")]
StateOpt = Annotated[Path | None, typer.Option(
    "--state", "-state", help="State file; default: rlsched.state.json beside the (first) spec.")]
LockTimeoutOpt = Annotated[float, typer.Option(
    "--lock-timeout", "-lock-timeout", min=0.0, help="Seconds to wait for the state lock before failing.")]
VarOpt = Annotated[list[str] | None, typer.Option("--var", "-var", help="Set a variable: NAME=VALUE (repeatable).")]
VarFileOpt = Annotated[list[Path] | None, typer.Option(
    "--var-file", "-var-file", help="Variables file (.rlvars; repeatable, later wins).")]

APPROVE_PROMPT = ("\nDo you want to perform these actions?\n"
                  "  rlsched will perform the actions described above.\n"
                  "  Only 'yes' will be accepted to approve.\n\n"
                  "  Enter a value: ")


def _usage_error_classes() -> tuple[type[Any], ...]:
    """click's UsageError, and typer's vendored copy of it (recent typer ships its own click)."""
    found: list[type[Any]] = []
    try:
        from click.exceptions import UsageError
    except ImportError:
        pass
    else:
        found.append(UsageError)
    try:
        from typer._click.exceptions import UsageError as VendoredUsageError
    except ImportError:
        pass
    else:
        found.append(VendoredUsageError)
    return tuple(found)


_USAGE_ERRORS = _usage_error_classes()


class ExitOneOnUsageError(TyperCommand):
    """A command whose usage errors (unknown option, missing argument) exit 1, as Terraform's do.

    Click exits 2 on a usage error, which ``plan --detailed-exitcode`` reserves for
    "changes present": a CI job with a mistyped option would read it as a plan to
    apply. Every Terraform-style command (validate, fmt, plan, apply) uses this class.
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _USAGE_ERRORS as exc:
            exc.exit_code = 1
            raise


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


# --- shared helpers ------------------------------------------------------------------------


def render_diagnostics(diags: Sequence[Diagnostic]) -> str:
    """Terraform-style diagnostics, through :mod:`rlsched.spec.render` when present (one look for every command)."""
    try:
        from rlsched.spec.render import render_text
    except ImportError:
        pass
    else:
        out = render_text(list(diags))
        return out if out.endswith("\n") else out + "\n"
    lines: list[str] = []
    for d in diags:
        lines.append(f"{'Error' if d.severity == 'error' else 'Warning'}: {d.summary}")
        if d.range is not None:
            lines.append(f"  on {d.range}")
        if d.detail:
            lines.append(f"  {d.detail}")
        lines.append("")
    return "\n".join(lines)


def _load_spec(paths: Sequence[Path], var_files: Sequence[Path] | None, var_args: Sequence[str] | None) -> Spec:
    """Load the spec; on errors print every diagnostic (Terraform style) and exit 1."""
    try:
        from rlsched.spec import load_spec
    except ImportError as exc:  # the HCL loader is not part of this build
        raise RlschedError(f"the HCL spec loader is not available ({exc})") from None
    from rlsched.spec.model import SpecError

    for p in paths:
        if not p.exists():
            raise RlschedError(f"{p}: no such spec file")
    try:
        spec = load_spec(list(paths), var_files=tuple(str(f) for f in var_files or ()),
                         var_args=tuple(var_args or ()), env=os.environ)
    except SpecError as exc:
        _err(render_diagnostics(exc.diagnostics).rstrip("\n"))
        raise typer.Exit(1) from None
    if spec.warnings:
        _err(render_diagnostics(spec.warnings).rstrip("\n"))
    return spec


def default_state_path(specs: Sequence[Path]) -> Path:
    """``rlsched.state.json`` beside the first spec (inside it, if it is a directory)."""
    from rlsched.plan.state import DEFAULT_STATE_NAME

    if not specs:
        return Path(DEFAULT_STATE_NAME)
    first = specs[0]
    return (first if first.is_dir() else first.parent) / DEFAULT_STATE_NAME


def _backend(spec: str | None) -> GpuBackend:
    from rlsched.runtime.select import get_backend

    return get_backend(spec)


def _backend_string(backend_opt: str | None) -> str | None:
    """The backend as written, with a sim path made absolute so a saved plan can be applied from anywhere."""
    s = backend_opt or os.environ.get("RLSCHED_BACKEND") or None
    if s and s.startswith("sim:"):
        return "sim:" + str(Path(s[4:]).resolve())
    return s


def _make_plan(spec: Spec, backend: GpuBackend, store: StateStore) -> Plan:
    from rlsched.plan.diff import plan
    from rlsched.plan.refresh import refresh

    fresh = refresh(backend)
    return plan(spec, fresh.nodes, store.read(), running_jobs=fresh.running_jobs)


def _check_plan(p: Plan) -> None:
    errors = [d for d in p.diagnostics if d.severity == "error"]
    warnings = [d for d in p.diagnostics if d.severity != "error"]
    if warnings:
        _err(render_diagnostics(warnings).rstrip("\n"))
    if errors:
        _err(render_diagnostics(errors).rstrip("\n"))
        raise typer.Exit(1)


def safe_text(text: str) -> str:
    """Plan, apply and state output with control characters escaped (hostnames and names come from the
    backend and the state file); newlines and tabs pass."""
    from rlsched.report.terminal import escape_control

    return escape_control(text, keep="\n\t")


def _step_delay() -> float:
    from rlsched.plan.apply import STEP_DELAY_ENV

    raw = os.environ.get(STEP_DELAY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise RlschedError(f"{STEP_DELAY_ENV}={raw!r}: expected seconds (a number)") from None


# --- plan ------------------------------------------------------------------------------------


@app.command("plan", cls=ExitOneOnUsageError)
def plan_cmd(
    specs: Annotated[list[Path], typer.Argument(help="Spec files (.hcl) or directories.", show_default=False)],
    backend: BackendOpt = None,
    state: StateOpt = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-out", help="Save the plan here (JSON); apply it with: rlsched apply FILE.")] = None,
    detailed_exitcode: Annotated[bool, typer.Option(
        "--detailed-exitcode", "-detailed-exitcode", help="Exit 0 = no changes, 1 = error, 2 = changes.")] = False,
    var: VarOpt = None,
    var_file: VarFileOpt = None,
    json_out: Annotated[bool, typer.Option("--json", "-json", help="Print the plan as JSON.")] = False,
    lock_timeout: LockTimeoutOpt = 0.0,
) -> None:
    """Refresh from the backend and show what apply would change (declared attributes only)."""
    from rlsched.plan.planfile import SavedPlan, config_hash, save_plan
    from rlsched.plan.render import render_json, render_plan
    from rlsched.plan.state import StateStore, locked

    spec = _load_spec(specs, var_file, var)
    store = StateStore(state or default_state_path(specs))
    be = _backend(backend)
    with locked(store, "plan", timeout=lock_timeout, warn=_err):
        p = _make_plan(spec, be, store)
    _check_plan(p)
    typer.echo(render_json(p) if json_out else safe_text(render_plan(p)), nl=False)
    if out is not None:
        save_plan(out, SavedPlan(plan=p, config_hash=config_hash(spec.files or specs),
                                 files=tuple(str(Path(f).resolve()) for f in (spec.files or specs)),
                                 variables=dict(spec.variables), state_path=str(store.path.resolve()),
                                 backend=_backend_string(backend)))
        if not json_out:
            typer.echo(f"\nSaved {out} (lineage {p.lineage[:8]}…, serial {p.serial}). Apply with: rlsched apply {out}")
    if detailed_exitcode and p.has_changes:
        raise typer.Exit(2)


# --- apply -----------------------------------------------------------------------------------


def _ask_yes() -> bool:
    sys.stdout.write(APPROVE_PROMPT)
    sys.stdout.flush()
    answer = sys.stdin.readline()
    return answer.strip() == "yes"


@app.command("apply", cls=ExitOneOnUsageError)
def apply_cmd(
    targets: Annotated[list[Path], typer.Argument(
        help="A saved plan (from plan --out), or spec files.", show_default=False)],
    auto_approve: Annotated[bool, typer.Option(
        "--auto-approve", "-auto-approve", help="Skip the 'yes' prompt (never skips prevent_destroy or drain "
                                                "budgets).")] = False,
    backend: BackendOpt = None,
    state: StateOpt = None,
    lock_timeout: LockTimeoutOpt = 0.0,
    var: VarOpt = None,
    var_file: VarFileOpt = None,
    no_serve: Annotated[bool, typer.Option(
        "--no-serve", "-no-serve", help="Do not start or reload the scheduler service afterwards.")] = False,
    service_state_dir: Annotated[Path | None, typer.Option(
        "--service-state-dir", help="State dir of the scheduler service; default: .rlsched-service/<spec name> "
                                    "beside the spec.")] = None,
    service_listen: Annotated[str, typer.Option(
        "--service-listen", help="HOST:PORT a newly started service listens on.")] = "127.0.0.1:8470",
    service_public_read: Annotated[bool, typer.Option(
        "--service-public-read", help="A newly started service lets readers without the token see the fleet and "
                                      "queue, redacted (rlsched serve --public-read; a running one keeps its "
                                      "setting).")] = False,
) -> None:
    """Apply a saved plan exactly (no prompt), or plan the spec, ask for 'yes', and apply.

    Afterwards, when the spec declares a policy block, the scheduler service is
    made to run it: started detached if it is not running, else hot-reloaded
    (queued and running jobs are kept). --no-serve skips this.
    """
    from rlsched.plan.apply import Applier, ApplyOptions
    from rlsched.plan.planfile import config_hash, load_plan, looks_like_plan_file
    from rlsched.plan.render import NO_CHANGES, render_plan
    from rlsched.plan.state import StateStore, locked

    opts = ApplyOptions(step_delay_s=_step_delay(), progress=lambda line: typer.echo(safe_text(line)))
    if len(targets) == 1 and looks_like_plan_file(targets[0]):
        saved = load_plan(targets[0])
        if var or var_file:
            raise RlschedError("--var/--var-file cannot be used with a saved plan (its variables are fixed)")
        store = StateStore(state or Path(saved.state_path or default_state_path(targets)))
        be = _backend(backend or saved.backend)
        files = [Path(f) for f in saved.files]
        if files and all(f.exists() for f in files) and config_hash(files) != saved.config_hash:
            _err("Warning: the spec files changed since this plan was made; applying the saved plan as planned")
        with locked(store, "apply", timeout=lock_timeout, warn=_err):
            applier = Applier(saved.plan, be, store, store.read(), opts)
            result = applier.run() if saved.plan.has_changes else None
        typer.echo(f"\n{result.line()}" if result is not None else NO_CHANGES)
        if not no_serve and files and all(f.exists() for f in files):
            try:
                saved_spec = _load_spec(files, None, _var_args(saved.variables))
            except (RlschedError, typer.Exit):
                _err("Warning: cannot load the plan's spec files; the scheduler service was not started/reloaded")
                return
            _ensure_service(saved_spec, files, backend or saved.backend, service_state_dir, service_listen,
                            public_read=service_public_read)
        return

    spec = _load_spec(targets, var_file, var)
    store = StateStore(state or default_state_path(targets))
    be = _backend(backend)
    with locked(store, "apply", timeout=lock_timeout, warn=_err):
        p = _make_plan(spec, be, store)
        _check_plan(p)
        typer.echo(safe_text(render_plan(p)), nl=False)
        result = None
        if p.has_changes:
            if not auto_approve and not _ask_yes():
                from rlsched.plan.errors import ApprovalError

                raise ApprovalError("Apply cancelled.")
            typer.echo("")
            result = Applier(p, be, store, store.read(), opts).run()
    if result is not None:
        typer.echo(f"\n{result.line()}")
    if not no_serve:
        _ensure_service(spec, targets, _backend_string(backend), service_state_dir, service_listen,
                        public_read=service_public_read)


def _var_args(variables: Mapping[str, Any]) -> list[str]:
    from rlsched.service.config import ServiceConfig

    return ServiceConfig(spec_paths=[Path(".")], state_dir=Path("."), variables=dict(variables)).var_args()


def _ensure_service(spec: Spec, files: Sequence[Path], backend: str | None, state_dir: Path | None,
                    listen: str, *, public_read: bool = False) -> None:
    """After apply: make the scheduler service run the spec's policy (start it, or hot-reload the running one)."""
    if not spec.policies:
        return
    from rlsched.service.client import Client
    from rlsched.service.config import ServiceConfig, default_state_dir
    from rlsched.service.daemon import find_running, start_detached

    paths = [Path(f).resolve() for f in files]
    sd = (state_dir or default_state_dir(paths[0])).resolve()
    running = find_running(sd)
    if running is not None:
        out = Client(running.url, state_dir=sd).reload(paths)
        policy = out.get("policy") if isinstance(out, dict) else None
        what = f" (policy {policy})" if isinstance(policy, str) and policy else ""
        typer.echo(f"\nScheduler service at {running.url} reloaded{what}; queued and running jobs kept.")
        warning = out.get("warning") if isinstance(out, dict) else None
        if isinstance(warning, str) and warning:
            _err(f"Warning: {warning}")
        return
    config = ServiceConfig(spec_paths=paths, state_dir=sd, backend=backend, variables=dict(spec.variables),
                           public_read=public_read)
    info = start_detached(config, listen)
    typer.echo(f"\nScheduler service started at {info.url} (pid {info.pid}, state dir {sd}, "
               f"log {sd / 'service.log'}).")


# --- state, force-unlock ---------------------------------------------------------------------


def _state_or_fail(state: Path | None) -> Any:
    from rlsched.plan.errors import StateError
    from rlsched.plan.state import DEFAULT_STATE_NAME, StateStore

    store = StateStore(state or Path(DEFAULT_STATE_NAME))
    st = store.read()
    if st is None:
        raise StateError(f"no state at {store.path} (run apply first, or pass --state)")
    return st


@state_app.command("list")
def state_list(state: StateOpt = None) -> None:
    """List the addresses in the state, one per line."""
    st = _state_or_fail(state)
    for rec in st.to_json()["resources"]:
        typer.echo(safe_text(f"{rec['type']}.{rec['name']}"))


@state_app.command("show")
def state_show(
    address: Annotated[str, typer.Argument(help="pool.NAME, node.HOST, gpu.HOST/IDX or gpu.GPU-UUID.")],
    state: StateOpt = None,
    json_out: Annotated[bool, typer.Option("--json", "-json", help="Print the record as JSON.")] = False,
) -> None:
    """Show one resource: declared attributes, what was observed, dependencies."""
    from rlsched.plan.errors import StateError
    from rlsched.plan.render import fmt_value

    st = _state_or_fail(state)
    rec = st.find(address)
    if rec is None:
        import difflib

        close = difflib.get_close_matches(address, [r.address for r in st.resources.values()], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise StateError(f"no resource {address!r} in state{hint}")
    if json_out:
        typer.echo(json.dumps(rec.to_json(), indent=2))
        return
    typer.echo(safe_text(f"# {rec.address}:"))
    typer.echo(safe_text(f'{rec.type} "{rec.name}" {{'))
    typer.echo(f"  key = {fmt_value(rec.key)}")
    for section, values in (("attributes", rec.attributes), ("observed", rec.observed)):
        if not values:
            continue
        typer.echo(f"\n  # {section}")
        width = max(len(k) for k in values)
        for k, v in sorted(values.items()):
            typer.echo(safe_text(f"  {k:<{width}} = {fmt_value(v, k)}"))
    if rec.depends_on:
        typer.echo(safe_text(f"\n  depends_on = [{', '.join(rec.depends_on)}]"))
    typer.echo("}")


@app.command("force-unlock")
def force_unlock_cmd(
    lock_id: Annotated[str, typer.Argument(help="The lock ID printed by the command that found the state locked.")],
    state: StateOpt = None,
    force: Annotated[bool, typer.Option("--force", "-force", help="Do not ask for confirmation.")] = False,
) -> None:
    """Remove a stuck state lock (only if you know its holder is gone)."""
    from rlsched.plan.errors import ApprovalError
    from rlsched.plan.state import DEFAULT_STATE_NAME, StateStore, force_unlock

    store = StateStore(state or Path(DEFAULT_STATE_NAME))
    if not force:
        sys.stdout.write("Do you really want to force-unlock?\n"
                         f"  rlsched will remove the lock {lock_id} on {store.path}. Other commands may then modify\n"
                         "  the state even if the holder is still running. Only 'yes' will be accepted to confirm.\n\n"
                         "  Enter a value: ")
        sys.stdout.flush()
        if sys.stdin.readline().strip() != "yes":
            raise ApprovalError("force-unlock cancelled.")
    holder = force_unlock(store, lock_id)
    typer.echo(f"rlsched state has been successfully unlocked (was held by {holder.describe()}).")
