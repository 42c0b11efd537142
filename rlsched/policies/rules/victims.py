"""Choosing which running jobs to suspend to make room: shared by every rule that preempts.

A candidate victim is ``(run, merit)``: ``merit`` is what makes it a better victim among
equals - the deadline guard passes a victim's slack, long-job preemption its believed
remaining time (both: more is better, it can afford the wait more easily).
"""

from __future__ import annotations

from rlsched.cluster.model import JobRun

__all__ = ["fewest_gpus", "held_gpus"]


def held_gpus(v: tuple[JobRun, float]) -> int:
    """Whole GPUs a victim ``(run, merit)`` holds."""
    return len(v[0].placement.gpus) if v[0].placement is not None else 0


def fewest_gpus(eligible: list[tuple[JobRun, float]], deficit: int) -> list[tuple[JobRun, float]]:
    """Victims ``(run, merit)`` whose GPUs cover ``deficit``; empty when all of them together fall short.

    One victim that covers it alone if any (fewest GPUs, then most merit); otherwise the
    largest first (most merit on ties) until covered - greedy, so it may suspend a GPU
    or two more than the least possible subset would, in exchange for a linear pass
    over a pool's running jobs. A ``deficit`` <= 0 (enough GPUs free, the room short of
    CPU or memory) takes the smallest victim.
    """
    single = [v for v in eligible if held_gpus(v) >= deficit]
    if single:
        return [min(single, key=lambda v: (held_gpus(v), -v[1]))]
    chosen: list[tuple[JobRun, float]] = []
    covered = 0
    for v in sorted(eligible, key=lambda v: (-held_gpus(v), -v[1])):
        chosen.append(v)
        covered += held_gpus(v)
        if covered >= deficit:
            return chosen
    return []
