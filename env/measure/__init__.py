"""One training step measured: peak memory and step time of a plan, the per-unit profile, peers, compiled steps."""
