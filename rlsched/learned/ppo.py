"""Trained PPO policies: the model folder, loading, and the policy as a Scheduler.

A model folder (``models/<name>/``) holds:

* ``policy.pt`` - the policy network's weights (``torch.save`` of a state dict)
  plus the constructor arguments needed to rebuild it;
* ``codec.json`` - the observation codec's parameters and signature;
* ``card.json`` / ``MODEL_CARD.md`` - the model card (training data, steps, seed,
  wall time, metrics against every heuristic, MLflow run id);
* ``forecaster.json`` (optional) - the demand forecaster it was trained with;
* ``deadline_guard.json``, ``consolidate.json``, ``preempt_long.json`` (optional) - the
  parameters of the rules it was trained behind (:mod:`rlsched.policies.rules`: the
  deadline guard, node consolidation, long-job preemption); :class:`PpoScheduler` runs
  them before the network at every decision point, as the training environment did;
* ``actions.json`` - the action kinds it was trained with, per pool kind
  (:class:`~rlsched.envs.trained_actions.TrainedActions`, written by the trainer from
  its training fleets). A folder without it loads with the conservative record
  (placement on any pool kind and waiting; no MIG reconfiguration, no scaling).

A model never acts outside what it learned: its codec masks every action kind the
record lacks on the fleet it is served on, and :class:`PpoScheduler` hands those kinds
to a complementing heuristic (:class:`Complement`, weighted-priority restricted to
them): jobs go to the pools the model may not place in, elastic pools it may not
scale are bought for by the heuristic's autoscaler (and stopped by the idle stop), MIG
GPUs it may not re-split are re-split for blocked jobs. On a fleet inside the record
nothing changes.

Serving uses neither SB3's ``predict`` nor torch: the weights are exported
once, when the model is built, to :class:`~rlsched.learned.ppo_numpy.NumpySlotScorer`,
which evaluates the same logits in numpy (a batch-1 torch forward is dominated
by per-operator overhead, not arithmetic). torch loads the weights and
remains the reference (:meth:`PolicyModel.torch_logits`) and the training path. A model whose codec signature differs
from the runtime's is refused with :class:`ModelError` (the fallback guard then
keeps the heuristic).

``--policy ppo:PATH`` (a model folder) or ``--policy ppo:models:/NAME@ALIAS``
(the MLflow registry) runs a trained policy exactly like a heuristic.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlsched.cluster.decisions import Decision
from rlsched.cluster.model import ClusterState
from rlsched.envs.codec import ObservationCodec
from rlsched.envs.teacher_actions import acts_itself
from rlsched.envs.trained_actions import ACTIONS_FILE, TrainedActions
from rlsched.errors import RlschedError
from rlsched.learned.complement import Complement
from rlsched.learned.ppo_numpy import NumpySlotScorer
from rlsched.policies.rules import RULES, Rule, RuleParams, build_rules, owned_actions, rule_file, run_rules

if TYPE_CHECKING:
    from rlsched.learned.selector import SelectorModel, SelectorScheduler

POLICY_FILE = "policy.pt"
CODEC_FILE = "codec.json"
CARD_FILE = "card.json"
#: Optional: the demand forecaster the model was trained with (see :func:`load_model_forecast`).
FORECASTER_FILE = "forecaster.json"


class ModelError(RlschedError):
    """A model that cannot be loaded or served (missing, corrupted, mismatched)."""


class PolicyModel:
    """A loaded policy network: observation + mask -> action.

    Args:
        net: the :class:`~rlsched.learned.ppo_net.SlotScorer` with trained weights.
        codec_params: ``window``, ``max_pools``, ``layouts``, ``nominators``, ``preempt_slots`` (absent: 0),
            ``extra_globals`` (absent: none) and ``anchor`` (absent: None)
            of the codec it was trained with.
        signature: the codec signature recorded at training time.
        card: the model card (may be empty).
        trained_actions: the action kinds it was trained with; None = every action
            (a network still training, test doubles). :meth:`load` reads the folder's.

    The logits come from a numpy copy of the network's weights taken here
    (:attr:`numpy_net`); a model built on a network that is still training must be
    rebuilt to see newer weights. Setting ``numpy_net = None`` forces the torch path.
    """

    def __init__(self, net: Any, codec_params: dict[str, Any], signature: str, card: dict[str, Any],
                 trained_actions: TrainedActions | None = None) -> None:
        self.net = net
        self.codec_params = codec_params
        self.signature = signature
        self.card = card
        self.trained_actions = trained_actions
        #: numpy mirror of ``net`` used by :meth:`logits`; None when ``net`` is not a SlotScorer
        self.numpy_net: NumpySlotScorer | None = _numpy_mirror(net)
        #: the demand forecaster it was trained with, if its folder has one (set by load_policy_ref).
        self.forecast: ModelForecast | None = None
        #: constructor arguments of the rules it was trained behind, by rule name (set by :meth:`load`).
        self.rule_params: dict[str, dict[str, Any]] = {}

    @property
    def guard_params(self) -> dict[str, Any] | None:
        """The deadline guard's constructor arguments (None: trained without one)."""
        return self.rule_params.get("deadline_guard")

    def new_rules(self) -> list[Rule]:
        """Fresh rules like the ones the model was trained behind, in acting order (empty: none)."""
        return build_rules(self.rule_params)

    def scheduler(self, name: str | None = None) -> PpoScheduler:
        """A scheduler serving this model (what :func:`make_ppo_policy` gives for its folder)."""
        return PpoScheduler(self, name=name or "ppo")

    def new_codec(self) -> ObservationCodec:
        """A codec like the one the model was trained with (checked against the signature).

        It masks the actions outside :attr:`trained_actions`.
        """
        p = self.codec_params
        codec = ObservationCodec(p["window"], p["max_pools"], p["layouts"], nominators=p.get("nominators", ()),
                                 preempt_slots=p.get("preempt_slots", 0),
                                 extra_globals=p.get("extra_globals", ())
                                 ).anchor_to(p.get("anchor")).restrict(self.trained_actions)
        if codec.signature() != self.signature:
            raise ModelError(
                f"observation signature mismatch: model expects {self.signature}, this rlsched encodes "
                f"{codec.signature()} (features or action layout changed); retrain or use a matching version"
            )
        return codec

    def logits(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Raw action logits for one observation (no batch dimension)."""
        if self.numpy_net is not None:
            return self.numpy_net.logits(obs)
        return self.torch_logits(obs)

    def torch_logits(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """:meth:`logits` through the torch module (the reference; slower at batch 1)."""
        import torch

        with torch.no_grad():
            t = {k: torch.as_tensor(v, dtype=torch.float32).unsqueeze(0) for k, v in obs.items()}
            out = self.net(t)[0, : self.net.n_actions]
        return out.numpy()

    def act(self, obs: dict[str, np.ndarray], mask: np.ndarray) -> int:
        """The greedy legal action; raises ModelError on non-finite output."""
        logits = self.logits(obs)
        if not np.all(np.isfinite(logits)):
            raise ModelError("policy produced non-finite logits")
        masked = np.where(mask, logits, -np.inf)
        return int(np.argmax(masked))

    # ------------------------------------------------------------------ persistence
    @staticmethod
    def save(folder: Path | str, net: Any, codec: ObservationCodec, card: dict[str, Any] | None = None,
             rules: RuleParams | None = None, trained_actions: TrainedActions | None = None) -> Path:
        """Write a model folder (weights, codec, card, the action kinds it was trained with, and
        the parameters of each rule it was trained behind)."""
        import torch

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        payload = {"state_dict": net.state_dict(), "hidden": net.hidden, "n_layouts": net.n_layouts,
                   "format": 1}
        tmp = folder / (POLICY_FILE + ".tmp")
        torch.save(payload, tmp)
        tmp.replace(folder / POLICY_FILE)
        (folder / CODEC_FILE).write_text(json.dumps(
            {"signature": codec.signature(), "window": codec.window, "max_pools": codec.max_pools,
             "layouts": codec.layouts, "nominators": list(codec.nomination.names) if codec.nomination else [],
             **({"preempt_slots": codec.preempt_slots} if codec.preempt_slots else {}),
             **({"extra_globals": list(codec.extra_globals)} if codec.extra_globals else {}),
             **({"anchor": codec.anchor} if codec.anchor is not None else {}),
             "describe": codec.describe()}, indent=2, default=str) + "\n")
        if card is not None:
            (folder / CARD_FILE).write_text(json.dumps(card, indent=2, default=str) + "\n")
        actions_path = folder / ACTIONS_FILE
        if trained_actions is not None:
            actions_path.write_text(json.dumps(trained_actions.to_dict(), indent=2) + "\n")
        elif actions_path.exists():
            actions_path.unlink()  # an old record must not describe a new network
        for name in RULES:
            path = folder / rule_file(name)
            args = (rules or {}).get(name)
            if args is not None:
                path.write_text(json.dumps(dict(args), indent=2) + "\n")
            elif path.exists():
                path.unlink()  # a model trained without a rule must not be served with an old one
        return folder

    @classmethod
    def load(cls, folder: Path | str) -> PolicyModel:
        """Load a model folder; every failure is a :class:`ModelError` naming the file."""
        folder = Path(folder)
        if not folder.is_dir():
            raise ModelError(f"{folder}: model folder not found")
        params, signature = _read_codec_file(folder)
        import torch

        from rlsched.learned.ppo_net import SlotScorer

        policy_path = folder / POLICY_FILE
        try:
            payload = torch.load(policy_path, map_location="cpu", weights_only=True)
            codec = ObservationCodec(params["window"], params["max_pools"], params["layouts"],
                                     nominators=params.get("nominators", ()), preempt_slots=params["preempt_slots"],
                                     extra_globals=params["extra_globals"]).anchor_to(params["anchor"])
            net = SlotScorer(codec.observation_space, n_layouts=int(payload["n_layouts"]),
                             hidden=int(payload["hidden"]))
            net.load_state_dict(payload["state_dict"])
        except FileNotFoundError:
            raise ModelError(f"{policy_path}: missing") from None
        except Exception as exc:  # torch raises many types for a damaged file
            raise ModelError(f"{policy_path}: cannot load policy weights ({type(exc).__name__}: {exc})") from None
        net.eval()
        card: dict[str, Any] = {}
        card_path = folder / CARD_FILE
        if card_path.exists():
            try:
                card = json.loads(card_path.read_text())
            except ValueError as exc:
                raise ModelError(f"{card_path}: corrupted ({exc})") from None
        model = cls(net, params, signature, card, load_trained_actions(folder))
        for name in RULES:
            path = folder / rule_file(name)
            if not path.exists():
                continue
            try:
                args = dict(json.loads(path.read_text()))
                build_rules({name: args})
            except (ValueError, TypeError) as exc:
                raise ModelError(f"{path}: corrupted ({exc})") from None
            model.rule_params[name] = args
        return model



def _read_codec_file(folder: Path) -> tuple[dict[str, Any], str]:
    """A model folder's codec parameters and signature; a :class:`ModelError` names what is wrong."""
    codec_path = folder / CODEC_FILE
    try:
        meta = json.loads(codec_path.read_text())
        params: dict[str, Any] = {k: int(meta[k]) for k in ("window", "max_pools", "layouts")}
        params["nominators"] = tuple(str(n) for n in meta.get("nominators", ()))
        params["preempt_slots"] = int(meta.get("preempt_slots", 0))
        params["extra_globals"] = tuple(str(n) for n in meta.get("extra_globals", ()))
        params["anchor"] = None if meta.get("anchor") is None else str(meta["anchor"])
        signature = str(meta["signature"])
    except FileNotFoundError:
        from rlsched.learned.selector import is_selector_folder

        if is_selector_folder(folder):
            # retrain's --from and an experiment's init_from need per-slot weights; say what the folder is
            raise ModelError(f"{folder}: a heuristic selector cannot be fine-tuned or warm-started from (it "
                             f"has no per-slot network: {CODEC_FILE}, {POLICY_FILE}); per-slot models such "
                             f"as models/scorer can") from None
        raise ModelError(f"{codec_path}: missing (not a model folder?)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{codec_path}: corrupted ({exc})") from None
    if params["anchor"] is not None and not acts_itself(params["anchor"], params["nominators"]):
        raise ModelError(f"{codec_path}: unknown anchor teacher {params['anchor']!r} (a codec-space teacher that "
                         "acts itself)")
    return params, signature

def load_trained_actions(folder: Path | str) -> TrainedActions:
    """The folder's ``actions.json``, or the conservative record when it has none (see the module doc)."""
    path = Path(folder) / ACTIONS_FILE
    if not path.exists():
        return TrainedActions.conservative(f"assumed: {path} is missing (place and wait only)")
    try:
        return TrainedActions.from_dict(json.loads(path.read_text()))
    except ValueError as exc:
        raise ModelError(f"{path}: corrupted ({exc})") from None


def _numpy_mirror(net: Any) -> NumpySlotScorer | None:
    """A numpy copy of ``net`` if it is a :class:`~rlsched.learned.ppo_net.SlotScorer` (else None)."""
    if not hasattr(net, "state_dict"):
        return None  # not a torch module (test doubles): served through torch_logits
    from rlsched.learned.ppo_net import SlotScorer

    return NumpySlotScorer.from_module(net) if type(net) is SlotScorer else None


#: Fetches a ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` URI into a local model folder
#: (the MLflow registry's is :func:`rlsched.train.registry.download_model`).
ModelFetcher = Callable[[str], Path]


def load_model_folder(folder: Path | str) -> PolicyModel | SelectorModel:
    """The model in ``folder``, whichever kind it is: a heuristic selector (``selector.json``) or a
    per-slot network (``policy.pt``). Both have ``card``, ``signature`` and ``scheduler(name)``."""
    from rlsched.learned.selector import SelectorModel, is_selector_folder

    if is_selector_folder(folder):
        return SelectorModel.load(folder)
    return PolicyModel.load(folder)


def load_policy_ref(ref: str, fetch: ModelFetcher | None = None) -> PolicyModel | SelectorModel:
    """A model from a folder path or an MLflow ``models:/NAME@ALIAS`` / ``models:/NAME/VERSION`` URI.

    A URI is fetched with ``fetch``: the registry lives above this layer, so the caller
    that accepts URIs passes its fetcher. The model's demand forecaster
    (``forecaster.json``), if any, is in ``model.forecast``. A folder with a
    ``selector.json`` is a heuristic selector (:mod:`rlsched.learned.selector`); both kinds
    give their scheduler with ``model.scheduler(name)``.
    """
    folder: Path | str = ref
    if ref.startswith("models:/"):
        if fetch is None:
            raise ModelError(f"{ref}: a models:/ URI needs a registry fetcher "
                             "(e.g. rlsched.train.registry.download_model); none was given")
        folder = fetch(ref)
    model = load_model_folder(folder)
    if not isinstance(model, PolicyModel):
        return model
    model.forecast = load_model_forecast(folder)
    return model


class PpoScheduler:
    """A trained policy driving the simulator or the runtime like any heuristic.

    At each decision point it first lets the rules the model was trained behind (its
    deadline guard, node consolidation; :mod:`rlsched.policies.rules`) act, then
    encodes the state, takes the greedy legal action, yields its decision, and repeats
    until the policy chooses to wait (or only waiting is legal, or ``max_actions``
    decisions were made at this point) - the same loop the environment presents
    during training. Actions outside the model's trained kinds are masked; when the
    fleet offers such kinds, :attr:`complement` (weighted-priority restricted to them)
    acts after the network. ``use_rules=False`` serves the network alone (for measuring
    what the rules add).
    """

    def __init__(self, model: PolicyModel, name: str = "ppo", max_actions: int = 256,
                 use_rules: bool = True) -> None:
        self.model = model
        self.name = name
        self.max_actions = max_actions
        self.rules = model.new_rules() if use_rules else []
        self.codec = model.new_codec()
        trained = model.trained_actions
        #: the heuristic taking the action kinds the model lacks (None: it was trained with every kind)
        ruled = owned_actions(model.rule_params) if use_rules else frozenset()
        self.complement = Complement(trained, self.codec.max_pools, ruled) if trained is not None else None
        self._arrived = 0

    def reset(self, state: ClusterState) -> None:
        self.codec = self.model.new_codec()
        self._arrived = 0
        for rule in self.rules:
            rule.reset(state)
        if self.complement is not None:
            self.complement.reset(state)

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        codec = self.codec
        yield from decide_through_codec(codec, state, lambda mask: self.model.act(codec.encode(state), mask),
                                        self.max_actions, rules=self.rules)
        if self.complement is not None:
            yield from self.complement.decide(state)


def decide_through_codec(codec: ObservationCodec, state: ClusterState, choose: Callable[[np.ndarray], int],
                         max_actions: int = 256, rules: Sequence[Rule] = ()) -> Iterator[Decision]:
    """The environment's decision loop at one decision point, for anything that picks codec actions.

    ``rules`` (the rules it was trained behind, if any) act first, as the environment
    applies them after every advance of time. Then ``choose(mask)`` returns a
    legal action of the current state; each is decoded and yielded (the caller applies
    it) until the chooser waits, only waiting is legal, or ``max_actions`` decisions were
    made. A trained policy and a behaviour-cloning teacher both run through it, so they
    act exactly as the environment let them during training.
    """
    yield from run_rules(rules, state)
    # Follow the state so that one step's mask/only_wait/encode/decode share one cache
    # refresh; everything is invalidated before each step (the caller may have changed
    # anything while this generator was suspended), so the results equal an untracked codec's.
    codec.track(state)
    for _ in range(max_actions):
        codec.invalidate(None)
        if codec.only_wait(state):
            return
        mask = codec.legal(state)
        decision = codec.decode(choose(mask), state)
        if decision is None:
            return
        yield decision


def make_ppo_policy(ref: str, name: str | None = None,
                    fetch: ModelFetcher | None = None) -> PpoScheduler | SelectorScheduler:
    """``ppo:REF`` for ``--policy``: REF is a model folder or a ``models:/`` URI (fetched with ``fetch``);
    a per-slot model or a heuristic selector, whichever the folder holds."""
    model = load_policy_ref(ref, fetch)
    label = name or (f"ppo:{Path(ref).name}" if not ref.startswith("models:/") else f"ppo:{ref}")
    return model.scheduler(label)


class ModelForecast:
    """The fitted demand forecaster saved with a model, and the horizon it was trained with.

    A policy trained with a forecast sees its total in the observation's demand
    signal, so replays of it should run the engine with it: ``new()`` gives each
    engine its own fresh copy (forecasters learn online while they replay).
    """

    def __init__(self, forecaster: Any, horizon_s: float, fitted_on: str = "") -> None:
        self.forecaster = forecaster
        self.horizon_s = horizon_s
        self.fitted_on = fitted_on

    def new(self) -> Any:
        """A fresh copy for one engine."""
        from rlsched.workload.forecast import fresh_forecaster

        return fresh_forecaster(self.forecaster)


def load_model_forecast(folder: Path | str) -> ModelForecast | None:
    """The model folder's ``forecaster.json``, or None when it has none (older models)."""
    path = Path(folder) / FORECASTER_FILE
    if not path.exists():
        return None
    from rlsched.workload.forecast import forecaster_from_dict

    try:
        doc = json.loads(path.read_text())
        return ModelForecast(forecaster_from_dict(doc["forecaster"]), float(doc["horizon_s"]),
                             str(doc.get("fitted_on", "")))
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path}: corrupted ({exc})") from None


def policy_forecast(scheduler: Any) -> ModelForecast | None:
    """The forecaster of a scheduler built from a model folder (None for heuristics and older models)."""
    model = getattr(scheduler, "model", None)
    return getattr(model, "forecast", None) if isinstance(model, PolicyModel) else None

