"""The policy network: one small scorer shared by every job slot, pool and action.

A scheduler's decision is a choice among (job, pool) pairs, MIG layouts per pool,
scaling per pool and waiting. Scoring each candidate with the SAME weights (as
RLScheduler's kernel and Decima's per-node network do) makes the policy
permutation-equivariant over job slots and pools and independent of the fleet's
size: the observation summarises each pool whatever its node count, so a model
trained on 4 nodes runs on 500.

The features extractor computes the action logits itself and returns
``[logits | context]``; :class:`SlotScoringPolicy` replaces SB3's linear action
head with a slice that passes those logits through (masking happens in
sb3-contrib's MaskablePPO as usual), and the value head reads the whole vector.

With the codec's running slots (an observation key ``running``, ``preempt_slots`` R > 0)
a running-job encoder joins the others (its mean joins the context) and a preempt head
scores each ``[running_r, ctx]``; its R logits sit between the scale logits and wait's,
in the codec's action order. Without ``running`` the network is exactly the one above.

With an anchored codec (an observation key ``anchor``: the one-hot of a teacher's legal choice)
the logits get :data:`ANCHOR_WEIGHT` times that one-hot added. A network whose own logits are
near zero then acts as its teacher (greedily exactly, sampled with probability ~0.9 against
tens of legal actions), so PPO starts from the heuristic itself rather than from an imperfect
clone of it, and learns where its own scores should outweigh the teacher's choice.

Imports torch and SB3: only ever imported lazily (training, serving a model).
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

#: what an anchored network adds to its teacher's choice: e^6 ~ 400 times the odds of a zero-logit
#: action, so with 40 legal actions the teacher's is sampled with probability ~0.91 at the start
ANCHOR_WEIGHT = 6.0


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out))


class SlotScorer(BaseFeaturesExtractor):
    """Per-candidate scores with shared weights, plus a pooled context for the value.

    Args:
        observation_space: the codec's Dict space (``jobs`` (K, Fj), ``pools`` (P, Fp), ``globals`` (G,),
            and with preempt slots ``running`` (R, Fr)).
        n_layouts: MIG layout slots L per pool (reconfigure actions are P x L).
        hidden: width of every embedding and scorer.
    """

    def __init__(self, observation_space: spaces.Dict, n_layouts: int = 6, hidden: int = 64) -> None:
        jobs, pools, glob = observation_space["jobs"], observation_space["pools"], observation_space["globals"]
        assert jobs.shape is not None and pools.shape is not None and glob.shape is not None
        k, fj = jobs.shape
        p, fp = pools.shape
        g = glob.shape[0]
        self.k, self.p, self.n_layouts, self.hidden = k, p, n_layouts, hidden
        running = observation_space.spaces.get("running")
        r, fr = running.shape if running is not None and running.shape is not None else (0, 0)
        self.r = r
        self.n_actions = k * p + p * n_layouts + 2 * p + r + 1
        super().__init__(observation_space, features_dim=self.n_actions + hidden)
        self.job_enc = _mlp(fj, hidden, hidden)
        self.pool_enc = _mlp(fp, hidden, hidden)
        self.glob_enc = _mlp(g, hidden, hidden)
        self.layout_emb = nn.Embedding(max(n_layouts, 1), hidden)
        self.place_head = _mlp(3 * hidden, hidden, 1)
        self.reconf_head = _mlp(3 * hidden, hidden, 1)
        self.scale_head = _mlp(2 * hidden, hidden, 2)
        self.wait_head = _mlp(hidden, hidden, 1)
        if r:
            self.run_enc = _mlp(fr, hidden, hidden)
            self.preempt_head = _mlp(2 * hidden, hidden, 1)
        #: with an ``anchor`` observation: the weight of the teacher's choice (a buffer: saved, never trained)
        self.anchored = "anchor" in observation_space.spaces
        if self.anchored:
            self.register_buffer("anchor_weight", torch.tensor(ANCHOR_WEIGHT))

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        jobs, pools, glob = obs["jobs"], obs["pools"], obs["globals"]
        b = jobs.shape[0]
        jp = jobs[..., :1]  # present flag of each job slot
        pp = pools[..., :1]
        je = torch.tanh(self.job_enc(jobs)) * jp  # (B, K, H)
        pe = torch.tanh(self.pool_enc(pools)) * pp  # (B, P, H)
        ge = torch.tanh(self.glob_enc(glob))  # (B, H)
        jmean = je.sum(1) / jp.sum(1).clamp(min=1.0)
        pmean = pe.sum(1) / pp.sum(1).clamp(min=1.0)
        ctx = ge + jmean + pmean  # (B, H)
        h = self.hidden
        re = None
        if self.r:
            running = obs["running"]
            rp = running[..., :1]
            re = torch.tanh(self.run_enc(running)) * rp  # (B, R, H)
            ctx = ctx + re.sum(1) / rp.sum(1).clamp(min=1.0)
        # place: (B, K, P) from [job_k, pool_p, ctx]
        pair = torch.cat(
            [
                je.unsqueeze(2).expand(b, self.k, self.p, h),
                pe.unsqueeze(1).expand(b, self.k, self.p, h),
                ctx[:, None, None, :].expand(b, self.k, self.p, h),
            ],
            dim=-1,
        )
        place = self.place_head(pair).reshape(b, self.k * self.p)
        parts = [place]
        if self.n_layouts:
            lay = self.layout_emb.weight[: self.n_layouts]  # (L, H)
            rc = torch.cat(
                [
                    pe.unsqueeze(2).expand(b, self.p, self.n_layouts, h),
                    lay[None, None, :, :].expand(b, self.p, self.n_layouts, h),
                    ctx[:, None, None, :].expand(b, self.p, self.n_layouts, h),
                ],
                dim=-1,
            )
            parts.append(self.reconf_head(rc).reshape(b, self.p * self.n_layouts))
        sc = torch.cat([pe, ctx[:, None, :].expand(b, self.p, h)], dim=-1)
        parts.append(self.scale_head(sc).reshape(b, 2 * self.p))
        if re is not None:
            pr = torch.cat([re, ctx[:, None, :].expand(b, self.r, h)], dim=-1)
            parts.append(self.preempt_head(pr).reshape(b, self.r))
        parts.append(self.wait_head(ctx))
        logits = torch.cat(parts, dim=1)
        if self.anchored:
            weight: torch.Tensor = self.anchor_weight  # type: ignore[assignment]  # a buffer, not a module
            logits = logits + weight * obs["anchor"]
        return torch.cat([logits, ctx], dim=1)


class _TakeLogits(nn.Module):
    """The action 'head': the first ``n`` features are already the logits."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return latent[:, : self.n]


class SlotScoringPolicy(MaskableActorCriticPolicy):
    """MaskablePPO policy whose logits come from :class:`SlotScorer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("features_extractor_class", SlotScorer)
        kwargs.setdefault("net_arch", {"pi": [], "vf": [64, 64]})
        kwargs.setdefault("activation_fn", nn.Tanh)
        super().__init__(*args, **kwargs)

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        extractor = self.features_extractor
        assert isinstance(extractor, SlotScorer)
        self.action_net = _TakeLogits(extractor.n_actions)
        # Re-create the optimizer: the parameters changed after the base class built it.
        self.optimizer = self.optimizer_class(  # type: ignore[call-arg]
            self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs
        )
