"""Saved plans (``plan --out FILE``): JSON that ``apply FILE`` performs exactly, unprompted.

Format (``format_version`` 1)::

    {"kind": "rlsched-plan", "format_version": 1, "rlsched_version": "0.1.0", "created": "...Z",
     "config_hash": "sha256:...", "files": ["/abs/pool.hcl"], "variables": {...},
     "state_path": "/abs/rlsched.state.json", "backend": "sim:/abs/fleet.json",
     "plan": {"lineage": "...", "serial": 7, "changes": [...], "drift": [...],
              "nodes": {"gpu-h100-03": {"fingerprint": "...", "gpus": {...}}},
              "disruption": {"train": {...}}, "summary": {...}}}

Why it holds what it holds: lineage + serial let apply refuse a stale plan (and,
because a lineage is minted even for empty state, a plan made against no state
cannot be applied twice); the per-node fingerprints let apply refuse to touch a
node that changed since the plan; the config hash and variables say what the plan
was made from, and the disruption budgets make the file self-contained.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsched.plan.diff import Plan
from rlsched.plan.errors import PlanError
from rlsched.plan.state import _rlsched_version, utcnow
from rlsched.posix import atomic_write

PLANFILE_KIND = "rlsched-plan"
PLANFILE_VERSION = 1


def config_hash(files: Iterable[str | os.PathLike[str]]) -> str:
    """``sha256:...`` over the names and contents of the spec files (order-independent)."""
    h = hashlib.sha256()
    for p in sorted(Path(f).resolve() for f in files):
        h.update(p.name.encode() + b"\0")
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(b"<unreadable>")
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True, slots=True)
class SavedPlan:
    """A plan plus what it was made from and against."""

    plan: Plan
    config_hash: str = ""
    files: tuple[str, ...] = ()
    variables: Mapping[str, Any] = field(default_factory=dict)
    state_path: str = ""
    backend: str | None = None
    created: str = field(default_factory=utcnow)
    rlsched_version: str = field(default_factory=_rlsched_version)

    def to_json(self) -> dict[str, Any]:
        return {"kind": PLANFILE_KIND, "format_version": PLANFILE_VERSION, "rlsched_version": self.rlsched_version,
                "created": self.created, "config_hash": self.config_hash, "files": list(self.files),
                "variables": json.loads(json.dumps(dict(self.variables), default=str)),
                "state_path": self.state_path, "backend": self.backend, "plan": self.plan.to_json()}


def save_plan(path: str | os.PathLike[str], saved: SavedPlan) -> None:
    """Write a saved plan atomically (a half-written plan file must never be appliable)."""
    if saved.plan.errored:
        raise PlanError("a plan with errors cannot be saved")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, (json.dumps(saved.to_json(), indent=2) + "\n").encode())


def looks_like_plan_file(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a saved plan (so ``apply X`` can tell a plan from a spec without a flag)."""
    p = Path(path)
    if p.suffix in (".hcl", ".rlvars"):
        return False
    try:
        with open(p, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and PLANFILE_KIND.encode() in head


def load_plan(path: str | os.PathLike[str]) -> SavedPlan:
    """Read a saved plan.

    Raises:
        PlanError: missing file, not JSON, not a plan, or a newer format.
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanError(f"{p}: no such plan file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"{p}: not a readable plan file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != PLANFILE_KIND:
        raise PlanError(f"{p}: not an rlsched plan file")
    if int(doc.get("format_version", 0)) > PLANFILE_VERSION:
        raise PlanError(f"{p}: plan format_version {doc.get('format_version')} is newer than this rlsched supports")
    try:
        plan = Plan.from_json(doc["plan"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{p}: malformed plan ({exc!r})") from None
    return SavedPlan(plan=plan, config_hash=str(doc.get("config_hash", "")), files=tuple(doc.get("files") or ()),
                     variables=dict(doc.get("variables") or {}), state_path=str(doc.get("state_path", "")),
                     backend=doc.get("backend"), created=str(doc.get("created", "")),
                     rlsched_version=str(doc.get("rlsched_version", "")))
