"""Layer 7, the workflow's plumbing: the config and its schema (``config``), the stage table (``stage_table``:
one row per stage), where every file goes (``layout``), what a job costs (``cost``, ``cost_units``,
``calibrate``), the sample sizes the audit needs (``audit_sizes``), stale locks (``runlock``) and the ``crop``
command's parser (``cli``), which imports each subcommand's handler by name."""
