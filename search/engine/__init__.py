"""The search engine: phases of a run, the ledger, Evaluators and agents on Ray, the report."""
