"""Workloads, decision units, plans, measurement, profile, cost model and the Gym env.

Importing ``env`` registers the Gymnasium id ``CkptSearch-v1`` (the module itself loads on
``gymnasium.make``).
"""

import gymnasium

if "CkptSearch-v1" not in gymnasium.registry:
    gymnasium.register(id="CkptSearch-v1", entry_point="env.checkpoint_env:CheckpointEnv")
