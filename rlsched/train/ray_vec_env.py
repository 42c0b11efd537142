"""A Stable-Baselines3 ``VecEnv`` whose environments each live in a Ray actor (``rlsched train --ray``).

:class:`RayVecEnv` is the cluster counterpart of SB3's ``SubprocVecEnv``: the same environment
factories (and so the same seeds) run in Ray actors spread over the cluster's nodes instead of
forked subprocesses, and the learner stays in the driver. Every call MaskablePPO and the trainer
make is answered as ``DummyVecEnv`` answers it - auto-reset on ``done`` with the final observation in
``info["terminal_observation"]``, ``TimeLimit.truncated``, seeds and options used once at the next
:meth:`RayVecEnv.reset`, observations and rewards in the observation space's dtypes and ``float32`` -
so a run from the same seed collects the same rollouts and learns the same parameters as with
``DummyVecEnv``.

One round trip per environment per step: each actor returns its action mask with the observation,
and ``env_method("action_masks")`` (MaskablePPO asks before every step) is answered from that copy
until anything else is called on the environment. A method fetched with :meth:`RayVecEnv.get_attr`
comes back as a callable that runs it in the actor (sending a bound method would ship the whole
environment back).

``ray`` is imported only when a :class:`RayVecEnv` is built, and this module only by
:func:`rlsched.train.trainer.make_vec_env` asked for Ray; the caller connects first
(:func:`rlsched.ray_connect.connect`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.util import dict_to_obs, obs_space_info

from rlsched.errors import RlschedError

#: CPUs Ray reserves per environment actor (an environment step is light; several share a core).
DEFAULT_ACTOR_CPUS = 0.5
#: Seconds the environment actors may take to be placed and build their environments.
START_TIMEOUT_S = 300.0
#: The masking method MaskablePPO calls on every step (prefetched with each step's result).
MASK_METHOD = "action_masks"


class RayVecEnvError(RlschedError):
    """An environment actor could not be started or died (one line, says which)."""


class _EnvWorker:
    """One environment inside a Ray actor: SubprocVecEnv's worker loop as actor methods."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.env = factory()
        self.has_mask = _has_attr(self.env, MASK_METHOD)

    def spaces(self) -> tuple[Any, Any, Any]:
        """Observation space, action space and ``render_mode`` (what ``VecEnv.__init__`` needs)."""
        return self.env.observation_space, self.env.action_space, getattr(self.env, "render_mode", None)

    def _mask(self) -> np.ndarray | None:
        return self.env.get_wrapper_attr(MASK_METHOD)() if self.has_mask else None

    def step(self, action: Any) -> tuple[Any, float, bool, dict[str, Any], dict[str, Any] | None, np.ndarray | None]:
        """Step, resetting on ``done`` as ``DummyVecEnv`` does; the reset's info (or None) and the next mask."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        done = bool(terminated or truncated)
        info["TimeLimit.truncated"] = bool(truncated and not terminated)
        reset_info = None
        if done:
            info["terminal_observation"] = obs
            obs, reset_info = self.env.reset()
        return obs, reward, done, info, reset_info, self._mask()

    def reset(self, seed: int | None, options: dict[str, Any]) -> tuple[Any, dict[str, Any], np.ndarray | None]:
        maybe_options = {"options": options} if options else {}
        obs, info = self.env.reset(seed=seed, **maybe_options)
        return obs, info, self._mask()

    def env_method(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.env.get_wrapper_attr(name)(*args, **kwargs)

    def get_attr(self, name: str) -> tuple[str, Any]:
        """``("method", None)`` (the driver calls it remotely), ``("missing", None)`` or ``("value", value)``."""
        try:
            value = self.env.get_wrapper_attr(name)
        except AttributeError:
            return "missing", None
        return ("method", None) if callable(value) else ("value", value)

    def has_attr(self, name: str) -> bool:
        return _has_attr(self.env, name)

    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.env, name, value)

    def is_wrapped(self, wrapper_class: type) -> bool:
        from stable_baselines3.common.env_util import is_wrapped

        return bool(is_wrapped(self.env, wrapper_class))

    def close(self) -> None:
        self.env.close()


def _has_attr(env: Any, name: str) -> bool:
    try:
        env.get_wrapper_attr(name)
    except AttributeError:
        return False
    return True


class _RemoteMethod:
    """A method of one remote environment, as :meth:`RayVecEnv.get_attr` returns it."""

    def __init__(self, venv: RayVecEnv, index: int, name: str) -> None:
        self.venv, self.index, self.name = venv, index, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.venv.env_method(self.name, *args, indices=[self.index], **kwargs)[0]

    def __repr__(self) -> str:
        return f"<remote method {self.name} of environment {self.index}>"


def _one_line(exc: BaseException) -> str:
    """The last line of an actor's error (Ray wraps the cause in a long multi-line traceback)."""
    cause = getattr(exc, "cause", None) or exc
    lines = [ln for ln in str(cause).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(cause).__name__)[:300]


class RayVecEnv(VecEnv):
    """``len(env_fns)`` environments, each built by its factory in a Ray actor of ``num_cpus`` CPUs.

    The actors are spread over the cluster's nodes. This process must already be connected to Ray.

    Raises:
        RayVecEnvError: the actors could not be placed within ``start_timeout_s`` (too few CPUs), or an
            environment failed to build (e.g. rlsched is not installed on that node).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], *, num_cpus: float = DEFAULT_ACTOR_CPUS,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        import ray

        if not env_fns:
            raise RayVecEnvError("RayVecEnv needs at least one environment factory")
        if not ray.is_initialized():
            raise RayVecEnvError("RayVecEnv: this process is not connected to Ray (rlsched.ray_connect.connect)")
        self._ray = ray
        remote = ray.remote(_EnvWorker).options(num_cpus=num_cpus, scheduling_strategy="SPREAD",
                                                max_restarts=0)
        self.actors: list[Any] = [remote.remote(fn) for fn in env_fns]
        self.actor_cpus = num_cpus
        self._closed = False
        try:
            spaces = self._get([a.spaces.remote() for a in self.actors], "start", timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._kill()
            have = ray.cluster_resources().get("CPU", 0.0)
            raise RayVecEnvError(f"{len(env_fns)} environment actors of {num_cpus:g} CPU each did not start within "
                                 f"{start_timeout_s:g} s (the Ray cluster has {have:g} CPUs); lower n_envs or add "
                                 "nodes") from None
        except RayVecEnvError:
            self._kill()
            raise
        obs_space, act_space, render_mode = spaces[0]
        self._render_mode = render_mode
        self._masks: list[np.ndarray | None] = [None] * len(self.actors)
        self._pending: list[Any] | None = None
        super().__init__(len(self.actors), obs_space, act_space)
        self.keys, self._shapes, self._dtypes = obs_space_info(obs_space)

    # -- helpers -------------------------------------------------------------------------------------
    def _get(self, refs: list[Any], doing: str, timeout: float | None = None) -> list[Any]:
        try:
            return list(self._ray.get(refs, timeout=timeout))
        except self._ray.exceptions.GetTimeoutError:
            raise
        except self._ray.exceptions.RayError as exc:
            raise RayVecEnvError(f"Ray environment actor failed ({doing}): {_one_line(exc)}") from None

    def _stack(self, observations: list[Any]) -> Any:
        """The batch of observations in the space's dtypes (as ``DummyVecEnv``'s buffers hold them)."""
        buf = {k: np.array([o if k is None else o[k] for o in observations], dtype=self._dtypes[k])
               for k in self.keys}
        return dict_to_obs(self.observation_space, buf)

    def _targets(self, indices: Any) -> list[int]:
        return list(self._get_indices(indices))

    # -- VecEnv --------------------------------------------------------------------------------------
    def reset(self) -> Any:
        refs = [a.reset.remote(self._seeds[i], self._options[i]) for i, a in enumerate(self.actors)]
        results = self._get(refs, "reset")
        obs = []
        for i, (o, info, mask) in enumerate(results):
            obs.append(o)
            self.reset_infos[i] = info
            self._masks[i] = mask
        self._reset_seeds()
        self._reset_options()
        return self._stack(obs)

    def step_async(self, actions: np.ndarray) -> None:
        self._pending = [a.step.remote(actions[i]) for i, a in enumerate(self.actors)]

    def step_wait(self) -> Any:
        assert self._pending is not None, "step_wait without step_async"
        results = self._get(self._pending, "step")
        self._pending = None
        obs, infos = [], []
        rews = np.zeros((self.num_envs,), dtype=np.float32)
        dones = np.zeros((self.num_envs,), dtype=bool)
        for i, (o, r, d, info, reset_info, mask) in enumerate(results):
            obs.append(o)
            rews[i], dones[i] = r, d
            infos.append(info)
            if reset_info is not None:
                self.reset_infos[i] = reset_info
            self._masks[i] = mask
        return self._stack(obs), rews, dones, infos

    def env_method(self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any) -> list[Any]:
        targets = self._targets(indices)
        cached = [self._masks[i] for i in targets]
        if method_name == MASK_METHOD and not method_args and not method_kwargs \
                and all(m is not None for m in cached):
            return [np.copy(m) for m in cached if m is not None]
        for i in targets:  # anything else may change the state the cached masks describe
            self._masks[i] = None
        refs = [self.actors[i].env_method.remote(method_name, method_args, method_kwargs) for i in targets]
        return self._get(refs, method_name)

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        targets = self._targets(indices)
        if attr_name == "render_mode":  # asked by VecEnv.__init__ itself
            return [self._render_mode for _ in targets]
        answers = self._get([self.actors[i].get_attr.remote(attr_name) for i in targets], f"get_attr {attr_name}")
        if any(kind == "missing" for kind, _ in answers):  # VecEnv.has_attr and callers expect AttributeError
            raise AttributeError(f"environment has no attribute {attr_name!r}")
        return [_RemoteMethod(self, i, attr_name) if kind == "method" else value
                for i, (kind, value) in zip(targets, answers, strict=True)]

    def has_attr(self, attr_name: str) -> bool:
        return all(self._get([a.has_attr.remote(attr_name) for a in self.actors], "has_attr"))

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        targets = self._targets(indices)
        for i in targets:
            self._masks[i] = None
        self._get([self.actors[i].set_attr.remote(attr_name, value) for i in targets], "set_attr")

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        targets = self._targets(indices)
        return self._get([self.actors[i].is_wrapped.remote(wrapper_class) for i in targets], "env_is_wrapped")

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None for _ in self.actors]  # the environments do not render

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # closing must not fail on an actor that already died
            self._ray.get([a.close.remote() for a in self.actors], timeout=30)
        self._kill()

    def _kill(self) -> None:
        for a in self.actors:
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(a)
