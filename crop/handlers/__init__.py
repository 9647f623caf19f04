"""Layer 10, one function per ``crop`` subcommand (crop/__main__.py maps each subcommand to its function): load
and verify the inputs, call one certifier, attack or report function, write its files atomically with their
provenance.  ``stages``: the per-run stages; ``report``: aggregate and audit; ``policies``: a run's checkpoint
(train, derive, fetch, import); ``certify``: ``crop certify``, a whole workflow for one agent."""
