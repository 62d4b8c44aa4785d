"""The cost model: a plan's peak and time predicted from a ``ModelProfile``, corrected by measurements. No torch."""
