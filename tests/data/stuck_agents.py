"""An agent whose training never returns, for the check that every call to an agent has a deadline
(tests/test_faults.py): the real PPO agent, started as a search starts it, with a ``train`` that waits forever."""
import time

from agents.ppo import PPOAgent


class StuckAgent(PPOAgent):
    def train(self, timesteps: int) -> dict:
        while True:  # a round that never ends (a deadlock in the agent's process)
            time.sleep(1)
