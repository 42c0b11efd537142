"""The policy the service serves: the spec, its chosen policy block, and the guarded scheduler built from it.

:class:`ServedPolicy` owns what a reload swaps. The spec is loaded outside the scheduling lock (a large one
can take seconds; :attr:`ServedPolicy.reload_lock` serialises reloads) and installed under it. The block's
scheduler runs behind :class:`~rlsched.runtime.fallback.FallbackScheduler` with the block's fallback heuristic,
unless the service runs in fallback-only mode (the heuristic alone) - see
:class:`~rlsched.service.config.ServiceMode`.

MIG layouts are the spec's (plan/apply): the heuristics never re-split a GPU on their own; only a policy
that emits ``Reconfigure`` changes them. A served model's node consolidation (a rule that empties nodes to
release them) is left out, since this service does not scale pools; its other rules run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlsched.cluster.scheduler import Scheduler
from rlsched.errors import RlschedError
from rlsched.policies.registry import make_policy
from rlsched.runtime.fallback import FallbackConfig, FallbackScheduler
from rlsched.runtime.store import Store
from rlsched.service.config import ServiceConfig, ServiceMode
from rlsched.spec.model import PolicyDecl, Spec

_DEFAULT_POLICY = PolicyDecl(name="default", scheduler="weighted-priority", fallback="weighted-priority")


class ServiceError(RlschedError):
    """The service cannot do what was asked (bad policy name, no backend...)."""


def load_spec_policy(config: ServiceConfig, paths: list[Path], policy: str | None) -> tuple[Spec, PolicyDecl]:
    """Load the spec at ``paths`` and pick its policy block (``policy``, else the only one, else ``default``).

    Raises:
        SpecError: the spec does not load.
        ServiceError: no such block, or several and none chosen.
    """
    from rlsched.spec.loader import load_spec

    spec = load_spec([Path(p) for p in paths], var_args=config.var_args())
    if policy is not None:
        if policy not in spec.policies:
            known = ", ".join(sorted(spec.policies)) or "none"
            raise ServiceError(f"the spec has no policy block {policy!r} (declared: {known})")
        return spec, spec.policies[policy]
    if len(spec.policies) == 1:
        return spec, next(iter(spec.policies.values()))
    if "default" in spec.policies:
        return spec, spec.policies["default"]
    if spec.policies:
        known = ", ".join(sorted(spec.policies))
        raise ServiceError(f"the spec declares several policy blocks ({known}); choose one")
    return spec, _DEFAULT_POLICY


def heuristic(name: str, weights: dict[str, float]) -> Scheduler:
    """The heuristic ``name`` with the block's weights, never re-splitting MIG GPUs on its own."""
    params: dict[str, Any] = {}
    if name == "weighted-priority":
        if "priority" in weights:
            params["w_priority"] = float(weights["priority"])
        if "wait" in weights:
            params["w_wait"] = float(weights["wait"])
    sched = make_policy(name, **params)
    if hasattr(sched, "mig_reconfigure"):
        # MIG layouts are the spec's (plan/apply): the heuristics never re-split a GPU on their own
        # (their dynamic re-splitting was written for the simulator, where a reconfiguration is free to
        # retry and no operator expects the declared layout). A policy that emits Reconfigure still may
        # (see rlsched.service.reconfigure).
        sched.mig_reconfigure = False
    return sched


class ServedPolicy:
    """The spec, the served policy block and its scheduler (see the module doc).

    Args:
        config: the service's configuration (spec paths and mode).
        store: where the fallback guard audits its fallbacks.
        spec, decl: the loaded spec and its chosen block (:func:`load_spec_policy`).
    """

    def __init__(self, config: ServiceConfig, store: Store, spec: Spec, decl: PolicyDecl) -> None:
        self.config = config
        self.store = store
        #: serialises reloads, which load the spec *outside* the scheduling lock
        self.reload_lock = threading.Lock()
        self.spec, self.decl = spec, decl
        self.sched: Scheduler
        self.guard: FallbackScheduler | None
        self.sched, self.guard = self.build(decl)
        #: the scheduler is reset before its next decision (a new one, or a new spec)
        self.needs_reset = True

    def load(self, paths: list[Path], policy: str | None) -> tuple[Spec, PolicyDecl]:
        """Load a spec and pick its block (see :func:`load_spec_policy`)."""
        return load_spec_policy(self.config, paths, policy)

    def _model_ref(self, model: str) -> str:
        if model.startswith("models:/") or Path(model).is_absolute():
            return model
        for base in self.config.spec_paths:
            root = base if base.is_dir() else base.parent
            cand = root / model
            if cand.exists():
                return str(cand)
        return model

    def build(self, decl: PolicyDecl) -> tuple[Scheduler, FallbackScheduler | None]:
        """The scheduler serving ``decl`` and its guard (None in fallback-only mode)."""
        fallback = heuristic(decl.fallback, decl.weights)
        if self.config.mode is ServiceMode.FALLBACK_ONLY:
            return fallback, None
        budget = self.config.max_decision_latency_s or decl.health.max_decision_latency_s
        guard_cfg = FallbackConfig(latency_budget_s=budget, shadow=self.config.mode is ServiceMode.SHADOW)
        primary: Scheduler | Callable[[], Scheduler]
        if decl.scheduler == "rl":
            ref = self._model_ref(decl.model or "")
            label = f"rl:{decl.model}"

            def load() -> Scheduler:
                from rlsched.learned.ppo import make_ppo_policy  # torch only when a model is served
                from rlsched.train.registry import download_model

                sched = make_ppo_policy(ref, name=label, fetch=download_model)
                # This service does not scale pools (plan/apply does), so a rule whose moves only pay
                # when the node they empty is released (node consolidation) would restart jobs for
                # nothing - and, the node never going away, move them again at the next pass.
                sched.rules = [r for r in sched.rules if not r.releases_nodes]
                if sched.complement is not None:
                    # the heuristic taking what the model was not trained with: layouts stay the spec's
                    sched.complement.heuristic.mig_reconfigure = False
                return sched

            primary = load
        else:
            primary = heuristic(decl.scheduler, decl.weights)
            label = decl.scheduler
        guard = FallbackScheduler(primary, fallback, guard_cfg, audit=self.store.audit_sink(),
                                  name=f"guarded:{label}>{fallback.name}")
        return guard, guard

    def label(self) -> str:
        """The served scheduler's name (the fallback's in fallback-only mode)."""
        return self.decl.fallback if self.guard is None else str(self.sched.name)

    def primary_label(self) -> str:
        """The name decisions of the guarded primary are recorded under."""
        primary = self.guard.primary if self.guard is not None else None
        return str(getattr(primary, "name", "") or self.decl.scheduler)

    def serves_model(self) -> bool:
        """Whether a model is (or may be) deciding: an ``rl`` block not in fallback-only mode."""
        return self.decl.scheduler == "rl" and self.config.mode is not ServiceMode.FALLBACK_ONLY

    def install(self, spec: Spec, decl: PolicyDecl) -> str:
        """Swap in a loaded spec and block (under the scheduling lock); returns the model version kept
        serving when the new block's model did not load ("" otherwise)."""
        sched, guard = self.build(decl)
        kept = ""
        old_guard = self.guard
        if guard is not None and old_guard is not None and decl.scheduler == "rl" and guard.keep_serving(old_guard):
            # The new model did not load (registry down, file missing...): the working one stays.
            kept = old_guard.model_version or str(old_guard.primary and old_guard.primary.name)
        self.spec, self.decl, self.sched, self.guard = spec, decl, sched, guard
        self.needs_reset = True
        return kept
