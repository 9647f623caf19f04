"""Layer 6, where a policy comes from besides training here: the registry of published checkpoints
(``registry``, ``registry.yaml``), their download with pinned sha256 (``checkpoints``), and other libraries'
agents imported into a checkpoint the certifiers accept (``importing``: SB3, CleanRL, state dicts;
``continuous``: continuous-action actors; ``archive``: reading such a file safely)."""
