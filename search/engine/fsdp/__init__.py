"""Measuring under FSDP2 (``--fsdp N``): a group of N Ray rank actors that the Evaluator pool runs as one
Evaluator (``group``), and what each rank does (``rank``)."""
