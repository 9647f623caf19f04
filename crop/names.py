"""Names of the choices the code implements, importable without torch or scipy (the CLI's parser and the
config schema's checks use them; the implementations key their tables by them).

* ``BOUND_NAMES``: the confidence bounds of the smoothed Q-values, :data:`crop.smoothing.smoothed.BOUNDS`
  (implemented in :mod:`crop.smoothing.stats`).
* ``CONTINUOUS_BOUND``: the bound a continuous agent's LoAct records (percentile smoothing).
* ``ALPHA_MODES``: how α is spent over states, :func:`crop.smoothing.stats.loact_state_alpha` and
  :func:`crop.smoothing.stats.lore_state_alpha`.
* ``DEVICES``: where networks run, :func:`crop.smoothing.engine.resolve_device`.
* ``TARGET_NAMES``: what is smoothed, :data:`crop.smoothing.smoothed.TARGETS` (``q``: clipped Q-values; ``probs``:
  a policy network's action probabilities; ``vote``: the one-hot of the greedy action).
* :func:`smoothing_targets`: the targets an environment's config block asks for.
* ``NETWORK_NAMES``: what each kind of network (model.json ``network``) is called in a message,
  :func:`network_name`.
* ``MAX_PARAMETERS``: the most parameters a network may declare, :func:`crop.models.build_network` (and the
  config's ``train.hidden``, checked at validation).

The config schema's accessor is :mod:`crop.schema`'s.
"""
__all__ = ["BOUND_NAMES", "CONTINUOUS_BOUND", "ALPHA_MODES", "DEVICES", "TARGET_NAMES", "ACTION_TARGET",
           "MAX_PARAMETERS", "smoothing_targets", "AUTO_TARGET", "NETWORK_NAMES", "network_name"]

#: 1 GiB of float32 weights, the largest policy file or checkpoint crop reads (crop.agents.checkpoints
#: MAX_MEMBER_BYTES), so no accepted file can fill a larger network.
MAX_PARAMETERS = (1 << 30) // 4

BOUND_NAMES = ("hoeffding", "empirical_bernstein", "betting", "clopper_pearson")
#: The bound a continuous agent's LoAct records (``bound``): percentiles of the action by exact binomial order
#: statistics (:mod:`crop.certify.percentile`), no bound of BOUND_NAMES to choose.
CONTINUOUS_BOUND = "exact binomial order statistics"

#: ``state``: every smoothed state's certificate holds with prob ≥ 1 − α (the paper; joint statements over
#: N states hold with prob ≥ 1 − N·α by the union bound).  ``family``: α is split so a whole LoAct episode
#: (or attack episode) of ≤ H states, or a whole LoRe tree, holds jointly with prob ≥ 1 − α.
ALPHA_MODES = ("state", "family")

DEVICES = ("cpu", "cuda", "auto")

TARGET_NAMES = ("q", "probs", "vote")
#: ``target: auto``: one of a network's targets per run, chosen by the qrange stage's pilot
#: (crop/certify/pilot.py); its runs live in ENV/ALGO@auto/sigma-S.
AUTO_TARGET = "auto"

#: The networks crop smooths, by their model.json ``network``: a Q-network (DQN), a policy network (PPO, A2C:
#: its logits, smoothed as probabilities or votes) and a continuous-action agent's deterministic actor.
NETWORK_NAMES = {"q": "Q-network", "policy": "policy network", "actor": "actor"}
#: The smoothing target of a continuous-action agent (a Box action space): its action itself, certified per
#: dimension by percentile smoothing (crop loact); its runs live in ENV/ALGO@action/sigma-S.
ACTION_TARGET = "action"


def smoothing_targets(env_cfg: dict) -> list[str]:
    """An environment's smoothing targets (each one of :data:`TARGET_NAMES` or :data:`AUTO_TARGET`): its
    config's ``targets`` when given, else [``target``] (default q)."""
    return list(env_cfg.get("targets") or [env_cfg.get("target", "q")])


def network_name(net) -> str:
    """What ``net`` is, in words (:data:`NETWORK_NAMES`), so that a message about its outputs names it as what
    it is: its ``network_kind`` (set from model.json when a checkpoint is loaded or a file imported), else an
    actor where it is a continuous-action one, else a Q-network."""
    kind = getattr(net, "network_kind", None) or ("actor" if getattr(net, "continuous", False) else "q")
    return NETWORK_NAMES.get(kind, "network")
