"""History retention: removing finished jobs (rows, log and exit files) and old decision records.

The sweep runs in a background thread of its own (:meth:`HistoryRetention.run`), in batches of
:data:`RETENTION_BATCH` jobs, each its own short store transaction, with a pause in between, and takes the
scheduling lock only to adjust the mirror's finished-job counts: scheduling and submissions go on while a
long history is swept. The audit trail is append-only and never swept.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from rlsched.service.context import LOG, ServiceContext
from rlsched.service.mirror import JobMirror

#: History retention: first sweep this long after the start, jobs deleted per transaction, pause in between.
RETENTION_FIRST_S = 10.0
RETENTION_BATCH = 500
RETENTION_PAUSE_S = 0.02


def remove_files(paths: list[str]) -> None:
    """Remove a pruned job's files, listed earlier in the sweep.

    A job's exit file may have been renamed ``*.seen`` since the listing: the settle that recorded the job
    marks its exit files seen just after its commit, and the sweep may pick the job up in between. The
    rename happens at most once, so the file is under one of the two names, and removing the first that
    exists leaves neither (a left-over ``.seen`` file would outlive its job for good).
    """
    for path in paths:
        for name in (path, path + ".seen"):
            try:
                os.unlink(name)
            except FileNotFoundError:
                continue
            break


class HistoryRetention:
    """Sweeps the history past the configured age and count (see the module doc)."""

    def __init__(self, ctx: ServiceContext, mirror: JobMirror, log_dir: Path) -> None:
        self.ctx = ctx
        self.mirror = mirror
        self.log_dir = log_dir

    @property
    def enabled(self) -> bool:
        """Whether the configuration limits history at all."""
        cfg = self.ctx.config
        return cfg.history_max_age_s is not None or cfg.history_max_jobs is not None

    def run(self) -> None:
        """Sweep old history now and then until the service stops (the retention thread's body)."""
        wait = min(RETENTION_FIRST_S, self.ctx.config.retention_every_s)
        while not self.ctx.stopping.wait(wait):
            try:
                self.prune(background=True)
            except Exception as exc:
                self.ctx.loop_error("retention", exc)
            wait = self.ctx.config.retention_every_s

    def prune(self, now: float | None = None, *, background: bool = False) -> dict[str, int]:
        """Remove finished jobs past the retention settings (rows, log and exit files) and old decision records.

        ``background``: the sweep of the retention thread, which ends early when the service stops.
        Returns ``{"jobs": N, "decisions": M}``.
        """
        cfg, store, stopping = self.ctx.config, self.ctx.store, self.ctx.stopping
        if cfg.history_max_age_s is None and cfg.history_max_jobs is None:
            return {"jobs": 0, "decisions": 0}
        now = self.ctx.clock() if now is None else now
        before = None if cfg.history_max_age_s is None else now - cfg.history_max_age_s
        removed = decisions = 0
        exit_files: dict[str, list[str]] | None = None
        while not (background and stopping.is_set()):
            batch = store.prune_finished(finished_before=before, keep=cfg.history_max_jobs, limit=RETENTION_BATCH)
            if not batch:
                break
            if exit_files is None:  # one directory listing per sweep, not one per job
                exit_files = {}
                with contextlib.suppress(OSError), os.scandir(self.log_dir) as it:
                    for entry in it:
                        if ".exit.json" in entry.name:
                            exit_files.setdefault(entry.name.split(".", 1)[0], []).append(entry.path)
            # the counts first, the files after: once a job's files are gone, info() no longer counts it
            with self.ctx.lock:
                for job in batch:
                    self.mirror.forget_finished(job.state)
            for job in batch:
                remove_files([job.log_path or str(self.log_dir / f"{job.id}.log"), *exit_files.get(job.id, ())])
            removed += len(batch)
            time.sleep(RETENTION_PAUSE_S)
        if before is not None:
            while not (background and stopping.is_set()):
                n = store.prune_decisions(before, limit=RETENTION_BATCH)
                decisions += n
                if n < RETENTION_BATCH:
                    break
                time.sleep(RETENTION_PAUSE_S)
        if removed or decisions:
            LOG.info("retention: removed %d finished job(s) and %d decision record(s)", removed, decisions)
        return {"jobs": removed, "decisions": decisions}
