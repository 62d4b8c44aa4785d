"""Workloads, decision units, plans, measurement, profile, cost model and the Gym env.

Importing ``env`` registers the Gymnasium id ``CkptSearch-v0`` (the module itself loads on
``gymnasium.make``).
"""

import gymnasium

if "CkptSearch-v0" not in gymnasium.registry:
    gymnasium.register(id="CkptSearch-v0", entry_point="env.checkpoint_env:CheckpointEnv")
