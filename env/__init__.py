"""What one training step is, what a plan does to it, and what it costs; the Gym env on top.

Subpackages, each importing only those listed after it (``pyproject.toml``'s import-linter
contracts check it):

- ``env.gym``: the Gymnasium environment (``CkptSearch-v2``) and its observation features.
- ``env.units``: decision units, found where the memory is or given as FQNs/globs.
- ``env.measure``: one training step's memory and time: measurement, profile, peers, compile.
- ``env.runtime``: installing a plan on a model (the one caller of ``torch.utils.checkpoint``).
- ``env.workloads``: workload specs, built-in models and the library-model zoo.
- ``env.cost``: the cost model, its peak walk, its correction by measurements (no torch).
- ``env.data``: plain records and aliases: plans, profiles, measured plans, errors (no torch).

Importing ``env`` registers the Gymnasium id ``CkptSearch-v2`` (the env module itself loads on
``gymnasium.make``).
"""

import gymnasium

if "CkptSearch-v2" not in gymnasium.registry:
    gymnasium.register(id="CkptSearch-v2", entry_point="env.gym.checkpoint_env:CheckpointEnv")
