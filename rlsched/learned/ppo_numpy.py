"""The policy network's forward pass in numpy, for serving one observation at a time.

:class:`~rlsched.learned.ppo_net.SlotScorer` is small (64-wide MLPs), so a torch
forward at batch 1 is dominated by per-operator dispatch (about 30 module calls),
while the same arithmetic takes a dozen numpy calls. :class:`NumpySlotScorer` evaluates exactly the action logits of
``SlotScorer.forward`` (float32 throughout, same weights, same presence masking
and mean pooling) from weights exported once from the torch module; torch stays
the reference and is used for training.

Mirrored step by step (``H`` = hidden width, ``K`` job slots, ``P`` pool slots,
``L`` layout slots):

* encoders: ``je = tanh(mlp_job(jobs)) * present_k``, ``pe`` likewise for pools,
  ``ge = tanh(mlp_glob(globals))``; ``ctx = ge + sum(je)/max(#present, 1) +
  sum(pe)/max(#present, 1)``;
* heads: each head's first layer acts on a concatenation ``[a, b, c]``, and a
  linear map of a concatenation is the sum of the maps of its parts
  (``W [a; b; c] = Wa a + Wb b + Wc c``). So the place head computes
  ``je @ Wa`` (K x H) and ``pe @ Wb`` (P x H) once and broadcasts them over the
  K x P pairs instead of building the (K, P, 3H) tensor; the reconfigure head's
  layout term ``layout_emb @ Wb`` does not depend on the observation and is
  precomputed. Only the summation order differs from torch's single matmul
  (float32 rounding, ~1e-6 relative);
* equal job (or pool) rows are evaluated once and their results repeated: torch
  gives equal rows bit-equal logits, so the greedy action among identical jobs is
  the first slot; OpenBLAS's small-matrix kernels do not (results for equal rows
  differ in the last bit by row position), which would flip such exact ties.

* running slots (a ``running`` observation, R > 0): ``re = tanh(mlp_run(running)) *
  present_r`` and its mean joins ``ctx``; the preempt head's first layer splits into its
  ``re`` and ``ctx`` parts like the others; its R logits come before wait's.

Only the logits are mirrored; the value (critic) head is not needed to act.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

_F32 = np.float32


def _arr(sd: Mapping[str, Any], key: str) -> np.ndarray:
    v = sd[key]
    if hasattr(v, "detach"):  # a torch tensor
        v = v.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(v, dtype=_F32))


class NumpySlotScorer:
    """``SlotScorer``'s action logits for one observation, in numpy.

    Args:
        state_dict: the module's state dict (torch tensors or arrays); copied.
        k, p: job and pool slots (the codec's window and max_pools).
        n_layouts: layout slots L (0: no reconfigure actions).
        hidden: the hidden width.
        r: running slots R (0: no running encoder, no preempt actions).

    Build it with :meth:`from_module`; the weights are a snapshot taken then.
    """

    def __init__(self, state_dict: Mapping[str, Any], k: int, p: int, n_layouts: int, hidden: int,
                 r: int = 0) -> None:
        sd = state_dict
        h = hidden
        self.k, self.p, self.n_layouts, self.hidden, self.r = k, p, n_layouts, h, r
        self.n_actions = k * p + p * n_layouts + 2 * p + r + 1

        def enc(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            return (_arr(sd, f"{name}.0.weight").T.copy(), _arr(sd, f"{name}.0.bias"),
                    _arr(sd, f"{name}.2.weight").T.copy(), _arr(sd, f"{name}.2.bias"))

        self._job = enc("job_enc")
        self._pool = enc("pool_enc")
        self._glob = enc("glob_enc")
        # First layers of the heads, split by the part of the concatenation they read (transposed: (H_in, H)).
        pw1, pb1 = _arr(sd, "place_head.0.weight"), _arr(sd, "place_head.0.bias")
        sw1, sb1 = _arr(sd, "scale_head.0.weight"), _arr(sd, "scale_head.0.bias")
        ww1, wb1 = _arr(sd, "wait_head.0.weight"), _arr(sd, "wait_head.0.bias")
        self._place_job = pw1[:, :h].T.copy()  # job part of [job, pool, ctx]
        pool_parts = [pw1[:, h:2 * h], sw1[:, :h]]  # pool part of the place and scale heads
        ctx_parts = [pw1[:, 2 * h:], sw1[:, h:], ww1]  # ctx part of place, scale and (all of) wait
        ctx_bias = [pb1, sb1, wb1]
        if n_layouts:
            rw1, rb1 = _arr(sd, "reconf_head.0.weight"), _arr(sd, "reconf_head.0.bias")
            lay = _arr(sd, "layout_emb.weight")[:n_layouts]  # (L, H)
            pool_parts.append(rw1[:, :h])
            ctx_parts.append(rw1[:, 2 * h:])
            ctx_bias.append(rb1)
            # The layout term of [pool, layout, ctx] is a constant of the model: (L, H).
            self._reconf_lay = (lay @ rw1[:, h:2 * h].T).astype(_F32)
            self._reconf_w2 = _arr(sd, "reconf_head.2.weight")[0].copy()
            self._reconf_b2 = _arr(sd, "reconf_head.2.bias")
        if r:
            self._run = enc("run_enc")
            ew1, eb1 = _arr(sd, "preempt_head.0.weight"), _arr(sd, "preempt_head.0.bias")
            self._preempt_run = ew1[:, :h].T.copy()  # running part of [running, ctx]
            ctx_parts.append(ew1[:, h:])
            ctx_bias.append(eb1)
            self._preempt_w2 = _arr(sd, "preempt_head.2.weight")[0].copy()
            self._preempt_b2 = _arr(sd, "preempt_head.2.bias")
        # pe @ _pool_w -> [place | scale | reconf] first-layer terms, (P, 2H or 3H)
        self._pool_w = np.ascontiguousarray(np.concatenate(pool_parts, axis=0).T)
        # ctx @ _ctx_w + _ctx_b -> [place | scale | wait | reconf | preempt] first-layer terms incl. biases
        self._ctx_w = np.ascontiguousarray(np.concatenate(ctx_parts, axis=0).T)
        self._ctx_b = np.concatenate(ctx_bias).astype(_F32)
        self._place_w2 = _arr(sd, "place_head.2.weight")[0].copy()
        self._place_b2 = _arr(sd, "place_head.2.bias")
        self._scale_w2 = _arr(sd, "scale_head.2.weight").T.copy()  # (H, 2)
        self._scale_b2 = _arr(sd, "scale_head.2.bias")
        self._wait_w2 = _arr(sd, "wait_head.2.weight")[0].copy()
        self._wait_b2 = _arr(sd, "wait_head.2.bias")
        #: an anchored network's weight of its teacher's choice (None: not anchored)
        self._anchor = float(_arr(sd, "anchor_weight").reshape(-1)[0]) if "anchor_weight" in sd else None

    @classmethod
    def from_module(cls, net: Any) -> NumpySlotScorer:
        """Export a :class:`~rlsched.learned.ppo_net.SlotScorer`'s current weights."""
        return cls(net.state_dict(), k=int(net.k), p=int(net.p), n_layouts=int(net.n_layouts),
                   hidden=int(net.hidden), r=int(getattr(net, "r", 0)))

    @staticmethod
    def _mlp(x: np.ndarray, w: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """``tanh(Linear -> Tanh -> Linear)``: an encoder followed by the forward's tanh."""
        w1, b1, w2, b2 = w
        return np.tanh(np.tanh(x @ w1 + b1) @ w2 + b2)

    def logits(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """Action logits (float32, shape ``(n_actions,)``) of one observation (no batch dimension)."""
        jobs = np.ascontiguousarray(obs["jobs"], dtype=_F32)
        pools = np.ascontiguousarray(obs["pools"], dtype=_F32)
        glob = np.asarray(obs["globals"], dtype=_F32)
        h = self.hidden
        # Equal rows (identical jobs, empty slots) are evaluated once, so their logits tie
        # exactly as torch's do and argmax picks the first slot like the torch path (BLAS
        # kernels need not give bit-equal results for equal rows at different positions).
        ju, jinv = _unique_rows(jobs)
        pu, pinv = _unique_rows(pools)
        je_u = self._mlp(ju, self._job) * ju[:, :1]  # (Uk, H)
        pe_u = self._mlp(pu, self._pool) * pu[:, :1]  # (Up, H)
        ge = self._mlp(glob, self._glob)  # (H,)
        je = je_u if jinv is None else je_u[jinv]  # (K, H)
        pe = pe_u if pinv is None else pe_u[pinv]  # (P, H)
        jmean = je.sum(0) / max(jobs[:, 0].sum(), _F32(1.0))
        pmean = pe.sum(0) / max(pools[:, 0].sum(), _F32(1.0))
        ctx = ge + jmean + pmean
        re = None
        if self.r:
            running = np.ascontiguousarray(obs["running"], dtype=_F32)
            re = self._mlp(running, self._run) * running[:, :1]  # (R, H)
            ctx = ctx + re.sum(0) / max(running[:, 0].sum(), _F32(1.0))
        pt = pe_u @ self._pool_w  # (Up, 2H or 3H)
        ct = ctx @ self._ctx_w + self._ctx_b  # (3H or 4H,)
        # place: (K, P) from [job_k, pool_p, ctx]
        hid = np.tanh((je_u @ self._place_job)[:, None, :] + pt[None, :, :h] + ct[:h])
        place = hid @ self._place_w2 + self._place_b2  # (Uk, Up)
        if jinv is not None:
            place = place[jinv]
        if pinv is not None:
            place = place[:, pinv]
        # scale: (P, 2) from [pool_p, ctx]
        scale = np.tanh(pt[:, h:2 * h] + ct[h:2 * h]) @ self._scale_w2 + self._scale_b2
        # wait: ctx alone
        wait = np.tanh(ct[2 * h:3 * h]) @ self._wait_w2 + self._wait_b2  # (1,)
        parts = [place.ravel()]
        if self.n_layouts:
            # reconfigure: (P, L) from [pool_p, layout_l, ctx]
            hr = np.tanh(pt[:, None, 2 * h:] + self._reconf_lay[None, :, :] + ct[3 * h:4 * h])
            reconf = hr @ self._reconf_w2 + self._reconf_b2  # (Up, L)
            parts.append((reconf if pinv is None else reconf[pinv]).ravel())
        parts.append((scale if pinv is None else scale[pinv]).ravel())
        if re is not None:
            # preempt: (R,) from [running_r, ctx]; its ctx terms follow reconfigure's (if any)
            c0 = (4 if self.n_layouts else 3) * h
            preempt = np.tanh(re @ self._preempt_run + ct[c0:c0 + h]) @ self._preempt_w2 + self._preempt_b2
            parts.append(preempt)
        parts.append(wait)
        out = np.concatenate(parts).astype(_F32, copy=False)
        if self._anchor is not None:
            out = out + _F32(self._anchor) * np.asarray(obs["anchor"], dtype=_F32)
        return out


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The distinct rows of ``a`` (first occurrences, in order) and, if any repeat, each row's index among them."""
    n = a.shape[0]
    width = a.shape[1] * a.itemsize
    raw = a.tobytes()
    seen: dict[bytes, int] = {}
    first: list[int] = []
    inv: list[int] = []
    for i in range(n):
        key = raw[i * width:(i + 1) * width]
        j = seen.get(key)
        if j is None:
            j = seen[key] = len(first)
            first.append(i)
        inv.append(j)
    if len(first) == n:
        return a, None
    return a[first], np.array(inv, dtype=np.intp)
