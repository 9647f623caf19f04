"""Layer 4, the certifiers and the attacks that test them, one module per algorithm of the paper:
``qrange`` (the V range, App. B.1), ``loact`` (Algorithm 1, Theorem 1), ``percentile`` (percentile smoothing of
a continuous action), ``gre`` (Algorithm 2, Theorems 2–3), ``lore`` (Algorithm 3, Theorem 4) and ``attack``
(PGD within the certified radius).  Each is ``run_X(env_id, net, settings, *, profile, progress)``."""
