"""Learned policies: the PPO network, model folders and the PPO policy as a scheduler.

They sit above the environment (:mod:`rlsched.envs`): a model acts through the observation
codec it was trained with.

* :mod:`~rlsched.learned.ppo` - model folders, loading (a ``models:/`` URI through a fetcher the
  caller passes, e.g. :func:`rlsched.train.registry.download_model`), :class:`PpoScheduler`;
* :mod:`~rlsched.learned.ppo_net` - the torch network (training and reference);
* :mod:`~rlsched.learned.ppo_numpy` - the same logits in numpy, for serving;
* :mod:`~rlsched.learned.complement` - the heuristic that takes the action kinds a model lacks.
"""
