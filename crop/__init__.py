"""crop — certifying robust policies for reinforcement learning through functional smoothing (CROP,
Wu et al., ICLR 2022): LoAct (Algorithm 1), GRe (Algorithm 2) and LoRe (Algorithm 3), reproducibly."""

__version__ = "0.1.0"
