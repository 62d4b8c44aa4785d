"""The throughput search (``--memory-cap``): caps and the micro-batch ladder, the candidate plans, the peers at
the largest micro-batch each fits, the side-by-side quote, and its report section. Driven by
``search.engine.phases.throughput``."""
