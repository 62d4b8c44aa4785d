"""A search run's phases, in the order ``search.engine.driver.Driver.run`` takes them.

1. ``prepare``: the workload profiled on an Evaluator (or read back from a resumed run's store),
   and the typed ``SearchSetup`` made from it.
2. ``rules``: the baseline rules measured once each; the baseline (all keep) set, and measured
   on every Evaluator when there are several.
3. ``peers``: what users pick instead, measured by the same Evaluators.
4. ``exact``: the exact frontier on the cost model, its plans measured too with warm start; the
   agents' budgets spread from its lowest peak to the baseline's.
5. ``rounds``: the agents' training rounds, the plans that could join their frontier measured
   after each; then the answer rounds, in which they answer the last measurements.
6. ``deciding``: the deciding passes, in which the plans that decide the frontiers are measured
   side by side and ranked on those measurements; the references closed after them.
7. ``whole_model``: with ``--compile-scope both``, the frontier's plans measured with the whole
   model compiled.
8. ``gate``: every plan of the frontier shown checked once on the workload (loss and gradients against the
   unplanned step); a plan that fails is taken off, and the units it names are kept by every plan after.

Each phase is a function of the ``RunContext`` (``search.engine.context``).
"""
