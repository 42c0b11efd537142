"""Warm start: begin training from the weights of a model that already serves (``init_from:``).

A team that fine-tunes on its own cluster's history starts from the model it serves
(``models:/rlsched-ppo@champion``) or any model folder, not from scratch: the new network's
scorer gets that model's weights, so training departs from what already works. The
weights only mean the same thing when the observation layout does, so the codec
signature of the model must equal the experiment's (same window, pools, layouts and
nominators) and so must the network's width; otherwise training stops with one line
saying which differs. Behaviour cloning is skipped: it would overwrite the weights.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlsched.train.config import Experiment, ExperimentError


def warm_start(model: Any, exp: Experiment, codec_signature: str, log: Callable[[str], None]) -> str:
    """Load ``exp.init_from``'s scorer weights into ``model`` (a MaskablePPO); returns what was loaded.

    Raises:
        ExperimentError: the source cannot be loaded, or its codec signature or width differ.
    """
    from rlsched.learned.ppo import ModelError, PolicyModel

    ref = exp.init_from
    try:
        if ref.startswith("models:/"):
            from rlsched.train.registry import download_model, resolve_version

            mv = resolve_version(ref)
            with tempfile.TemporaryDirectory(prefix="rlsched-init-") as tmp:
                source = PolicyModel.load(download_model(f"models:/{mv.name}/{mv.version}", tmp))
            what = f"{ref} (version {mv.version})"
        else:
            source = PolicyModel.load(Path(ref))
            what = ref
    except ModelError as exc:
        raise ExperimentError(f"init_from: {exc}") from None
    if source.signature != codec_signature:
        raise ExperimentError(
            f"init_from: {what} was trained with codec signature {source.signature}, this experiment's is "
            f"{codec_signature} (window {exp.window}, max_pools {exp.max_pools}, nominators "
            f"{list(exp.nominators) or 'none'}; the model's: {source.codec_params}): its weights do not fit")
    target = model.policy.features_extractor
    try:
        target.load_state_dict(source.net.state_dict())
    except RuntimeError as exc:
        hidden = exp.network.get("hidden", 64)
        raise ExperimentError(f"init_from: {what}: its network does not fit this experiment's "
                              f"(network.hidden {hidden}?): {str(exc).splitlines()[0]}") from None
    log(f"warm start: the scorer's weights from {what}")
    return what
