"""Installing a plan on a model in place, and removing it: the one caller of ``torch.utils.checkpoint``."""
