"""Layer 9, one function per ``crop`` subcommand (the stage table names them ``module:function``): load and
verify the inputs, call one certifier, attack or report function, write its files atomically with their
provenance.  ``stages``: the per-run stages, aggregate and audit; ``policies``: a run's checkpoint (train,
derive, fetch, import)."""
