"""A learned heuristic selector: the model folder, loading, and the selector as a Scheduler.

A selector model chooses, every ``hold_s`` simulated (or live) seconds, which of a few
registered heuristics schedules the cluster until the next choice
(:class:`~rlsched.envs.selector_env.SelectorEnv` is its training environment). It reads
only the :mod:`~rlsched.envs.regime` features, so it is served on any fleet - on-prem,
MIG, elastic - without a codec, a trained-action record or a complement: every decision
it yields is one its chosen heuristic made, so it can neither livelock nor act outside
what a heuristic does.

A selector folder holds:

* ``selector.json`` - the candidates, ``hold_s``, the feature names and the policy
  network's weights (an MLP: tanh hidden layers, one logit per candidate), exported from
  the trained SB3 ``MaskablePPO`` policy so serving needs neither torch nor SB3;
* ``card.json`` / ``MODEL_CARD.md`` - the model card, as for a per-slot model.

:func:`rlsched.learned.ppo.load_policy_ref` loads either kind of folder, so
``--policy ppo:FOLDER``, the generalisation benchmark and the promotion gate treat a
selector like any other model.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.cluster.decisions import Decision
from rlsched.cluster.model import ClusterState
from rlsched.envs.regime import REGIME_FEATURES, regime_features
from rlsched.errors import RlschedError
from rlsched.learned.ppo import ModelError

SELECTOR_FILE = "selector.json"
CARD_FILE = "card.json"
#: version of the selector folder format (bumped when the file's meaning changes): 2 adds the safe
#: default and the margin; a format-1 folder is read as having neither (plain argmax)
FORMAT = 2
_READS = (1, 2)


class SelectorError(ModelError):
    """A selector folder that cannot be loaded or served (missing, corrupted, mismatched); a
    :class:`~rlsched.learned.ppo.ModelError`, so every caller that refuses a bad model refuses it."""


def is_selector_folder(folder: Path | str) -> bool:
    """Whether ``folder`` holds a selector model (its ``selector.json``)."""
    return (Path(folder) / SELECTOR_FILE).is_file()


@dataclass
class SelectorModel:
    """A trained selector: regime features -> one of ``candidates``.

    Attributes:
        candidates: registered heuristic names, one per logit.
        hold_s: seconds one choice holds.
        layers: ``(weight, bias)`` per layer, tanh between layers, the last one's outputs the logits.
        features: the regime feature names the network reads (must be :data:`REGIME_FEATURES`).
        card: the model card.
        default: the candidate chosen when the network is unsure (None: always the argmax).
        margin: how much more probability (softmax of the logits) another candidate must have than
            ``default`` to be chosen instead; 0 is the plain argmax.
    """

    candidates: tuple[str, ...]
    hold_s: float
    layers: list[tuple[np.ndarray, np.ndarray]]
    features: tuple[str, ...] = REGIME_FEATURES
    card: dict[str, Any] = field(default_factory=dict)
    #: a selector is trained without a forecaster and behind no rules (the loader's common surface)
    forecast: Any = None
    rule_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    default: str | None = None
    margin: float = 0.0

    def __post_init__(self) -> None:
        if self.features != REGIME_FEATURES:
            raise SelectorError(f"the model reads regime features {list(self.features)}, this rlsched computes "
                                f"{list(REGIME_FEATURES)}; retrain it")
        if len(self.candidates) < 2:
            raise SelectorError("a selector needs at least two candidates")
        if not self.layers or self.layers[-1][0].shape[0] != len(self.candidates):
            raise SelectorError("the network's outputs do not match its candidates")
        if self.layers[0][0].shape[1] != len(self.features):
            raise SelectorError("the network's inputs do not match its features")
        if self.default is not None and self.default not in self.candidates:
            raise SelectorError(f"default {self.default!r} is not one of the candidates {list(self.candidates)}")
        if not 0.0 <= self.margin < 1.0 or (self.margin > 0 and self.default is None):
            raise SelectorError(f"margin must be in [0, 1) and needs a default, got {self.margin!r} / {self.default!r}")

    @property
    def signature(self) -> str:
        """What the network reads and chooses between (features, candidates), hashed."""
        text = json.dumps({"features": list(self.features), "candidates": list(self.candidates)})
        return "selector-v1:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The network's logits for one feature vector."""
        h = np.asarray(x, dtype=np.float64)
        for i, (w, b) in enumerate(self.layers):
            h = w @ h + b
            if i < len(self.layers) - 1:
                h = np.tanh(h)
        return h

    def choose_features(self, x: np.ndarray) -> int:
        """The candidate's index for one regime feature vector (see :meth:`pick`)."""
        return self.pick(self.logits(x))

    def pick(self, logits: np.ndarray) -> int:
        """The network's choice, unless it is unsure: then :attr:`default`.

        Unsure means the rated-best candidate's probability (softmax of the logits) exceeds the
        default's by less than :attr:`margin`. The network imitates soft labels, so on most
        states its probabilities are close together, and an argmax between near-equal
        probabilities is a coin toss - harmless where the candidates tie, ruinous where one of
        them starts the wrong long jobs on an unfamiliar trace. The default is the candidate
        whose worst labelled state was mildest (:meth:`~rlsched.train.selector_labels.SelectorLabels.safest`).
        """
        best = int(np.argmax(logits))
        if self.margin <= 0 or self.default is None:
            return best
        d = self.candidates.index(self.default)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return best if p[best] - p[d] >= self.margin else d

    def new_rules(self) -> list[Any]:
        """No rules: a selector's heuristics carry their own behaviour."""
        return []

    def scheduler(self, name: str | None = None) -> SelectorScheduler:
        """A fresh scheduler serving this model."""
        return SelectorScheduler(self, name=name)

    # ------------------------------------------------------------------ folder
    @classmethod
    def from_sb3(cls, policy: Any, candidates: Sequence[str], hold_s: float,
                 card: dict[str, Any] | None = None, *, default: str | None = None,
                 margin: float = 0.0) -> SelectorModel:
        """Export an SB3 ``MlpPolicy`` (Linear/Tanh policy net, then the action net) to numpy."""
        import torch

        linears = [m for m in policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)]
        linears.append(policy.action_net)
        acts = [m for m in policy.mlp_extractor.policy_net if not isinstance(m, torch.nn.Linear)]
        if any(not isinstance(a, torch.nn.Tanh) for a in acts):
            raise SelectorError("only tanh MLP policies can be exported")
        layers = [(m.weight.detach().cpu().numpy().astype(np.float64), m.bias.detach().cpu().numpy().astype(np.float64))
                  for m in linears]
        return cls(tuple(candidates), float(hold_s), layers, card=dict(card or {}), default=default,
                   margin=float(margin))

    def save(self, folder: Path | str) -> Path:
        """Write ``selector.json`` and ``card.json`` into ``folder`` (created)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "kind": "selector", "candidates": list(self.candidates), "hold_s": self.hold_s,
               "features": list(self.features), "signature": self.signature,
               "default": self.default, "margin": self.margin,
               "layers": [{"weight": w.tolist(), "bias": b.tolist()} for w, b in self.layers]}
        (out / SELECTOR_FILE).write_text(json.dumps(doc) + "\n")
        (out / CARD_FILE).write_text(json.dumps(self.card, indent=2, default=str) + "\n")
        return out

    @classmethod
    def load(cls, folder: Path | str) -> SelectorModel:
        """Read a selector folder; :class:`SelectorError` names what is wrong with it."""
        path = Path(folder) / SELECTOR_FILE
        if not path.is_file():
            raise SelectorError(f"{path}: not found (not a selector model folder)")
        try:
            doc = json.loads(path.read_text())
            if int(doc.get("format", 0)) not in _READS:
                raise SelectorError(f"{path}: format {doc.get('format')!r}, this rlsched reads "
                                    f"{', '.join(map(str, _READS))}")
            layers = [(np.asarray(layer["weight"], dtype=np.float64), np.asarray(layer["bias"], dtype=np.float64))
                      for layer in doc["layers"]]
            card_path = Path(folder) / CARD_FILE
            card = json.loads(card_path.read_text()) if card_path.is_file() else {}
            default = doc.get("default")
            model = cls(tuple(str(c) for c in doc["candidates"]), float(doc["hold_s"]), layers,
                        tuple(str(f) for f in doc["features"]), card,
                        default=None if default is None else str(default), margin=float(doc.get("margin", 0.0)))
        except SelectorError:
            raise
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise SelectorError(f"{path}: corrupted ({exc})") from None
        from rlsched.policies import make_policy

        for name in model.candidates:
            try:
                make_policy(name)
            except RlschedError as exc:
                raise SelectorError(f"{path}: candidate {name!r}: {exc}") from None
        return model


class SelectorScheduler:
    """A :class:`SelectorModel` driving the simulator or the runtime like any heuristic.

    At the first decision point, and at the first one ``hold_s`` or more after the last
    choice, the network picks a candidate from the regime features; that heuristic then
    decides every decision point until the next choice - the cadence the training
    environment used. Every candidate sees :meth:`reset`, and again whenever it takes over from
    another (as in training), so a heuristic with memory starts from the state it is handed;
    only the chosen one decides.
    :attr:`choices` counts how often each candidate was chosen (for reports and audits), and
    :attr:`overruled` how often the network preferred a candidate but was unsure enough that the
    model's default scheduled instead (keyed by the candidate it preferred).
    """

    def __init__(self, model: SelectorModel, name: str | None = None) -> None:
        from rlsched.policies import make_policy

        self.model = model
        self.name = name or "selector"
        self.heuristics = [make_policy(c) for c in model.candidates]
        self.choices: Counter[str] = Counter()
        self.overruled: Counter[str] = Counter()
        self.current = 0
        self._next_pick = -float("inf")
        # the loader's common surface with PpoScheduler (the service filters rules, tweaks a complement)
        self.rules: list[Any] = []
        self.complement = None

    def reset(self, state: ClusterState) -> None:
        """Forget the last choice; reset every candidate."""
        for h in self.heuristics:
            h.reset(state)
        self.choices.clear()
        self.overruled.clear()
        self.current = 0
        self._next_pick = -float("inf")

    def decide(self, state: ClusterState) -> Iterator[Decision]:
        """The chosen heuristic's decisions (a new choice when the last one has held ``hold_s``)."""
        if state.time >= self._next_pick:
            logits = self.model.logits(regime_features(state))
            pick = self.model.pick(logits)
            preferred = int(np.argmax(logits))
            if pick != preferred:
                self.overruled[self.model.candidates[preferred]] += 1
            if pick != self.current:
                # as in training: a heuristic's memory (Tiresias' queues) starts from the state it takes over
                self.heuristics[pick].reset(state)
            self.current = pick
            self.choices[self.model.candidates[self.current]] += 1
            self._next_pick = state.time + self.model.hold_s
        yield from self.heuristics[self.current].decide(state)
