"""The Gymnasium environment a search's agents learn in: one checkpoint decision per unit."""
