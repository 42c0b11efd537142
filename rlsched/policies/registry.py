"""The policy registry: ``--policy NAME[:KEY=VALUE,...]`` to a scheduler.

A scheduler class becomes selectable by name with :func:`register`; the built-in
heuristics register themselves when :mod:`rlsched.policies.heuristics` is imported,
which importing :mod:`rlsched.policies` (the parent of this module) always does. A
plugin registers its own class the same way. Learned policies are not registered:
``ppo:REF`` names a model folder and is built by :func:`rlsched.learned.ppo.make_ppo_policy`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, TypeVar

from rlsched.cluster.scheduler import Scheduler
from rlsched.errors import ScenarioError

_REGISTRY: dict[str, tuple[Callable[..., Any], str]] = {}

_T = TypeVar("_T")


def register(name: str, summary: str) -> Callable[[_T], _T]:
    """Class decorator: make a scheduler selectable as ``--policy NAME``."""

    def deco(cls: _T) -> _T:
        assert callable(cls)
        _REGISTRY[name] = (cls, summary)
        return cls

    return deco


def available() -> dict[str, str]:
    """Registered policy names and their one-line summaries."""
    return {k: v[1] for k, v in sorted(_REGISTRY.items())}


def _policy_value(v: Any) -> str | None:
    """``v`` written as a policy-string value (``true``, ``3250/7200``), None if a string cannot set it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return f"{v:g}"
    if isinstance(v, str):
        return v
    if isinstance(v, tuple) and v and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
        return "/".join(f"{x:g}" for x in v)
    return None


def parameters(name: str) -> dict[str, str]:
    """The parameters ``NAME:KEY=VALUE,...`` can set on a registered policy, with their defaults.

    Read from the constructor's signature (keyword parameters with a default a policy
    string can write: numbers, booleans, strings, numbers joined by ``/``), so the
    list ``rlsched policies`` shows cannot drift from what :func:`make_policy` accepts.
    """
    import inspect

    try:
        sig = inspect.signature(_REGISTRY[name][0])
    except (TypeError, ValueError):
        return {}
    out: dict[str, str] = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.default is p.empty:
            continue
        text = _policy_value(p.default)
        if text is not None:
            out[p.name] = text
    return out


def parse_policy_string(text: str) -> tuple[str, dict[str, Any]]:
    """``(name, parameters)`` of ``NAME[:KEY=VALUE,...]`` (``tiresias:thresholds=3250/7200,promote_knob=2``).

    A value is an integer, a number, ``true``/``false``, numbers joined by ``/`` (a
    tuple, e.g. thresholds) or else a string. Raises :class:`ScenarioError` naming the bad part.
    """
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ScenarioError(f"policy {text!r}: parameters are KEY=VALUE, got {item!r}")
        key, value = key.strip(), value.strip()
        if value.lower() in ("true", "false"):
            params[key] = value.lower() == "true"
            continue
        try:
            if "/" in value:
                params[key] = tuple(float(v) for v in value.split("/") if v)
            else:
                params[key] = int(value) if value.lstrip("+-").isdigit() else float(value)
        except ValueError:
            if "/" in value:
                raise ScenarioError(f"policy {text!r}: {key} takes numbers joined by '/', got {value!r}") from None
            params[key] = value
    return name.strip(), params


def make_policy(name: str, **params: Any) -> Scheduler:
    """Build a registered scheduler by name (``NAME:KEY=VALUE,...`` also sets parameters).

    Unknown names get a did-you-mean error; bad parameters one line naming the policy.
    """
    label = None
    if ":" in name:
        label = name.strip()  # reports tell the variants apart
        name, parsed = parse_policy_string(name)
        params = {**parsed, **params}
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=2)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ScenarioError(f"unknown policy {name!r}{hint} (known: {', '.join(sorted(_REGISTRY))})")
    cls = _REGISTRY[name][0]
    try:
        sched: Scheduler = cls(**params)
        if label is not None:
            sched.name = label
        return sched
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"bad parameters for policy {name!r}: {exc}") from None
