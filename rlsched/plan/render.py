"""Render a :class:`~rlsched.plan.diff.Plan` as text (Terraform's shape) or JSON (``plan --json``).

Rendering is separate from diffing (Terraform keeps them in different packages):
the plan is a value, and the text here is only one view of it, pinned by golden tests.

Text layout::

    Note: objects changed outside rlsched (declared attributes only)
      ~ gpu.gpu-h100-05/3  mig_layout: {"1g.10gb"=2} -> {}

      + pool "train" {
          + capacity = "on_demand"
        }
    -/+ gpu "gpu-h100-04/0" { ~ mig_layout = {"1g.10gb"=7} -> {"3g.40gb"=2} }
          # recreates all 7 MIG instances on GPU-...: destroys 7, creates 2
          # DISRUPTIVE: drains node gpu-h100-04: 2 jobs (drain_timeout 5m)
      # gpu.gpu-h100-05/0 will be adopted (layout already matches)
      ? node "gpu-h100-06"
          # unreachable at refresh: no change planned

    Plan: 1 to adopt, 1 to add, 0 to change, 0 to destroy. 1 GPU to reconfigure, 1 node to drain.

The glyph column is three wide and right-aligned so that ``+``, ``~`` and ``-/+`` line up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlsched.plan.diff import Action, Change, Plan, format_layout

NO_CHANGES = "No changes. Your GPU pools match the configuration."
DRIFT_HEADER = "Note: objects changed outside rlsched (declared attributes only)"


def fmt_value(v: Any, key: str = "") -> str:
    """An attribute value in HCL-ish syntax (strings quoted, ``true``/``null``, layouts as mig-parted counts)."""
    if key.endswith("mig_layout") and isinstance(v, Mapping):
        return format_layout(v)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v)) if abs(v) < 1e15 else repr(v)
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{json.dumps(str(k))}={fmt_value(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    return str(v)


def _flatten(d: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """``{"disruption": {"max_unavailable": 1}}`` -> ``{"disruption.max_unavailable": 1}``; layouts stay whole."""
    out: dict[str, Any] = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and k not in ("mig_layout", "devices", "max_slices", "weights"):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _head(c: Change) -> str:
    # for_each instances (``h100["infer"]``) read best as addresses; plain names as block labels.
    label = f"{c.type}.{c.name}" if '"' in c.name else f'{c.type} "{c.name}"'
    return f"{c.action.glyph:>3} {label}"


def _body_lines(c: Change) -> list[str]:
    """The attribute part of a change: one line when short, a block otherwise."""
    before, after = _flatten(c.before), _flatten(c.after)
    if c.action is Action.CREATE:
        items = [("+", k, fmt_value(v, k)) for k, v in sorted(after.items()) if v not in (None, {}, [], "")]
    elif c.action is Action.DELETE:
        items = [("-", "pool", fmt_value(before["pool"]))] if c.type == "node" and "pool" in before else []
    elif c.action in (Action.UPDATE, Action.REPLACE) or c.action.is_replace():
        keys = sorted(set(before) | set(after))
        if c.type == "gpu" and after.get("mig_enabled") and before.get("mig_layout") != after.get("mig_layout"):
            keys = ["mig_layout"]  # enabling MIG to get a layout: the reset is in the reasons, the layout is the news
        elif c.type == "gpu" and before.get("mig_enabled") and not after.get("mig_enabled"):
            keys = ["mig_enabled"]  # disabling MIG: that its instances go is in the reasons
        items = [("~", k, f"{fmt_value(before.get(k), k)} -> {fmt_value(after.get(k), k)}") for k in keys
                 if before.get(k) != after.get(k)]
    else:
        items = []
    if not items:
        return [_head(c)]
    inline = "{ " + ", ".join(f"{s} {k} = {v}" for s, k, v in items) + " }"
    if len(items) == 1 and len(_head(c)) + 1 + len(inline) <= 120:
        return [f"{_head(c)} {inline}"]
    width = max(len(k) for _, k, _ in items)
    return [f"{_head(c)} {{", *(f"      {s} {k:<{width}} = {v}" for s, k, v in items), "    }"]


def render_change(c: Change) -> list[str]:
    if c.adopt:
        return [f"    # {r}" for r in c.reasons] or [f"    # {c.address} will be adopted"]
    lines = _body_lines(c)
    lines.extend(f"      # {r}" for r in c.reasons)
    return lines


def render_drift(plan: Plan) -> list[str]:
    if not plan.drift:
        return []
    lines = [DRIFT_HEADER]
    for d in plan.drift:
        if d.attribute == "present":
            lines.append(f"  - {d.address}  no longer reported by its node")
        else:
            lines.append(f"  ~ {d.address}  {d.attribute}: {fmt_value(d.before, d.attribute)} -> "
                         f"{fmt_value(d.after, d.attribute)}")
    return lines


def _adoption_lines(run: list[Change]) -> list[str]:
    """Adoptions of consecutive GPUs of one node collapse into one line (``gpu.h/0-7 (8 GPUs)``)."""
    if len(run) < 3:
        return [line for c in run for line in render_change(c)]
    host = run[0].node
    first, last = run[0].name.rsplit("/", 1)[1], run[-1].name.rsplit("/", 1)[1]
    return [f"    # gpu.{host}/{first}-{last} ({len(run)} GPUs) will be adopted (layout already matches)"]


def _render_changes(changes: list[Change]) -> list[str]:
    out: list[str] = []
    run: list[Change] = []
    for c in changes:
        if c.adopt and c.type == "gpu" and (not run or (run[-1].node == c.node and _next_index(run[-1], c))):
            run.append(c)
            continue
        out.extend(_adoption_lines(run))
        run = [c] if c.adopt and c.type == "gpu" else []
        if not run:
            out.extend(render_change(c))
    out.extend(_adoption_lines(run))
    return out


def _next_index(a: Change, b: Change) -> bool:
    try:
        return int(b.name.rsplit("/", 1)[1]) == int(a.name.rsplit("/", 1)[1]) + 1
    except ValueError:
        return False


def render_plan(plan: Plan) -> str:
    """The whole plan as text (without the "Saved plan" footer, which the CLI adds)."""
    out: list[str] = []
    shown = [c for c in plan.changes if c.action is not Action.NOOP or c.adopt]
    if not plan.has_changes:
        out.append(NO_CHANGES)
        if plan.unknown:
            out.append("")
            for c in plan.unknown:
                out.extend(render_change(c))
        if plan.drift:
            out.append("")
            out.extend(render_drift(plan))
        return "\n".join(out) + "\n"
    if plan.drift:
        out.extend(render_drift(plan))
        out.append("")
    out.append("rlsched will perform the following actions:")
    out.append("")
    out.extend(_render_changes(shown))
    out.append("")
    out.append(plan.summary.line())
    return "\n".join(out) + "\n"


def render_json(plan: Plan) -> str:
    """``plan --json``: the plan value itself (see :meth:`Plan.to_json`)."""
    return json.dumps(plan.to_json(), indent=2, sort_keys=False) + "\n"
