"""Workloads: a spec names a model, a batch, a loss and an optimizer; built-in models and the library zoo."""
