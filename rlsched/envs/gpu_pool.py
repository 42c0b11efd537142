"""``rlsched/GpuPool-v0``: a Gymnasium environment over the discrete-event engine.

The environment is a thin shell: all simulation happens in
:class:`~rlsched.sim.engine.Engine` (``advance`` / ``apply``), all encoding in
:class:`~rlsched.envs.codec.ObservationCodec`. What lives here is only the episode
bookkeeping (which jobs, which seed), the reward, and the auto-advance loop that
skips states where waiting is the only legal action.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlsched.cluster.decisions import Place, Preempt, Reconfigure, Scale
from rlsched.cluster.job import Job
from rlsched.envs.codec import ObservationCodec
from rlsched.envs.trained_actions import TrainedActions
from rlsched.policies.rules import RuleParams, build_rules, owned_actions, run_rules
from rlsched.scenario import Scenario, load_scenario
from rlsched.sim.engine import Engine
from rlsched.workload.forecast import DemandForecaster, fresh_forecaster

#: Default reward weights; see the class docstring (Rewards) for units.
DEFAULT_REWARD_WEIGHTS: dict[str, float] = {
    "jct": 1.0,
    "cost": 0.1,
    "wait": 0.0,
    "utilization": 0.0,
    "preemption": 1.0,
    "deadline": 10.0,
    "invalid": 0.1,
}
#: Rewards are divided by this many job-hours so a step's reward is O(0.01..1).
REWARD_SCALE_JOB_HOURS = 10.0
_DAY_S = 86400.0


#: Job-hours charged for each job left stranded (never placed) or unfinished at the horizon.
STRANDED_PENALTY_H = 100.0
_STRANDED_PREFIXES = ("never placed", "unfinished at the simulation horizon")


def episode_slice(jobs: Sequence[Job], n: int | None, rng: np.random.Generator) -> tuple[list[Job], float]:
    """A random run of ``n`` consecutive jobs of ``jobs`` (sorted by submission) and the shift applied.

    The run is moved back by whole days (its first submission's day becomes day 0) so the
    time-of-day signals of the trace survive; the shift is returned so a forecaster can be
    moved with it. ``n`` None (or at least the trace's length): every job, unshifted.
    """
    if n is None or n >= len(jobs):
        return list(jobs), 0.0
    start = int(rng.integers(0, len(jobs) - n + 1))
    part = list(jobs[start: start + n])
    shift = math.floor(part[0].submit_time / _DAY_S) * _DAY_S
    if shift == 0.0:
        return part, 0.0
    return [replace(j, submit_time=j.submit_time - shift,
                    deadline=None if j.deadline is None else j.deadline - shift) for j in part], shift


class GpuPoolEnv(gym.Env[dict[str, Any], np.int64]):
    """Schedule a GPU cluster (on-prem, MIG, spot and on-demand pools) replaying a real trace.

    ## Description

    A learning agent takes the scheduler's seat in rlsched's discrete-event
    simulator. At each decision point it sees the head of the queue, the pools and
    a few global signals, and either places a job, reconfigures a MIG GPU, scales
    an elastic pool by one node, or waits for the next event. Several decisions
    may be taken at one simulated instant; time only moves on *wait*. The
    objective is the mean job completion time (as in DeepRM and Decima), traded
    off against the money spent on elastic capacity.

    ## Action Space

    ``Discrete(K*P + P*L + 2*P + 1)`` with K = ``window`` job slots, P =
    ``max_pools`` pool slots and L = 6 MIG layouts (``all-1g``, ``all-2g``,
    ``all-3g``, ``balanced``, ``mixed-4-3``, ``all-7g``):

    * ``k*P + p``: place job slot ``k`` in pool ``p`` (best fit inside the pool);
    * ``K*P + p*L + l``: reconfigure an idle GPU of MIG pool ``p`` (least-loaded node first)
      to layout ``l``;
    * ``K*P + P*L + 2*p`` / ``+1``: scale pool ``p`` up / down by one node;
    * ``K*P + P*L + 2*P + r``: preempt running slot ``r`` (only with ``preempt_slots`` R > 0;
      graceful and checkpointed, legal only while some window job is blocked);
    * ``K*P + P*L + 2*P + R``: wait.

    :meth:`action_masks` gives the legal actions (the codec's mask, from the
    feasibility module); use ``sb3_contrib.MaskablePPO`` or mask logits yourself.
    The mask is work-conserving except for on-demand capacity: waiting is legal only
    when no window job fits an on-prem or spot pool (so on-demand nodes bought for a
    burst can drain), and never when no event is pending while another action is
    legal (waiting would strand the queue). An illegal action is refused by the
    engine, counted in ``info["refused"]`` and penalised.

    ## Observation Space

    A ``Dict`` (see :class:`~rlsched.envs.codec.ObservationCodec` for every column):

    * ``jobs`` ``(K, 12 + P)``: per job slot (the K/2 oldest queued jobs, then the
      K - K/2 others with the shortest estimated duration): presence, size, fraction,
      whether fractional, estimated duration (the online estimator, never the true
      duration), wait, priority, preemptible, deadline slack, attained service,
      restarts, checkpoint age, and whether it can be placed in each pool now. With
      N ``nominators`` the slots hold each nominator's next jobs that fit instead, and
      N + 1 columns follow: each nominator's rank for the slot and the user's GPU share
      (:mod:`rlsched.envs.nominate`);
    * ``pools`` ``(P, 19)``: presence, kind, sharing, nodes held/ready/provisioning,
      free GPUs and MIG compute, price and on-demand price, spot headroom, reclaim
      rate, whether it can scale up/down, and the GPU-hours of work at risk of a reclaim;
    * ``globals`` ``(8,)``: queue length, GPUs queued beyond the window, running jobs,
      utilisation, time of day (sine and cosine), demand signal and cost rate;
    * ``running`` ``(R, 8)``, only with ``preempt_slots`` R > 0: the R preemptible running
      jobs with the most attained GPU service: presence, size, attained GPU-hours,
      believed remaining hours, hours since start, checkpoint age, restarts, the user's
      GPU share.

    ## Rewards

    Each step returns minus a weighted sum, divided by
    ``REWARD_SCALE_JOB_HOURS`` (10), of what happened in the simulated time the
    step covered (``reward_weights`` keys, defaults in brackets):

    * ``jct`` [1.0] per job-hour spent in the system (queued or running): the
      integral of the number of jobs in the system, whose episode total is the
      sum of completion times, so maximising return minimises mean JCT;
    * ``cost`` [0.1] per USD spent on capacity (so 10 USD weigh as one job-hour);
    * ``wait`` [0.0] per job-hour spent queued (on top of ``jct``);
    * ``utilization`` [0.0] per idle ready GPU-hour;
    * ``preemption`` [1.0] per preemption plus per GPU-hour of work lost to it;
    * ``deadline`` [10.0] per job that misses its deadline (counted when the
      deadline passes with the job unfinished);
    * ``invalid`` [0.1] per action the engine refused.

    A job left stranded (never placed, or unfinished at the simulation horizon)
    counts as ``STRANDED_PENALTY_H`` (100) job-hours in the ``jct`` term, so ending
    an episode with jobs left behind is never cheaper than serving them.

    ``info`` carries the raw components (``reward_components``), the simulated
    time since the start (``sim_time``), refusals and auto-advances.

    ## Starting State

    A fresh engine over the scenario's jobs (or, with ``episode_jobs``, a random
    contiguous window of that many jobs chosen with the reset seed, shifted back
    by whole days so that the time of day is kept), with the simulation seed drawn
    from the reset seed, advanced to the first state where an action other than
    wait is legal.

    ## Episode End

    Terminated when every job has finished (or can never run); truncated after
    ``max_steps`` steps if set.

    ## Arguments

    * ``scenario``: a :class:`~rlsched.scenario.Scenario`, a YAML path, a
      ``bundled:NAME``, a scenario dict, or None for the bundled default.
    * ``window`` (16) / ``max_pools`` (4): job and pool slots; pools beyond
      ``max_pools`` in declared order are not controllable.
    * ``episode_jobs``: jobs per episode (random window); None = all.
    * ``reward_weights``: overrides of the weights above.
    * ``max_steps``: truncation limit; None = none.
    * ``render_mode``: None or ``"ansi"`` (a one-line text summary).
    * ``forecaster``: a *fitted* demand forecaster (see :mod:`rlsched.workload.forecast`);
      each episode's engine gets a fresh copy (clock shifted with the episode), whose
      forecast total is the ``globals`` demand signal and drives forecast-aware
      autoscaling. None: the engine's recent arrival rate is the demand signal.
    * ``forecast_horizon_s`` (3600): the forecast horizon.
    * ``rules``: ``{rule name: constructor arguments}`` of the rules the agent is
      trained behind (:mod:`rlsched.policies.rules`: ``deadline_guard``,
      ``consolidate``, ``preempt_long``), or None (none). They act after every advance
      of time, before the agent sees the state - urgent deadline jobs are placed on
      safe capacity, lightly used elastic nodes are emptied and released, much longer
      jobs are suspended for blocked short ones - as they do at serving time for a
      model saved with the same rules. The action kinds a rule owns (``mig_resplit``: MIG
      re-splits) are masked for the agent.
    * ``nominators``: heuristics whose next jobs fill the job slots
      (:mod:`rlsched.envs.nominate`); empty: the head and the shortest of the queue.
    * ``preempt_slots`` (0): running slots R the agent may preempt (the codec's option;
      0 keeps the observation and action layout without them).
    * ``extra_globals`` (none): optional global features (the codec's option, e.g.
      ``estimate_log_error``).
    * ``anchor`` (None): a codec-space teacher whose legal choice the observation carries as a
      one-hot ``anchor`` array (the codec's option; None keeps the layout without it).

    ## Version History

    * v0: the only version. The observation and action layout is versioned by the
      codec (``CODEC_VERSION`` in :mod:`rlsched.envs.codec`, part of
      ``ObservationCodec.signature``), which a model records and serving checks.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        scenario: Scenario | str | Path | dict[str, Any] | None = None,
        *,
        window: int = 16,
        max_pools: int = 4,
        episode_jobs: int | None = None,
        reward_weights: dict[str, float] | None = None,
        max_steps: int | None = None,
        render_mode: str | None = None,
        forecaster: DemandForecaster | None = None,
        forecast_horizon_s: float = 3600.0,
        rules: RuleParams | None = None,
        nominators: Sequence[str] = (),
        preempt_slots: int = 0,
        extra_globals: Sequence[str] = (),
        anchor: str | None = None,
    ) -> None:
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if not self.scenario.jobs:
            raise ValueError(f"scenario {self.scenario.name!r} has no jobs")
        if episode_jobs is not None and episode_jobs < 1:
            raise ValueError(f"episode_jobs must be >= 1, got {episode_jobs}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}")
        weights = dict(DEFAULT_REWARD_WEIGHTS)
        for k, v in (reward_weights or {}).items():
            if k not in weights:
                raise ValueError(f"unknown reward weight {k!r} (known: {', '.join(weights)})")
            weights[k] = float(v)
        self.reward_weights = weights
        self.forecaster = forecaster
        self.forecast_horizon_s = forecast_horizon_s
        self.rules = build_rules(rules)
        self._shift = 0.0
        self.episode_jobs = episode_jobs
        self.max_steps = max_steps
        self.render_mode = render_mode
        # the actions a rule owns (MIG re-splits under mig_resplit) are masked: the rule takes them
        trained = TrainedActions.behind_rules(owned_actions(rules), "training")
        self.codec = ObservationCodec(window=window, max_pools=max_pools, nominators=nominators,
                                      preempt_slots=preempt_slots, extra_globals=extra_globals
                                      ).anchor_to(anchor).restrict(trained)
        self.observation_space = self.codec.observation_space
        self.action_space = self.codec.action_space
        self._jobs_sorted = sorted(self.scenario.jobs, key=lambda j: j.submit_time)
        self._engine: Engine | None = None
        self._mask: np.ndarray = np.zeros(self.codec.n_actions, dtype=bool)
        self._mask[self.codec.wait_action] = True

    # ------------------------------------------------------------------ episode
    def _episode_jobs(self) -> list[Job]:
        jobs, self._shift = episode_slice(self._jobs_sorted, self.episode_jobs, self.np_random)
        return jobs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode; the same seed gives the same jobs, events and observations."""
        super().reset(seed=seed)
        jobs = self._episode_jobs()
        sim_seed = int(self.np_random.integers(0, 2**31 - 1))
        sc = self.scenario
        fc = fresh_forecaster(self.forecaster, self._shift) if self.forecaster is not None else None
        eng = Engine(sc.pools, jobs, sc.market, replace(sc.sim, seed=sim_seed), forecaster=fc,
                     forecast_horizon_s=self.forecast_horizon_s)
        self._engine = eng
        self._t_start = eng.now
        self._steps = 0
        self._refused = 0
        self._cost = eng.cost_so_far()
        self._preemptions = 0
        self._stranded = 0
        self._lost_gpu_s = 0.0
        self._deadlines = sorted((j.deadline, j.job_id) for j in jobs if j.deadline is not None)
        self._next_deadline = 0
        self.codec.track(eng.state)
        for rule in self.rules:
            rule.reset(eng.state)
        self._acc = self._zero_components()
        self._auto = 0
        self._advance()
        self._mask = self._auto_advance()
        obs = self.codec.encode(eng.state)
        return obs, self._info(self._zero_components(), 0, False)

    @staticmethod
    def _zero_components() -> dict[str, float]:
        return {"job_hours": 0.0, "queued_job_hours": 0.0, "idle_gpu_hours": 0.0, "cost_usd": 0.0,
                "preemptions": 0.0, "lost_gpu_hours": 0.0, "deadline_misses": 0.0, "invalid": 0.0}

    def _advance(self) -> bool:
        """One engine batch, accumulating the reward integrals over the time it covers."""
        eng = self._engine
        assert eng is not None
        st = eng.state
        acc = self._acc
        t0 = eng.now
        n_queue = len(st.queue)
        n_sys = n_queue + len(st.running)
        idle0 = eng._cap_area - eng._util_area
        moved = eng.advance()
        if moved:
            for decision in run_rules(self.rules, st):
                eng.apply(decision)
        self.codec.invalidate(None)
        dt = eng.now - t0
        if dt > 0:
            acc["job_hours"] += n_sys * dt / 3600.0
            acc["queued_job_hours"] += n_queue * dt / 3600.0
            acc["idle_gpu_hours"] += (eng._cap_area - eng._util_area - idle0) / 3600.0
            cost = eng.cost_so_far()
            acc["cost_usd"] += cost - self._cost
            self._cost = cost
        stranded = sum(n for reason, n in eng.unschedulable.items() if reason.startswith(_STRANDED_PREFIXES))
        if stranded > self._stranded:
            # Jobs the policy left to strand count as if each stayed in the system this long.
            acc["job_hours"] += (stranded - self._stranded) * STRANDED_PENALTY_H
            self._stranded = stranded
        self._count_preemptions(acc)
        dls = self._deadlines
        i = self._next_deadline
        if i < len(dls) and (dls[i][0] < eng.now or not moved):
            runs = eng.runs
            end = not moved
            while i < len(dls) and (dls[i][0] < eng.now or end):
                dl, jid = dls[i]
                run = runs.get(jid)
                if run is None or run.finish_time is None or run.finish_time > dl + 1e-9:
                    acc["deadline_misses"] += 1.0
                i += 1
            self._next_deadline = i
        return moved

    def _count_preemptions(self, acc: dict[str, float]) -> None:
        """Add the preemptions (and the work they lost) since the last count to ``acc``."""
        eng = self._engine
        assert eng is not None
        if eng.preemptions != self._preemptions:
            lost = sum(r.lost_gpu_seconds for r in eng.runs.values())
            acc["preemptions"] += eng.preemptions - self._preemptions
            acc["lost_gpu_hours"] += (lost - self._lost_gpu_s) / 3600.0
            self._preemptions = eng.preemptions
            self._lost_gpu_s = lost

    def _auto_advance(self) -> np.ndarray:
        """Advance while waiting is the only legal action; returns the mask of the state reached."""
        eng = self._engine
        assert eng is not None
        codec = self.codec
        st = eng.state
        while not eng.done and codec.only_wait(st):
            if not self._advance():
                break
            self._auto += 1
        # Waiting with nothing left to happen would strand the queue and end the episode
        # early - a reward hack (the jobs leave the system unpunished). When no event is
        # pending and something else is legal, waiting is not; nor is buying beyond the
        # queue (the codec's rules, which the served loop uses too).
        return codec.mask(st) if eng.done else codec.legal(st)

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply one action (or wait), then auto-advance past wait-only states."""
        eng = self._engine
        if eng is None:
            raise RuntimeError("call reset() before step()")
        codec = self.codec
        self._acc = acc = self._zero_components()
        self._auto = 0
        decision = codec.decode(int(action), eng.state)
        refused = False
        if decision is None:
            if not eng.done:
                self._advance()
        else:
            # the pool a preemption frees (read before the engine clears the placement)
            victim = eng.state.running.get(decision.job_id) if isinstance(decision, Preempt) else None
            freed = victim.placement.pool if victim is not None and victim.placement is not None else None
            reason = eng.apply(decision)
            if reason is not None:
                refused = True
                self._refused += 1
                acc["invalid"] += 1.0
            else:
                if isinstance(decision, Preempt):
                    self._count_preemptions(acc)  # the policy's own preemptions are penalised like any
                    pool = freed
                elif isinstance(decision, (Place, Scale)):
                    pool = decision.placement.pool if isinstance(decision, Place) else decision.pool
                else:
                    assert isinstance(decision, Reconfigure)
                    pool = eng.state.nodes[decision.node_id].pool
                codec.invalidate(pool)
        self._mask = self._auto_advance()
        self._steps += 1
        terminated = eng.done
        if terminated:
            self._advance()  # settles deadlines of jobs that can never finish
        truncated = not terminated and self.max_steps is not None and self._steps >= self.max_steps
        w = self.reward_weights
        penalty = (
            w["jct"] * acc["job_hours"]
            + w["wait"] * acc["queued_job_hours"]
            + w["utilization"] * acc["idle_gpu_hours"]
            + w["cost"] * acc["cost_usd"]
            + w["preemption"] * (acc["preemptions"] + acc["lost_gpu_hours"])
            + w["deadline"] * acc["deadline_misses"]
            + w["invalid"] * acc["invalid"]
        )
        reward = -penalty / REWARD_SCALE_JOB_HOURS
        obs = codec.encode(eng.state)
        info = self._info(acc, self._auto, refused)
        if terminated:
            rep = eng.report("rl", 0.0)
            info["report"] = {
                "mean_jct_s": rep.mean_jct_s, "p95_jct_s": rep.p95_jct_s, "mean_wait_s": rep.mean_wait_s,
                "cost_usd": rep.cost_usd, "gpu_utilization": rep.gpu_utilization,
                "jobs_completed": rep.jobs_completed, "jobs_unschedulable": rep.jobs_unschedulable,
                "deadline_misses": rep.deadline_misses, "preemptions": rep.preemptions,
            }
        return obs, float(reward), terminated, truncated, info

    def _info(self, comps: dict[str, float], auto: int, refused: bool) -> dict[str, Any]:
        eng = self._engine
        assert eng is not None
        return {
            "sim_time": eng.now - self._t_start,
            "reward_components": comps,
            "refused": self._refused,
            "illegal_action": refused,
            "auto_advances": auto,
            "queue_length": len(eng.state.queue),
            "running": len(eng.state.running),
        }

    def static_inputs(self) -> list[Any]:
        """What no step changes (the scenario, its sorted jobs, the fitted forecaster template): a copy of
        the environment for a lookahead can share these instead of copying them."""
        return [x for x in (self.scenario, self._jobs_sorted, self.forecaster) if x is not None]

    def action_masks(self) -> np.ndarray:
        """Legal actions now (for ``sb3_contrib.MaskablePPO``).

        The codec's mask, except that waiting is illegal when no event is pending and
        another action is legal (waiting would strand the queue).
        """
        return self._mask.copy()

    @property
    def engine(self) -> Engine:
        """The engine of the current episode (read it, do not drive it)."""
        if self._engine is None:
            raise RuntimeError("call reset() first")
        return self._engine

    def render(self) -> str | None:
        """A one-line text summary in ``ansi`` mode."""
        if self.render_mode != "ansi" or self._engine is None:
            return None
        eng = self._engine
        st = eng.state
        return (f"t={eng.now - self._t_start:,.0f}s queue={len(st.queue)} running={len(st.running)} "
                f"allocated={st.allocated:.1f} cost=${self._cost:,.2f} refused={self._refused}")
