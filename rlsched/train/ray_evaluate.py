"""A training run's final evaluation with each window replayed as a Ray task (``rlsched train --ray``).

:func:`evaluate_on_ray` gives :func:`rlsched.train.evaluate.evaluate`'s result: every evaluation
window is one Ray task that replays it under the trained policy, every heuristic, the extra rows
(teacher, ``NAME+rules``) and the bound, exactly as ``evaluate`` does for that window in this
process; the rows are then summarised by the same code. The policy travels as its loaded
:class:`~rlsched.learned.ppo.PolicyModel` (network, codec settings, rules, trained actions), not as
the live trainer, so a task holds no reference to the learner or its environments.

``ray`` is imported only inside :func:`evaluate_on_ray`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from rlsched.errors import RlschedError
from rlsched.train.evaluate import evaluate, summarise_worlds
from rlsched.train.worlds import World


def _window_row(world: World, model: Any, heuristics: Sequence[str] | None, bound: bool,
                extra: Sequence[Callable[[], Any]]) -> dict[str, dict[str, float]]:
    """One window's row of :func:`~rlsched.train.evaluate.evaluate` (runs as a Ray task)."""
    from rlsched.learned.ppo import PpoScheduler

    policy = functools.partial(PpoScheduler, model) if model is not None else None
    result = evaluate([world], policy, heuristics=heuristics, bound=bound, extra=extra)
    row: dict[str, dict[str, float]] = result["worlds"][world.label]
    return row


def evaluate_on_ray(
    address: str,
    worlds: Sequence[World],
    model: Any,
    *,
    bound: bool = False,
    extra: Sequence[Callable[[], Any]] = (),
) -> dict[str, Any]:
    """``evaluate(worlds, PpoScheduler(model), bound=bound, extra=extra)`` with one Ray task per window.

    ``model`` is a :class:`~rlsched.learned.ppo.PolicyModel` (None: heuristics only).

    Raises:
        RlschedError: a window's replay failed on the cluster (one line: which window, why).
    """
    import ray

    from rlsched.ray_connect import connect

    connect(address)
    model_ref = ray.put(model)
    extra_ref = ray.put(tuple(extra))
    remote: Any = ray.remote(_window_row).options(num_cpus=1, max_retries=0)
    refs = [remote.remote(w, model_ref, None, bound, extra_ref) for w in worlds]
    per_world: dict[str, dict[str, dict[str, float]]] = {}
    for n, (world, ref) in enumerate(zip(worlds, refs, strict=True)):
        try:
            per_world[world.label] = ray.get(ref)
        except ray.exceptions.RayError as exc:
            for later in refs[n + 1:]:  # only tasks not yet collected: cancelling a finished one trips Ray
                ray.cancel(later)
            cause = getattr(exc, "cause", None) or exc
            lines = [ln for ln in str(cause).strip().splitlines() if ln.strip()]
            raise RlschedError(f"evaluation of {world.label} failed on Ray: "
                               f"{lines[-1] if lines else type(cause).__name__}") from None
    return summarise_worlds(per_world)
