"""Plain records every layer reads: plans, measured plans, profiles, unit choices, errors and aliases. No torch."""
