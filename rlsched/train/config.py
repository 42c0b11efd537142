"""Experiment files for ``rlsched train``: a strict, documented schema.

An experiment names what to train on and how (keys not listed are errors with a
"did you mean")::

    name: default                       # run and model folder name
    description: ...
    scenarios:                          # training worlds; each is sampled per episode
      - name: philly
        scenario: ../envs/philly-onprem.yaml   # a scenario file (or an inline mapping)
        train_window_h: [0, 1500]       # hours from the trace start used for training
        eval_windows_h: [[1700, 1800]]  # evaluation windows: never overlap training
        clusters: ["8x8xV100-16GB"]     # optional variants of the cluster (sizes, shapes)
        load_factors: [0.8, 1.0]        # optional arrival rescaling per variant
        market_offsets_h: [0, 2000]     # optional price periods (hours into the market series)
    holdout: []                         # like scenarios, evaluation only: unseen shapes
    episode_jobs: 400                   # jobs per training episode (a random window)
    eval_max_jobs: 2000                 # cap per evaluation window
    reward: {jct: 1.0, cost: 0.1}       # GpuPoolEnv reward weights
    ppo: {learning_rate: 3e-4, n_steps: 512, batch_size: 256, n_epochs: 4, gamma: 0.999, ...}
    network: {hidden: 64}
    window: 16                          # job slots K of the codec
    nominators: [fifo, weighted-priority, sjf, fair-share]  # optional: slots hold what each would run next
    preempt_slots: 0                    # optional: running slots R the policy may preempt (0: no preempt actions)
    extra_globals: [estimate_log_error] # optional global features (rlsched.envs.codec.OPTIONAL_GLOBALS)
    anchor: sjf-spot-first              # optional: the network adds a fixed weight to this teacher's choice
    max_pools: 4
    n_envs: 2
    vec_env: subproc                    # subproc | dummy
    total_steps: 200000
    seed: 0
    bc: {steps: 20000, epochs: 5, teacher: sjf}  # behaviour-cloning warm start (0 steps = off);
                                        # keep: 0.5 keeps an annealed imitation loss during PPO;
                                        # teacher: lookahead labels states by rollouts of the follow
                                        # teachers (candidates, label_every, label_horizon_s, label_margin)
    eval_every_steps: 50000
    checkpoint_every_steps: 25000
    mlflow: {experiment: rlsched, registered_model: rlsched-ppo}
    forecast: {model: smoothed-seasonal, horizon_s: 3600}   # demand forecaster (model: none = off)
    deadline_guard: {margin_frac: 0.25} # optional: urgent deadline jobs go to safe capacity first
                                        # (training and serving alike; see rlsched.policies.rules.deadline_guard)
    consolidate: {min_hold_s: 900}      # optional: empty and release lightly used elastic nodes
                                        # (training and serving alike; see rlsched.policies.rules.consolidate)
    preempt_long: {factor: 10}          # optional: suspend far longer jobs for blocked short ones
                                        # (training and serving alike; see rlsched.policies.rules.preempt_long)
    mig_resplit: {max_per_pass: 4}      # optional: re-split idle MIG GPUs for blocked jobs as a rule; the
                                        # policy's own re-split actions are masked (rlsched.policies.rules.mig_resplit)
    serve_rules:                        # optional: rule parameters changed for serving only (evaluation,
      deadline_guard: {trust_deadline: true}  # gate, model folder); training keeps the rules above
    trace_families:                     # optional: a cluster's own exported history (rlsched trace export)
      - path: ../exports/jobs.csv       # canonical trace; added to scenarios (mixed with the generator's)
        fleet: 2x8xH100-80GB            # the pools it ran on (a --cluster string)
        eval_fraction: 0.25             # its last quarter (by submission) is evaluation only: later days
    selector:                           # optional: train a heuristic selector instead of a per-slot network:
      candidates: [weighted-priority, sjf, fair-share, best-fit]  # the action is which of these schedules
      hold_s: 3600                      # the next hold_s seconds (rlsched.envs.selector_env); PPO on ppo:,
      episode_jobs: 1500                # total_steps and network: as for the per-slot network
      label_count: 3000                 # optional warm start: states labelled by each candidate's rollout
      label_every: 2                    # (rlsched.train.selector_labels); a label every N choices, each
      label_horizon_s: 86400            # rollout this long, soft targets at this temperature (a fraction
      label_temperature: 0.02           # of the best cost), cloned for label_epochs
      margin: 0.1                       # optional: where another candidate's probability beats the default's
      default: auto                     # by less, the default schedules (auto: the labels' safest candidate)
    init_from: models:/rlsched-ppo@champion  # optional warm start: a registered version or a model folder
                                        # (its codec signature must match this experiment's; no cloning)
    output: ../models/scorer            # model folder written at the end

Relative paths are relative to the experiment file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rlsched.errors import RlschedError, name_hint
from rlsched.yamlfile import check_keys, load_mapping


class ExperimentError(RlschedError):
    """An experiment file that cannot be used (the message names the key and file)."""


@dataclass(frozen=True)
class ScenarioEntry:
    """One training (or holdout) world and its time windows."""

    name: str
    scenario: str | dict[str, Any]
    train_window_h: tuple[float, float] | None = None
    eval_windows_h: tuple[tuple[float, float], ...] = ()
    clusters: tuple[str, ...] = ()
    load_factors: tuple[float, ...] = ()
    #: hours into the market series where a world's run starts (one price period each)
    market_offsets_h: tuple[float, ...] = ()


@dataclass(frozen=True)
class PpoParams:
    learning_rate: float = 3e-4
    n_steps: int = 512
    batch_size: int = 256
    n_epochs: int = 4
    gamma: float = 0.999
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5


@dataclass(frozen=True)
class BcParams:
    steps: int = 0
    epochs: int = 5
    learning_rate: float = 1e-3
    #: the heuristic imitated (rlsched.train.teacher.TEACHERS)
    teacher: str = "weighted-priority"
    #: weight of the imitation loss kept during PPO (annealed linearly to 0 over the run; 0 = off)
    keep: float = 0.0
    #: minibatches of that loss after each rollout
    keep_batches: int = 4
    #: class balance of the imitation loss: each action kind weighted by (1 / its frequency) ** balance
    #: (1 = full balance, 0.5 = square root, 0 = plain cross-entropy)
    balance: float = 1.0
    #: best-follow: episodes per training world and jobs per episode (0: the experiment's episode_jobs)
    #: of the replays that pick each world's teacher. Short episodes never build the deep backlogs where
    #: orderings differ, so every teacher ties and the first nominator wins by default
    select_episodes: int = 3
    select_jobs: int = 0
    #: lookahead (rlsched.train.lookahead): the nominators whose follow teachers are rolled out at each
    #: label (empty: every nominator; the first is the default), a new label every ``label_every``
    #: decisions with a choice, rollouts of ``label_horizon_s`` simulated seconds, and the fraction of
    #: the default's penalty another candidate must save to be followed instead
    candidates: tuple[str, ...] = ()
    label_every: int = 100
    label_horizon_s: float = 86_400.0
    label_margin: float = 0.02

    def lookahead_candidates(self, nominators: tuple[str, ...]) -> tuple[str, ...]:
        """The candidates the lookahead teacher rolls out: ``candidates``, or every nominator."""
        return tuple(self.candidates) or nominators


@dataclass(frozen=True)
class MlflowParams:
    experiment: str = "rlsched"
    registered_model: str = "rlsched-ppo"
    enabled: bool = True


@dataclass(frozen=True)
class ForecastParams:
    """The demand forecaster fitted on the training windows (see :mod:`rlsched.workload.forecast`).

    ``model``: ``smoothed-seasonal`` (default), ``seasonal-naive`` or ``none`` (no
    forecaster: the observation's demand signal is the recent arrival rate).
    ``horizon_s``: forecast horizon; ``eval_step_s``: spacing of the forecast origins
    when its error is scored on the evaluation windows. The other keys are
    constructor arguments of :class:`~rlsched.workload.forecast.SmoothedSeasonal`
    (``season``, ``tau_s``, ...) or, for seasonal-naive, ``season_s``.
    """

    model: str = "smoothed-seasonal"
    horizon_s: float = 3600.0
    eval_step_s: float = 3600.0
    origin_epoch_s: float = 0.0
    season: str = "auto"
    tau_s: float = 12 * 3600.0
    prior_weight: float = 1.0
    class_prior_weight: float = 0.25
    level_floor: float = 0.25
    level_ceiling: float = 4.0
    shrink_hours: float = 1.0
    season_s: float = 86400.0

    @property
    def enabled(self) -> bool:
        return self.model != "none"

    def model_params(self) -> dict[str, Any]:
        """Constructor arguments of the chosen forecaster."""
        if self.model == "seasonal-naive":
            return {"season_s": self.season_s}
        return {k: getattr(self, k) for k in SMOOTHED_SEASONAL_KEYS}


@dataclass(frozen=True)
class DeadlineGuardParams:
    """The deadline guard trained and served with the policy (:mod:`rlsched.policies.rules.deadline_guard`).

    Absent from an experiment: no guard. Present: the guard runs at every decision
    point of every training episode, teacher rollout and evaluation, before the policy
    acts, and is saved with the model (``deadline_guard.json``) so that serving runs it
    too - a guard the policy never trained with would change the states it sees. A switch
    measured to help only when served goes in ``serve_rules`` instead
    (:meth:`Experiment.rule_params`).
    """

    margin_frac: float = 0.25
    min_margin_s: float = 300.0
    restart_overhead_s: float = 60.0
    spot_last_resort: bool = True
    preempt: bool = False
    gangs_off_spot: bool = False
    backlog_buy: bool = False
    trust_deadline: bool = False

    def params(self) -> dict[str, Any]:
        """Constructor arguments of :class:`~rlsched.policies.rules.deadline_guard.DeadlineGuard`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ConsolidateParams:
    """Node consolidation trained and served with the policy (:mod:`rlsched.policies.rules.consolidate`).

    Absent: none. Present: it runs like the deadline guard (after it) at every decision
    point of training, teacher rollouts, evaluation and serving (``consolidate.json``).
    """

    min_hold_s: float = 900.0
    max_reclaim_rate_per_h: float = 0.05
    restart_overhead_s: float = 60.0

    def params(self) -> dict[str, Any]:
        """Constructor arguments of :class:`~rlsched.policies.rules.consolidate.Consolidator`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class PreemptLongParams:
    """Long-job preemption trained and served with the policy (:mod:`rlsched.policies.rules.preempt_long`).

    Absent: none. Present: it runs after the other rules at every decision point of
    training, teacher rollouts, evaluation and serving (``preempt_long.json``).
    """

    factor: float = 10.0
    min_gain_gpu_s: float = 3600.0
    scan: int = 4
    restart_overhead_s: float = 60.0

    def params(self) -> dict[str, Any]:
        """Constructor arguments of :class:`~rlsched.policies.rules.preempt_long.LongJobPreemption`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class MigResplitParams:
    """MIG re-splitting as a rule (:mod:`rlsched.policies.rules.mig_resplit`).

    Absent: the policy re-splits through its own actions. Present: the rule re-splits idle MIG
    GPUs for blocked jobs at every decision point of training, teacher rollouts, evaluation and
    serving (``mig_resplit.json``), and the policy's re-split actions are masked - it only places.
    """

    max_per_pass: int = 4
    scan: int = 256

    def params(self) -> dict[str, Any]:
        """Constructor arguments of :class:`~rlsched.policies.rules.mig_resplit.MigResplit`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class GateParams:
    """The workload-family gate run at the end of training (:mod:`rlsched.train.generalisation`).

    The final policy is replayed with every heuristic on ``families`` (names or the
    groups ``all`` / ``traces`` / ``generated``), ``windows`` windows of at most
    ``max_jobs`` jobs each; the result goes into the card (``metrics.families``), the
    model card's table and the registered version's ``family_gate`` tag, which
    ``rlsched promote`` requires. ``gate: off`` skips it (promote then needs
    ``rlsched models gate``).
    """

    families: tuple[str, ...] = ("generated",)
    #: per family: fewer let a family whose windows spread widely pass by luck
    windows: int = 6
    max_jobs: int = 1000


@dataclass(frozen=True)
class GeneratedMarketsParams:
    """Domain randomisation of spot *markets*: training worlds whose market is a
    :func:`rlsched.market.generator.random_market` draw.

    The ``count`` worlds are the experiment's training worlds on hybrid fleets of one spot and
    one on-demand pool, spread evenly over them (jobs, fleet and forecaster unchanged), world
    ``i`` under a market drawn with seed ``seed + i`` (below 1000: evaluation windows of spot
    families use seeds from 1000 up), for that fleet's GPU model. ``exclude`` names market
    families whose *kind* no draw may have (leave-one-family-out); a draw always has one
    region (the fleet has one spot pool), so ``mkt-regional`` stays unseen too. The card lists
    the kinds the draws cover as trained (``market_families``), so the gate judges a model
    only on the others.
    """

    count: int = 12
    seed: int = 0
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class GeneratedParams:
    """Domain randomisation: training worlds drawn from :func:`rlsched.workload.generator.random_family`.

    ``count`` worlds of ``jobs`` jobs each, family ``i`` drawn with seed ``seed + i``
    (always below 1000: evaluation windows of generated families use seeds from
    1000 up). ``exclude`` names generator families whose *kind* no draw may have
    (leave-one-family-out): the card lists the others as trained, so the gate and the
    generalisation benchmark judge the model only on the excluded ones.

    ``families`` adds ``family_count`` draws of each *named* generator family (seeds
    ``seed ..``, still below 1000) to the random ones: a random draw rarely lands on the
    exact mixture of a documented family, so a model can otherwise lose on a family the
    card lists as trained. A named family may not be one ``exclude`` leaves out.
    """

    count: int = 32
    jobs: int = 400
    seed: int = 0
    exclude: tuple[str, ...] = ()
    #: largest fleet drawn (nodes): a few hundred jobs only queue on small fleets
    max_nodes: int = 128
    families: tuple[str, ...] = ()
    family_count: int = 2


@dataclass(frozen=True)
class SelectorParams:
    """``selector:`` - the policy chooses which heuristic schedules, not which job
    (:class:`rlsched.envs.selector_env.SelectorEnv`, :mod:`rlsched.learned.selector`).

    Every ``hold_s`` seconds one of ``candidates`` (registered heuristics) is chosen from
    the regime features and schedules until the next choice. Episodes are runs of
    ``episode_jobs`` consecutive jobs of a training world: long enough for the backlogs in
    which orderings differ. PPO's settings come from ``ppo:``, its length from
    ``total_steps`` (one step = one choice), the hidden width from ``network.hidden``.
    """

    candidates: tuple[str, ...] = ("weighted-priority", "sjf", "fair-share", "best-fit")
    hold_s: float = 3600.0
    episode_jobs: int = 1500
    #: warm start on counterfactual labels (rlsched.train.selector_labels): states labelled (0: none),
    #: a label every this many choices, each candidate's rollout horizon, the soft targets' temperature
    #: (a fraction of the best cost) and the cloning epochs
    label_count: int = 0
    label_every: int = 2
    label_horizon_s: float = 86400.0
    label_temperature: float = 0.02
    label_epochs: int = 30
    #: DAgger: after the warm start, this many rounds of labelling ``label_count`` more states along the
    #: *cloned policy's own* trajectories (not the label winners'), adding them and cloning again - the
    #: states a policy reaches by its own mistakes are the ones the first labels never showed it
    label_rounds: int = 0
    #: the candidate chosen where the network is unsure (``auto``: the one whose worst labelled state is
    #: mildest, :meth:`~rlsched.train.selector_labels.SelectorLabels.safest`) and how much more probability
    #: another must have to be chosen instead (0: the plain argmax; :meth:`SelectorModel.pick`)
    default: str = "auto"
    margin: float = 0.0


#: experiment key of each rule (as :data:`rlsched.policies.rules.RULES` names it) -> its parameters'
#: schema. Kept here rather than derived from RULES so that reading an experiment does not import
#: the policies; a test checks that both name the same rules in the same order.
RULE_PARAMS: dict[str, type[DeadlineGuardParams] | type[ConsolidateParams] | type[PreemptLongParams]
                  | type[MigResplitParams]] = {
    "deadline_guard": DeadlineGuardParams,
    "consolidate": ConsolidateParams,
    "preempt_long": PreemptLongParams,
    "mig_resplit": MigResplitParams,
}


SMOOTHED_SEASONAL_KEYS = ("origin_epoch_s", "season", "tau_s", "prior_weight", "class_prior_weight",
                          "level_floor", "level_ceiling", "shrink_hours")


@dataclass(frozen=True)
class Experiment:
    name: str
    scenarios: tuple[ScenarioEntry, ...]
    description: str = ""
    holdout: tuple[ScenarioEntry, ...] = ()
    episode_jobs: int = 400
    eval_max_jobs: int = 2000
    reward: dict[str, float] = field(default_factory=dict)
    ppo: PpoParams = field(default_factory=PpoParams)
    network: dict[str, int] = field(default_factory=lambda: {"hidden": 64})
    window: int = 16
    max_pools: int = 4
    #: heuristics whose next jobs fill the job slots (rlsched.envs.nominate); empty: head + shortest
    nominators: tuple[str, ...] = ()
    #: running slots R of the codec: the policy may preempt the job in each (0: no preempt actions)
    preempt_slots: int = 0
    #: optional global features of the codec (rlsched.envs.codec.OPTIONAL_GLOBALS); empty: none
    extra_globals: tuple[str, ...] = ()
    #: a codec-space teacher the network is anchored to (rlsched.learned.ppo_net): None, not anchored
    anchor: str | None = None
    n_envs: int = 2
    vec_env: str = "subproc"
    total_steps: int = 100_000
    seed: int = 0
    bc: BcParams = field(default_factory=BcParams)
    eval_every_steps: int = 0
    checkpoint_every_steps: int = 25_000
    mlflow: MlflowParams = field(default_factory=MlflowParams)
    forecast: ForecastParams = field(default_factory=ForecastParams)
    deadline_guard: DeadlineGuardParams | None = None
    consolidate: ConsolidateParams | None = None
    preempt_long: PreemptLongParams | None = None
    mig_resplit: MigResplitParams | None = None
    #: rule parameters changed for serving only - the final evaluation, the gate, the model folder - while
    #: the network trains behind the rules as written: ``{rule: {key: value}}`` for rules the experiment has
    serve_rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    gate: GateParams | None = field(default_factory=GateParams)
    generated: GeneratedParams | None = None
    generated_markets: GeneratedMarketsParams | None = None
    #: a heuristic selector instead of the per-slot network (None: the per-slot network)
    selector: SelectorParams | None = None
    #: warm start: the weights of this model folder or ``models:/`` version (see rlsched.train.warm_start)
    init_from: str = ""
    output: str = ""
    source: str = ""
    #: the Ray cluster (``auto`` or ``HOST:PORT``) the rollout environments and the gate's replays run on;
    #: empty: this machine. Set by ``rlsched train --ray``, not a YAML key, and not an MLflow param (the run
    #: is tagged with it instead): where a run executes is not part of the experiment.
    ray: str = ""

    def trained_rule_params(self) -> dict[str, dict[str, Any]]:
        """The rules the network trains behind: ``{rule name: constructor arguments}``."""
        rules = ((name, getattr(self, name)) for name in RULE_PARAMS)
        return {name: p.params() for name, p in rules if p is not None}

    def rule_params(self) -> dict[str, dict[str, Any]]:
        """The rules the policy is served behind (saved with the model, evaluated, gated): the trained ones
        with ``serve_rules`` applied.

        A serving-only change exists because training behind a rule changes what the network learns to
        do around it: a rule measured at no cost in front of a trained network may cost more once the
        network is retrained behind it (BENCHMARKS.md, "Deadlines trusted when served"), so a recipe may keep the
        training rules and change them for serving, and the card records both.
        """
        trained = self.trained_rule_params()
        return {name: {**args, **self.serve_rules.get(name, {})} for name, args in trained.items()}

    def flat_params(self) -> dict[str, Any]:
        """Parameters for MLflow (nested keys joined with dots)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, v: Any) -> None:
            if hasattr(v, "__dataclass_fields__"):
                for f in fields(v):
                    walk(f"{prefix}{f.name}.", getattr(v, f.name))
            elif isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{prefix}{k}.", x)
            elif isinstance(v, (list, tuple)) and v and hasattr(v[0], "__dataclass_fields__"):
                for i, x in enumerate(v):
                    walk(f"{prefix}{i}.", x)
            else:
                out[prefix[:-1]] = v

        walk("", self)
        out.pop("ray", None)
        return out


def _keys(where: str, got: dict[str, Any], known: set[str]) -> None:
    check_keys(where, got, known, ExperimentError)


def _names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def _window(where: str, v: Any) -> tuple[float, float]:
    if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)):
        raise ExperimentError(f"{where}: a window is [start_h, end_h], got {v!r}")
    a, b = float(v[0]), float(v[1])
    if not 0 <= a < b:
        raise ExperimentError(f"{where}: window [{a}, {b}] must have 0 <= start < end")
    return a, b


def _scenario_entry(where: str, d: Any, base: Path, *, holdout: bool) -> ScenarioEntry:
    if not isinstance(d, dict):
        raise ExperimentError(f"{where}: expected a mapping")
    _keys(where, d, _names(ScenarioEntry))
    if "scenario" not in d:
        raise ExperimentError(f"{where}: missing 'scenario'")
    sc = d["scenario"]
    if isinstance(sc, str) and not sc.startswith("bundled:"):
        p = Path(sc)
        sc = str(p if p.is_absolute() else (base / p))
        if not Path(sc).exists():
            raise ExperimentError(f"{where}.scenario: {sc}: file not found")
    train = _window(f"{where}.train_window_h", d["train_window_h"]) if d.get("train_window_h") else None
    evals = tuple(_window(f"{where}.eval_windows_h[{i}]", w) for i, w in enumerate(d.get("eval_windows_h") or ()))
    if train is None and not holdout:
        raise ExperimentError(f"{where}: a training scenario needs train_window_h")
    if train is not None:
        for i, (a, b) in enumerate(evals):
            if a < train[1] and train[0] < b:
                raise ExperimentError(
                    f"{where}.eval_windows_h[{i}]: [{a}, {b}] overlaps the training window "
                    f"[{train[0]}, {train[1]}]; evaluation must use data the policy never saw"
                )
    lfs = tuple(float(x) for x in d.get("load_factors") or ())
    if any(x <= 0 for x in lfs):
        raise ExperimentError(f"{where}.load_factors: must be > 0")
    offsets = d.get("market_offsets_h") or ()
    if not (isinstance(offsets, (list, tuple)) and all(isinstance(x, (int, float)) and x >= 0 for x in offsets)):
        raise ExperimentError(f"{where}.market_offsets_h: a list of hours >= 0, got {offsets!r}")
    return ScenarioEntry(
        name=str(d.get("name") or f"scenario{where[-2]}"), scenario=sc, train_window_h=train, eval_windows_h=evals,
        clusters=tuple(str(c) for c in d.get("clusters") or ()), load_factors=lfs,
        market_offsets_h=tuple(float(x) for x in offsets),
    )


def _sub(where: str, d: Any, cls: type) -> Any:
    if d is None:
        return cls()
    if not isinstance(d, dict):
        raise ExperimentError(f"{where}: expected a mapping")
    _keys(where, d, _names(cls))
    try:
        return cls(**d)
    except TypeError as exc:
        raise ExperimentError(f"{where}: {exc}") from None


def _forecast(d: Any) -> ForecastParams:
    fp: ForecastParams = _sub("forecast", d, ForecastParams)
    given = set(d or ())
    models = ("smoothed-seasonal", "seasonal-naive", "none")
    if fp.model not in models:
        raise ExperimentError(f"forecast.model must be one of {', '.join(models)}, got {fp.model!r}")
    own = {"smoothed-seasonal": set(SMOOTHED_SEASONAL_KEYS), "seasonal-naive": {"season_s"}, "none": set()}
    foreign = sorted(given - {"model", "horizon_s", "eval_step_s"} - own[fp.model])
    if foreign:
        raise ExperimentError(f"forecast: {', '.join(foreign)} do not apply to model {fp.model!r}")
    try:
        for k in ("horizon_s", "eval_step_s", "origin_epoch_s", "tau_s", "prior_weight", "class_prior_weight",
                  "level_floor", "level_ceiling", "shrink_hours", "season_s"):
            float(getattr(fp, k))
    except (TypeError, ValueError):
        raise ExperimentError(f"forecast.{k} must be a number, got {getattr(fp, k)!r}") from None
    if not (float(fp.horizon_s) > 0 and float(fp.eval_step_s) > 0):
        raise ExperimentError("forecast.horizon_s and forecast.eval_step_s must be > 0")
    if fp.enabled:
        from rlsched.workload.forecast import make_forecaster

        try:
            make_forecaster(fp.model, **fp.model_params())
        except (TypeError, ValueError) as exc:
            raise ExperimentError(f"forecast: {exc}") from None
    return fp


def _rule(name: str, d: Any, cls: type, where: str = "") -> Any:
    """A rule's parameters (None: the rule is off), checked by building the rule; errors name ``where``
    (default: the rule's own key)."""
    if d is None:
        return None
    got = _sub(where or name, d, cls)
    from rlsched.policies.rules import build_rules

    try:
        build_rules({name: got.params()})
    except ValueError as exc:
        msg = str(exc).removeprefix(f"{name}: ")
        raise ExperimentError(f"{where or name}: {msg}") from None
    return got


def _serve_rules(d: Any, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``serve_rules:`` - ``{rule: {key: value}}`` for rules the experiment trains behind, each merged rule
    checked by building it (absent: none)."""
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise ExperimentError(f"serve_rules: expected a mapping of rule names to parameters, got {d!r}")
    out: dict[str, dict[str, Any]] = {}
    for name, changes in d.items():
        where = f"serve_rules.{name}"
        if name not in RULE_PARAMS:
            raise ExperimentError(f"{where}: unknown rule{name_hint(str(name), RULE_PARAMS)}; "
                                  f"known: {', '.join(RULE_PARAMS)}")
        if data.get(name) is None:
            raise ExperimentError(f"{where}: the experiment trains behind no {name}; serve_rules only changes "
                                  "the parameters of a rule the network trains behind")
        if not isinstance(changes, dict) or not changes:
            raise ExperimentError(f"{where}: expected a mapping of the rule's parameters to serve with")
        _rule(name, {**data[name], **changes}, RULE_PARAMS[name], where)
        out[str(name)] = dict(changes)
    return out


def _gate(d: Any) -> GateParams | None:
    """``gate:`` - absent: the default gate; ``off`` / ``false``: none; a mapping: checked."""
    if d is None:
        return GateParams()
    if d is False or (isinstance(d, str) and d.lower() in ("off", "none", "false")):
        return None
    if not isinstance(d, dict):
        raise ExperimentError(f"gate: expected a mapping or 'off', got {d!r}")
    _keys("gate", d, _names(GateParams))
    fams = d.get("families", GateParams.families)
    if isinstance(fams, str) or not isinstance(fams, (list, tuple)) or not fams:
        raise ExperimentError(f"gate.families: a non-empty list of family names, got {fams!r}")
    from rlsched.train.families import FamilyError, resolve

    try:
        resolve([str(f) for f in fams])
    except FamilyError as exc:
        raise ExperimentError(f"gate.families: {exc}") from None
    g = GateParams(tuple(str(f) for f in fams), int(d.get("windows", 3)), int(d.get("max_jobs", 1000)))
    if g.windows < 1 or g.max_jobs < 2:
        raise ExperimentError(f"gate: windows must be >= 1 and max_jobs >= 2, got {g.windows} / {g.max_jobs}")
    return g


def _family_names(where: str, value: Any, kind: str, unknown_as: str, known: Iterable[str]) -> tuple[str, ...]:
    """A list of ``kind`` names at ``where``, each one of ``known`` (an unknown one is named as ``unknown_as``)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ExperimentError(f"{where}: a list of {kind} names, got {value!r}")
    names = tuple(str(x) for x in value)
    known = list(known)
    unknown = [x for x in names if x not in known]
    if unknown:
        raise ExperimentError(f"{where}: unknown {unknown_as} {unknown[0]!r}; known: {', '.join(known)}")
    return names


def _optional_section(key: str, d: Any, params: type) -> dict[str, Any] | None:
    """An optional mapping section ``key:`` - None when absent, else the mapping, its keys checked against
    the fields of ``params`` (a scalar or a list there is one line naming the key)."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise ExperimentError(f"{key}: expected a mapping, got {d!r}")
    _keys(key, d, _names(params))
    return d


def _generated(d: Any) -> GeneratedParams | None:
    """``generated:`` - absent: no generated training worlds; a mapping: checked."""
    d = _optional_section("generated", d, GeneratedParams)
    if d is None:
        return None
    from rlsched.workload.generator import FAMILIES

    exclude = _family_names("generated.exclude", d.get("exclude", ()), "generator family", "family", FAMILIES)
    named = _family_names("generated.families", d.get("families", ()), "generator family", "family", FAMILIES)
    g = GeneratedParams(int(d.get("count", 32)), int(d.get("jobs", 400)), int(d.get("seed", 0)), exclude,
                        int(d.get("max_nodes", 128)), named, int(d.get("family_count", 2)))
    both = [x for x in g.families if x in g.exclude]
    if both:
        raise ExperimentError(f"generated.families: {both[0]!r} is also in generated.exclude (a family left out "
                              f"of training cannot be trained on)")
    if g.families and (g.family_count < 1 or g.seed + g.family_count > 1000):
        raise ExperimentError(f"generated.family_count: at least 1 and seed + family_count <= 1000 (evaluation seeds "
                              f"start at 1000), got {g.family_count}")
    if g.max_nodes < (8 if "tiny-fleet" in g.exclude else 4):
        raise ExperimentError(f"generated.max_nodes: at least {8 if 'tiny-fleet' in g.exclude else 4} "
                              f"(the smallest fleet a draw can have), got {g.max_nodes}")
    if g.count < 1 or g.jobs < 2 or g.seed < 0 or g.seed + g.count > 1000:
        raise ExperimentError(f"generated: count >= 1, jobs >= 2 and seed + count <= 1000 (evaluation seeds start "
                              f"at 1000), got count {g.count}, jobs {g.jobs}, seed {g.seed}")
    return g


def _generated_markets(d: Any) -> GeneratedMarketsParams | None:
    """``generated_markets:`` - absent: no generated markets; a mapping: checked."""
    d = _optional_section("generated_markets", d, GeneratedMarketsParams)
    if d is None:
        return None
    from rlsched.market.generator import MARKET_FAMILIES

    exclude = _family_names("generated_markets.exclude", d.get("exclude", ()), "market family", "market family",
                            MARKET_FAMILIES)
    g = GeneratedMarketsParams(int(d.get("count", 12)), int(d.get("seed", 0)), exclude)
    if g.count < 1 or g.seed < 0 or g.seed + g.count > 1000:
        raise ExperimentError(f"generated_markets: count >= 1 and seed + count <= 1000 (evaluation seeds start at "
                              f"1000), got count {g.count}, seed {g.seed}")
    return g


def _selector(d: Any) -> SelectorParams | None:
    """``selector:`` - absent: a per-slot network; a mapping: checked (registered, distinct candidates)."""
    d = _optional_section("selector", d, SelectorParams)
    if d is None:
        return None
    cands = d.get("candidates", SelectorParams.candidates)
    if isinstance(cands, str) or not isinstance(cands, (list, tuple)) or len(cands) < 2:
        raise ExperimentError(f"selector.candidates: a list of at least two heuristic names, got {cands!r}")
    names = tuple(str(c) for c in cands)
    if len(set(names)) != len(names):
        raise ExperimentError(f"selector.candidates: each heuristic once, got {list(names)}")
    from rlsched.policies import make_policy

    for n in names:
        if ":" in n:
            raise ExperimentError(f"selector.candidates: {n!r}: plain heuristic names (no parameters)")
        try:
            make_policy(n)
        except RlschedError as exc:
            raise ExperimentError(f"selector.candidates: {exc}") from None
    ints = ("episode_jobs", "label_count", "label_every", "label_epochs", "label_rounds")
    floats = ("hold_s", "label_horizon_s", "label_temperature")
    try:
        num: dict[str, Any] = {k: int(d.get(k, getattr(SelectorParams, k))) for k in ints}
        num.update({k: float(d.get(k, getattr(SelectorParams, k))) for k in floats})
    except (TypeError, ValueError):
        raise ExperimentError(f"selector: {', '.join(ints + floats)} must be numbers") from None
    if not num["hold_s"] > 0 or num["episode_jobs"] < 2:
        raise ExperimentError(f"selector: hold_s must be > 0 and episode_jobs >= 2, got {num['hold_s']:g} / "
                              f"{num['episode_jobs']}")
    if num["label_count"] < 0 or num["label_every"] < 1 or num["label_epochs"] < 1 or num["label_rounds"] < 0:
        raise ExperimentError("selector: label_count must be >= 0, label_rounds >= 0, label_every and "
                              "label_epochs >= 1")
    if not (num["label_horizon_s"] >= num["hold_s"] and num["label_temperature"] > 0):
        raise ExperimentError(f"selector: label_horizon_s must be >= hold_s and label_temperature > 0, got "
                              f"{num['label_horizon_s']:g} / {num['label_temperature']:g}")
    default, margin = _selector_default(d, names, num["label_count"])
    return SelectorParams(names, **num, default=default, margin=margin)


def _selector_default(d: dict[str, Any], names: tuple[str, ...], label_count: int) -> tuple[str, float]:
    """``selector.default`` and ``selector.margin``, checked."""
    default = str(d.get("default", SelectorParams.default))
    if default != "auto" and default not in names:
        raise ExperimentError(f"selector.default: 'auto' or one of the candidates {list(names)}, got {default!r}")
    try:
        margin = float(d.get("margin", SelectorParams.margin))
    except (TypeError, ValueError):
        raise ExperimentError(f"selector.margin: a number in [0, 1), got {d.get('margin')!r}") from None
    if not 0.0 <= margin < 1.0:
        raise ExperimentError(f"selector.margin: a number in [0, 1), got {margin:g}")
    if margin > 0 and default == "auto" and label_count == 0:
        raise ExperimentError("selector.default: 'auto' picks the default from the labels; with label_count 0 "
                              "name a candidate")
    return default, margin


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment YAML; every problem is an ExperimentError naming file and key."""
    path = Path(path)
    data = load_mapping(path, "experiment", ExperimentError)
    try:
        return _parse(data, path)
    except ExperimentError as exc:
        msg = str(exc)
        raise ExperimentError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def _extra_globals(v: Any) -> tuple[str, ...]:
    """``extra_globals:``: a list of names from the codec's optional global features (absent: none)."""
    from rlsched.envs.codec import OPTIONAL_GLOBALS

    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ExperimentError(f"extra_globals must be a list of names, got {v!r}")
    for x in v:
        if x not in OPTIONAL_GLOBALS:
            raise ExperimentError(f"extra_globals: unknown feature {x!r}{name_hint(x, OPTIONAL_GLOBALS)}; "
                                  f"known: {', '.join(OPTIONAL_GLOBALS)}")
    return tuple(v)


def _anchor(v: Any, nominators: tuple[str, ...]) -> str | None:
    """``anchor:``: a codec-space teacher that acts itself (absent: None, a network without an anchor)."""
    from rlsched.envs.teacher_actions import acting_teachers, acts_itself

    if v is None:
        return None
    if not isinstance(v, str) or not acts_itself(v, nominators):
        raise ExperimentError(f"anchor must be one of {', '.join(acting_teachers())} "
                              f"(or follow:NAME for a nominator NAME), got {v!r}")
    return v


def _preempt_slots(v: Any) -> int:
    """``preempt_slots:``: an integer >= 0 (absent: 0, the codec without preempt actions)."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ExperimentError(f"preempt_slots must be an integer >= 0, got {v!r}")
    return v


def _nominators(v: Any, window: int) -> tuple[str, ...]:
    """``nominators:``: a list of heuristic names (see :mod:`rlsched.envs.nominate`)."""
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(n, str) for n in v):
        raise ExperimentError(f"nominators must be a list of heuristic names, got {v!r}")
    from rlsched.envs.nominate import Nomination, NominationError

    try:
        Nomination(v, max(window, 1))
    except NominationError as exc:
        raise ExperimentError(str(exc)) from None
    return tuple(v)


def _trace_family(where: str, d: Any, base: Path) -> ScenarioEntry:
    """One ``trace_families`` entry as a training scenario whose last ``eval_fraction`` (by submission) is its
    evaluation window: the policy trains on the cluster's earlier days and is judged on its later ones."""
    if not isinstance(d, dict):
        raise ExperimentError(f"{where}: expected a mapping with path and fleet")
    _keys(where, d, {"path", "fleet", "name", "eval_fraction"})
    for req in ("path", "fleet"):
        if not d.get(req):
            raise ExperimentError(f"{where}: missing {req!r}")
    p = Path(str(d["path"]))
    p = p if p.is_absolute() else base / p
    frac = d.get("eval_fraction", 0.25)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac < 1:
        raise ExperimentError(f"{where}.eval_fraction: a number in (0, 1), got {frac!r}")
    from rlsched.cluster import parse_cluster
    from rlsched.errors import TraceError
    from rlsched.workload import read_canonical

    try:
        parse_cluster(str(d["fleet"]))
        jobs = read_canonical(p).jobs
    except (TraceError, ValueError, RlschedError) as exc:
        raise ExperimentError(f"{where}: {exc}") from None
    submits = sorted(j.submit_time for j in jobs)
    cut = min(max(int(len(submits) * (1 - float(frac))), 2), len(submits) - 1)
    split_h = (submits[cut] - submits[0]) / 3600.0
    end_h = (submits[-1] - submits[0] + 1.0) / 3600.0
    if len(submits) < 4 or split_h <= 0 or split_h >= end_h:
        raise ExperimentError(f"{where}: {p} has {len(submits)} jobs; a time split needs at least 4 submitted "
                              f"at different times")
    name = str(d.get("name") or p.stem)
    return ScenarioEntry(name=name, scenario={"name": name, "cluster": str(d["fleet"]), "workload": [{"path": str(p)}]},
                         train_window_h=(0.0, split_h), eval_windows_h=((split_h, end_h),))


def _init_from(v: Any, base: Path) -> str:
    """``init_from:`` a ``models:/`` URI as it is, or a model folder (relative to the experiment file)."""
    if v is None or v == "":
        return ""
    if not isinstance(v, str):
        raise ExperimentError(f"init_from: a model folder or models:/ URI, got {v!r}")
    if v.startswith("models:/"):
        return v
    p = Path(v) if Path(v).is_absolute() else base / v
    if not p.is_dir():
        raise ExperimentError(f"init_from: {p}: model folder not found")
    return str(p)


def _check_bc(exp: Experiment, path: Path) -> None:
    """The ``bc:`` block's values, checked against each other and the nominators."""
    from rlsched.train.teacher import TEACHERS, is_teacher

    if not is_teacher(exp.bc.teacher, exp.nominators):
        follow = ", follow:NAME for a nominator NAME" if exp.nominators else ""
        needs = " (best-follow, lookahead and follow:NAME need nominators:)" if not exp.nominators else ""
        raise ExperimentError(f"{path}: bc.teacher must be one of {', '.join(TEACHERS)}{follow}, "
                              f"got {exp.bc.teacher!r}{needs}")
    if exp.bc.keep < 0 or exp.bc.keep_batches < 1:
        raise ExperimentError(f"{path}: bc.keep must be >= 0 and bc.keep_batches >= 1")
    if not 0.0 <= exp.bc.balance <= 1.0:
        raise ExperimentError(f"{path}: bc.balance must be in [0, 1], got {exp.bc.balance}")
    if exp.bc.select_episodes < 1 or exp.bc.select_jobs < 0:
        raise ExperimentError(f"{path}: bc.select_episodes must be >= 1 and bc.select_jobs >= 0, got "
                              f"{exp.bc.select_episodes} and {exp.bc.select_jobs}")
    if exp.bc.keep > 0 and exp.bc.steps <= 0:
        raise ExperimentError(f"{path}: bc.keep needs bc.steps > 0 (the teacher's samples it imitates)")
    _check_lookahead(exp, path)


def _check_lookahead(exp: Experiment, path: Path) -> None:
    """The lookahead teacher's keys: candidates among the nominators, positive spacing and horizon."""
    bc = exp.bc
    if not isinstance(bc.candidates, list | tuple) or not all(isinstance(c, str) for c in bc.candidates):
        raise ExperimentError(f"{path}: bc.candidates must be a list of nominator names, got {bc.candidates!r}")
    unknown = [c for c in bc.candidates if c not in exp.nominators]
    if unknown:
        raise ExperimentError(f"{path}: bc.candidates: {', '.join(map(repr, unknown))} not among the nominators "
                              f"({', '.join(exp.nominators) or 'none'})")
    if len(set(bc.candidates)) != len(bc.candidates):
        raise ExperimentError(f"{path}: bc.candidates names a nominator twice: {list(bc.candidates)}")
    try:
        every, horizon, margin = int(bc.label_every), float(bc.label_horizon_s), float(bc.label_margin)
    except (TypeError, ValueError):
        raise ExperimentError(f"{path}: bc.label_every, bc.label_horizon_s and bc.label_margin must be numbers, "
                              f"got {bc.label_every!r}, {bc.label_horizon_s!r}, {bc.label_margin!r}") from None
    if every < 1 or not horizon > 0 or not 0.0 <= margin < 1.0:
        raise ExperimentError(f"{path}: bc.label_every must be >= 1, bc.label_horizon_s > 0 and bc.label_margin "
                              f"in [0, 1), got {bc.label_every}, {bc.label_horizon_s} and {bc.label_margin}")
    if bc.candidates and bc.teacher != "lookahead":
        raise ExperimentError(f"{path}: bc.candidates only applies to bc.teacher: lookahead (got {bc.teacher!r})")


def _parse(data: dict[str, Any], path: Path) -> Experiment:
    known = (_names(Experiment) - {"source", "ray"}) | {"trace_families"}
    _keys("experiment", data, known)
    base = path.parent
    traced = tuple(_trace_family(f"trace_families[{i}]", d, base)
                   for i, d in enumerate(data.get("trace_families") or ()))
    if not data.get("scenarios") and not traced:
        raise ExperimentError("experiment: 'scenarios' must list at least one training scenario")
    scen = tuple(_scenario_entry(f"scenarios[{i}]", d, base, holdout=False)
                 for i, d in enumerate(data.get("scenarios") or ())) + traced
    hold = tuple(
        _scenario_entry(f"holdout[{i}]", d, base, holdout=True) for i, d in enumerate(data.get("holdout") or ())
    )
    from rlsched.envs.gpu_pool import DEFAULT_REWARD_WEIGHTS

    reward = dict(data.get("reward") or {})
    _keys("reward", reward, set(DEFAULT_REWARD_WEIGHTS))
    ppo = _sub("ppo", data.get("ppo"), PpoParams)
    if int(data.get("n_envs", 2)) < 1:
        raise ExperimentError(f"n_envs must be >= 1, got {data.get('n_envs')}")
    if ppo.batch_size > ppo.n_steps * int(data.get("n_envs", 2)):
        raise ExperimentError("ppo.batch_size must be <= ppo.n_steps x n_envs")
    vec = str(data.get("vec_env", "subproc"))
    if vec not in ("subproc", "dummy"):
        raise ExperimentError(f"vec_env must be subproc or dummy, got {vec!r}")
    out = str(data.get("output") or "")
    if out:
        p = Path(out)
        out = str(p if p.is_absolute() else (base / p))
    network = dict(data.get("network") or {"hidden": 64})
    _keys("network", network, {"hidden"})
    exp = Experiment(
        name=str(data.get("name") or path.stem), scenarios=scen, description=str(data.get("description") or ""),
        holdout=hold, episode_jobs=int(data.get("episode_jobs", 400)),
        eval_max_jobs=int(data.get("eval_max_jobs", 2000)),
        reward={k: float(v) for k, v in reward.items()}, ppo=ppo, network={k: int(v) for k, v in network.items()},
        window=int(data.get("window", 16)), max_pools=int(data.get("max_pools", 4)),
        nominators=_nominators(data.get("nominators"), int(data.get("window", 16))), n_envs=int(data.get("n_envs", 2)),
        preempt_slots=_preempt_slots(data.get("preempt_slots")),
        extra_globals=_extra_globals(data.get("extra_globals")),
        anchor=_anchor(data.get("anchor"), _nominators(data.get("nominators"), int(data.get("window", 16)))),
        vec_env=vec, total_steps=int(data.get("total_steps", 100_000)), seed=int(data.get("seed", 0)),
        bc=_sub("bc", data.get("bc"), BcParams), eval_every_steps=int(data.get("eval_every_steps", 0)),
        checkpoint_every_steps=int(data.get("checkpoint_every_steps", 25_000)),
        mlflow=_sub("mlflow", data.get("mlflow"), MlflowParams), forecast=_forecast(data.get("forecast")),
        **{name: _rule(name, data.get(name), cls) for name, cls in RULE_PARAMS.items()},
        serve_rules=_serve_rules(data.get("serve_rules"), data),
        gate=_gate(data.get("gate")), generated=_generated(data.get("generated")),
        generated_markets=_generated_markets(data.get("generated_markets")),
        selector=_selector(data.get("selector")),
        init_from=_init_from(data.get("init_from"), base), output=out, source=str(path),
    )
    _check_bc(exp, path)
    for name, v in (("episode_jobs", exp.episode_jobs), ("n_envs", exp.n_envs), ("total_steps", exp.total_steps),
                    ("window", exp.window), ("max_pools", exp.max_pools), ("eval_max_jobs", exp.eval_max_jobs)):
        if v < 1:
            raise ExperimentError(f"{name} must be >= 1, got {v}")
    return exp
