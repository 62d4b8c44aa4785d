"""Decision units: found where the activation memory is (``choice``), or given as FQNs and globs (``find``)."""
