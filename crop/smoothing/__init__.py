"""Layer 3, smoothing: Gaussian smoothing of a network's bounded output and its statistics.

``stats`` (confidence bounds, order statistics; no torch), ``engine`` (the batched noisy forward: the one hot
loop), and ``smoothed`` (the smoothed network of Eq. 2 and its bounds for every action or output)."""
