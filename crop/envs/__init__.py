"""Environments: one factory, preprocessing profiles, faithful snapshots, and vectorised rollouts.

Nothing outside this package knows how an observation is made; every other layer sees a float32 array of
the shape the Q-network takes, to which Gaussian noise is added (the paper smooths in that space).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import math
import re
import warnings
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

__all__ = ["EnvSpec", "ENV_SPECS", "env_spec", "env_family", "profiles", "check_profile", "make_env",
           "make_env_pool", "untrusted_env_ids", "snapshot", "restore", "to_obs", "UnknownEnvError", "MissingFactError",
           "snapshot_problem", "env_shapes", "default_profile", "sticky_probability", "action_bounds"]


class UnknownEnvError(KeyError):
    def __str__(self):  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class MissingFactError(ValueError):
    """A fact a certifier needs (the per-step reward range) that neither the environment nor the config
    gives; the message names the config key to add."""


@dataclass(frozen=True)
class EnvSpec:
    """What the certifiers need to know about an environment.

    ``reward_range`` is the per-step reward range from the game's specification; with the horizon H and
    γ it gives J_min, J_max of Lemma 2 / Theorem 2 (Appendix B.2: "default values in the game
    specifications").  None where neither the environment nor the config tells it (GRe and LoRe are then
    refused, naming the config key ``rewards.range``).
    """

    env_id: str
    paper_name: str          # figure prefix as in the paper's files, e.g. "CartPole"
    clean_name: str          # prefix of the benign-return figure, e.g. "Cartpole"
    n_actions: int
    obs_shape: tuple
    reward_range: tuple | None
    profile: str             # default preprocessing profile
    game_return_range: tuple | None = None  # whole-game score range from the game's rules, if any
    lore_reward: str | None = None  # LoRe-only reward modification (Appendix E), named in the output
    solved_return: float | None = None  # acceptance threshold of a locally trained policy, if any
    # GRe's block and its jobs' memory (crop/certify/gre.py, crop/workflow/cost.py; measured on one CPU core).
    gre_mb_per_copy: float = 0.0     # memory of one environment copy in GRe's pool (measured)
    gre_batch: int | None = 1000     # GRe trajectories stepped together by default (None: all m)

    def lore_reward_fn(self):
        """The LoRe-only reward modification: negative rewards count as 0, which enables pruning."""
        if self.lore_reward == "max(r, 0)":
            return lambda r: max(float(r), 0.0)
        return None

    @property
    def nonnegative_rewards(self) -> bool:
        """LoRe may prune only when no step can lower the return (Appendix B.3)."""
        return self.reward_range is not None and self.reward_range[0] >= 0

    def replay_mb(self, buffer_size: int) -> int:
        """Memory of an image policy's replay buffer (MB): s and s′ as uint8 (crop/train/dqn.py _Replay:
        100k Atari transitions × 56 kB = 5.6 GB), with 20 % headroom; 0 for vector observations."""
        if len(self.obs_shape) != 3:
            return 0
        return int(buffer_size * 2 * math.prod(self.obs_shape) / 1e6 * 1.2)

    def gre_block(self, m: int, batch: int | None = None) -> int:
        """GRe's block of trajectories stepped together: ``batch`` (config gre.batch), else the default."""
        if batch is not None:
            return min(batch, m)
        return m if self.gre_batch is None else min(m, self.gre_batch)

    def gre_mem_mb(self, block: int, threads: int) -> int:
        """Memory of a GRe job (MB): the process (measured ≤ 350 MB), about 100 MB per worker process and one
        block of environment copies, with 2× headroom (about 6 GB for an Atari block of 1,000)."""
        return int(2 * (350 + 100 * threads + self.gre_mb_per_copy * block))

    def return_range(self, horizon: int, gamma: float = 1.0) -> tuple[float, float]:
        """[J_min, J_max] for returns over ``horizon`` steps with discount ``gamma``; ValueError where they are
        not finite (a declared range too wide to add up)."""
        if self.reward_range is None:
            raise MissingFactError(missing_reward_range(self.env_id))
        if gamma == 1.0:
            w = float(horizon)
        else:
            w = (1.0 - gamma ** horizon) / (1.0 - gamma)
        lo, hi = self.reward_range
        j_min, j_max = min(0.0, lo * w), max(0.0, hi * w)
        if self.game_return_range is not None and gamma == 1.0:
            j_min, j_max = max(j_min, self.game_return_range[0]), min(j_max, self.game_return_range[1])
        if not math.isfinite(j_max - j_min):  # GRe's bounds scale with J_max - J_min
            raise ValueError(f"{[lo, hi]} over {horizon} steps gives [J_min, J_max] = [{j_min:g}, {j_max:g}], not "
                             "finite numbers; give the true reward range")
        return (j_min, j_max)


ENV_SPECS: dict[str, EnvSpec] = {
    # CartPole steps its trajectories in numpy arrays: no copies to hold.  Its blocks are what a killed GRe run
    # keeps (crop/certify/gre_resume.py): 12,288 = 3 groups of 4,096 of the noise streams and initial states (no
    # group drawn twice), so the paper's m = 10,000 is one block.
    "CartPole-v0": EnvSpec("CartPole-v0", "CartPole", "Cartpole", 2, (4,), (0.0, 1.0), "vector",
                           solved_return=195.0, gre_batch=12288),
    "highway-fast-v0": EnvSpec("highway-fast-v0", "highway-fast", "highway-fast", 5, (25,), (0.0, 1.0),
                               "flat25", gre_mb_per_copy=0.45),
    # Atari: 6 actions in the full minimal set of Pong (3 for Freeway); a checkpoint's own action count
    # (its network's output size) takes precedence.  Pong's game ends at 21 points.
    "PongNoFrameskip-v4": EnvSpec("PongNoFrameskip-v4", "Pong", "Pong", 6, (4, 84, 84), (-1.0, 1.0),
                                  "cleanrl", game_return_range=(-21.0, 21.0), lore_reward="max(r, 0)",
                                  gre_mb_per_copy=2.6),
    # Freeway's ALE rewards are never negative; the paper's "losing scores 0" modification is kept for
    # uniformity and named in the output.
    "FreewayNoFrameskip-v4": EnvSpec("FreewayNoFrameskip-v4", "Freeway", "Freeway", 3, (4, 84, 84),
                                     (0.0, 1.0), "cleanrl", lore_reward="max(r, 0)", gre_mb_per_copy=2.6),
}

# ------------------------------------------------------------------------------- any Gymnasium environment
# Beyond the paper's four ids, three families (docs/own-policy.md, "Which environments"):
#   atari    ALE/<Game>-v5 and <Game>NoFrameskip-v4: the `cleanrl` profile (SB3's AtariWrapper stack + a
#            4-frame stack); v5 is made with frameskip=1 (the wrappers skip 4) and sticky actions of
#            probability 0.25, Gymnasium's v5 default that SB3's make_atari_env keeps (`cleanrl:sticky=P`
#            sets another P; NoFrameskip-v4 has none); snapshots: the emulator's cloneState + the wrappers.
#   highway  highway-env's ids (highway-v0, merge-v0, roundabout-v0, …) with Kinematics observations and
#            meta-actions: the `flat` profile (the V×F kinematics table flattened row-major, as
#            highway-fast-v0's flat25); snapshots: copy.deepcopy of the wrapped env, as highway-fast-v0.
#   vector   any other registered id with Discrete actions (from 0) or one bounded Box of continuous actions
#            (Pendulum-v1, MuJoCo's), and a Box observation (Acrobot-v1, MountainCar-v0, LunarLander-v3, a
#            third-party id as `package:Id-v0`): the `vector` profile
#            (flattened to float32); snapshots: copy.deepcopy, checked to replay the same transitions
#            (snapshot_problem), else LoRe is refused.
# Action count and observation shape come from the environment; the per-step reward range (GRe's and LoRe's
# J_min/J_max, LoRe's pruning when it is >= 0) from the config's `rewards` block, except Atari's: the
# cleanrl profile clips rewards to their sign, so [-1, 1] (a config may narrow it, e.g. [0, 1]).

DEFAULT_PROFILE = {"atari": "cleanrl", "highway": "flat", "vector": "vector"}
_ATARI_IDS = (re.compile(r"ALE/[A-Za-z0-9]+-v5"), re.compile(r"[A-Za-z0-9]+NoFrameskip-v4"))
_STICKY = re.compile(r"cleanrl:sticky=(0(\.[0-9]+)?|1(\.0+)?)")
_EXAMPLES = "e.g. Acrobot-v1, ALE/Breakout-v5, BreakoutNoFrameskip-v4, merge-v0"


def _is_atari_id(env_id: str) -> bool:
    return any(p.fullmatch(env_id) for p in _ATARI_IDS)


# A ``module:Id`` id imports ``module`` (which registers Id), so it runs that module's code: only an id the
# user vouched for may do that — one typed on the command line, or one a config marks ``import_module: true``
# (crop.workflow.config.trusted_env_ids decides for a config and validates it inside this block).  Ids read from what
# someone else wrote — run-folder names, a reference CSV, a results folder — are looked up inside
# :func:`untrusted_env_ids`, where they import nothing.
_UNTRUSTED: list[frozenset | None] = [None]


@contextlib.contextmanager
def untrusted_env_ids(trusted=()):
    """Within this block a ``module:Id`` id imports its module only when it is one of ``trusted`` (the ids the
    user vouched for); any other such id is unknown.  A block inside another only narrows: an id imports only
    when both trust it, so code reading a received folder cannot widen the trust of the block around it."""
    outer = _UNTRUSTED[0]
    before, _UNTRUSTED[0] = outer, frozenset(trusted) if outer is None else outer & frozenset(trusted)
    try:
        yield
    finally:
        _UNTRUSTED[0] = before


def _registration(env_id: str):
    """gymnasium's registration of ``env_id`` (registering ale-py's and highway-env's ids, and importing the
    module of a ``module:Id`` id the user gave, first), or None."""
    if ":" in env_id:
        if _UNTRUSTED[0] is not None and env_id not in _UNTRUSTED[0]:
            return None
        module, _, name = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError:
            return None
        return gym.registry.get(name)
    if env_id not in gym.registry:
        if _is_atari_id(env_id):
            import ale_py

            gym.register_envs(ale_py)
        elif "/" not in env_id:  # highway-env registers no namespaced ids: a run folder's ENV/ALGO needs no import
            try:
                import highway_env  # noqa: F401  (registers the highway family)
            except ImportError:
                pass
    return gym.registry.get(env_id)


@functools.cache
def env_family(env_id: str) -> str:
    """``paper`` (the paper's four ids, with their own profiles), ``atari``, ``highway`` or ``vector``;
    UnknownEnvError (one line) for an id that is not registered or that crop cannot certify."""
    if env_id in ENV_SPECS:
        return "paper"
    reg = _registration(env_id)
    if reg is None:
        import difflib

        close = difflib.get_close_matches(env_id, [*ENV_SPECS, *gym.registry], n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownEnvError(f"unknown environment {env_id!r}{hint}: not a registered Gymnasium id (install its "
                              f"package; a third-party id may be given as package:Id-v0); {_EXAMPLES}")
    entry = reg.entry_point if isinstance(reg.entry_point, str) else getattr(reg.entry_point, "__module__", "")
    if _is_atari_id(env_id):
        return "atari"
    if str(entry).startswith("ale_py"):
        raise UnknownEnvError(f"{env_id}: give an Atari game as ALE/<Game>-v5 or <Game>NoFrameskip-v4 (the wrappers "
                              "skip frames; other ALE variants skip or stick on their own)")
    return "highway" if str(entry).startswith("highway_env") else "vector"


def default_profile(env_id: str) -> str:
    return ENV_SPECS[env_id].profile if env_id in ENV_SPECS else DEFAULT_PROFILE[env_family(env_id)]


def profiles(env_id: str) -> list[str]:
    """The preprocessing profiles ``env_id`` can be made with (the first is the default)."""
    if env_id in PROFILES:
        return list(PROFILES[env_id])
    family = env_family(env_id)
    return [DEFAULT_PROFILE[family]] + (["cleanrl:sticky=P"] if env_id.startswith("ALE/") else [])


def check_profile(env_id: str, profile: str) -> None:
    """ValueError (one line) unless ``profile`` is one of ``env_id``'s (``cleanrl:sticky=P``, 0 ≤ P ≤ 1, for
    ALE/…-v5)."""
    known = profiles(env_id)
    if profile in known or (env_id.startswith("ALE/") and env_id not in ENV_SPECS and _STICKY.fullmatch(profile)):
        return
    raise ValueError(f"{env_id}: unknown preprocessing profile {profile!r}; known: {known}")


def sticky_probability(env_id: str, profile: str) -> float | None:
    """The sticky-action probability an ``ALE/…-v5`` environment is made with under ``profile`` (None for
    the other ids: NoFrameskip-v4 has no sticky actions)."""
    if not env_id.startswith("ALE/"):
        return None
    m = _STICKY.fullmatch(profile)
    return float(m.group(1)) if m else 0.25


@functools.cache
def env_shapes(env_id: str, profile: str | None = None) -> tuple[int, tuple]:
    """(action count, observation shape) of ``env_id`` made with ``profile`` (default: its own), read off
    the environment itself."""
    env = make_env(env_id, profile)
    try:
        a = env.action_space
        n = int(a.shape[0]) if isinstance(a, gym.spaces.Box) else int(a.n)
        return n, tuple(int(d) for d in env.observation_space.shape)
    finally:
        env.close()


@functools.cache
def action_bounds(env_id: str, profile: str | None = None) -> tuple[tuple, tuple] | None:
    """(low, high) of a continuous (Box) action space, one float per action dimension; None for a Discrete
    one.  For a Box environment :func:`env_shapes`' action count is the number of dimensions."""
    if env_id in ENV_SPECS:
        return None
    env = make_env(env_id, profile)
    try:
        a = env.action_space
        if not isinstance(a, gym.spaces.Box):
            return None
        return tuple(float(x) for x in a.low), tuple(float(x) for x in a.high)
    finally:
        env.close()


def missing_reward_range(env_id: str) -> str:
    return (f"environments.{env_id}.rewards.range: GRe and LoRe need the per-step reward range of {env_id}, which "
            "the environment does not declare; add it to the config, e.g. rewards: {range: [-1.0, 0.0]} "
            "(docs/own-policy.md)")


def env_spec(env_id: str, rewards: dict | None = None) -> EnvSpec:
    """What the certifiers know about ``env_id``: the paper's facts for its four environments; for any other
    the action count and observation shape of the environment (default profile) and the config's ``rewards``
    block (``range``: per-step reward range; ``return_range``: whole-game return range, optional)."""
    if env_id in ENV_SPECS:
        if rewards and any(v is not None for v in rewards.values()):
            raise ValueError(f"rewards: {env_id} is one of the paper's environments, whose reward range is the "
                             "paper's; remove the rewards block")
        return ENV_SPECS[env_id]
    family = env_family(env_id)
    n, shape = env_shapes(env_id, DEFAULT_PROFILE[family])
    rewards = rewards or {}
    reward_range = (-1.0, 1.0) if family == "atari" else None   # the cleanrl profile's sign-clipped rewards
    if rewards.get("range") is not None:
        reward_range = tuple(float(x) for x in rewards["range"])
    game = rewards.get("return_range")
    name = env_id.replace("/", "-")
    return EnvSpec(env_id, name, name, n, shape, reward_range, DEFAULT_PROFILE[family],
                   game_return_range=None if game is None else tuple(float(x) for x in game),
                   gre_mb_per_copy={"atari": 2.6, "highway": 0.45}.get(family, 0.0))


class _Flatten(gym.ObservationWrapper):
    """Kinematics 5×5 → the 25-vector (row-major), as CROP's MLP's ``reshape(-1, 25)``; any Box observation
    → its flattened float32 vector (the ``flat`` and ``vector`` profiles).  A plain class (gymnasium's
    FlattenObservation holds a lambda) so snapshots can be pickled for resumable searches."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (int(np.prod(env.observation_space.shape)),),
                                                np.float32)

    def observation(self, obs):
        return np.asarray(obs, dtype=np.float32).reshape(-1)


PROFILES = {
    "CartPole-v0": ["vector"],
    "highway-fast-v0": ["flat25"],
    "PongNoFrameskip-v4": ["cleanrl", "sa_dqn_pong", "radial"],
    "FreewayNoFrameskip-v4": ["cleanrl", "sa_dqn_freeway", "radial"],
}


def _check_profile(env_id: str, profile: str) -> None:
    check_profile(env_id, profile)


def _make_gym(env_id: str, family: str) -> gym.Env:
    """A vector or highway-family environment: Discrete actions (from 0) or one bounded Box of continuous
    actions, Box observations, flattened."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            env = gym.make(env_id)
        except gym.error.Error as exc:  # DependencyNotInstalled (Box2D, MuJoCo), a bad registration, …
            raise UnknownEnvError(f"{env_id}: cannot be made: {' '.join(str(exc).split())}") from None
    a, o = env.action_space, env.observation_space
    problem = None
    if isinstance(a, gym.spaces.Box):
        if len(a.shape) != 1 or not np.issubdtype(a.dtype, np.floating) or \
                not (np.isfinite(a.low).all() and np.isfinite(a.high).all()):
            problem = (f"its action space {a} is a Box crop cannot certify: continuous actions must be one vector "
                       "of floats with finite bounds")
    elif not isinstance(a, gym.spaces.Discrete) or int(a.start) != 0:
        problem = (f"its action space {a} is neither Discrete(n) from 0 nor a Box of finite bounds; crop "
                   "certifies a finite set of actions or a vector of bounded continuous actions "
                   "(docs/own-policy.md)")
    elif not isinstance(o, gym.spaces.Box):
        problem = f"its observation space {o} is not a Box (a vector or an image)"
    elif family == "highway" and env.unwrapped.config.get("observation", {}).get("type") != "Kinematics":
        problem = "the flat profile flattens Kinematics observations; its observation type is " + \
                  repr(env.unwrapped.config.get("observation", {}).get("type"))
    if problem:
        env.close()
        raise UnknownEnvError(f"{env_id}: {problem}")
    return _Flatten(env)


def make_env(env_id: str, profile: str | None = None) -> gym.Env:
    """A single environment with the preprocessing of ``profile`` (the checkpoint's, or the default)."""
    if env_id not in ENV_SPECS:
        family = env_family(env_id)
        profile = profile or DEFAULT_PROFILE[family]
        check_profile(env_id, profile)
        if family == "atari":
            from crop.envs.atari import make_atari

            return make_atari(env_id, profile)
        return _make_gym(env_id, family)
    spec = env_spec(env_id)
    profile = profile or spec.profile
    _check_profile(env_id, profile)
    if env_id == "CartPole-v0":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CartPole-v0 is out of date": the paper uses v0
            return gym.make("CartPole-v0")
    if env_id == "highway-fast-v0":
        import highway_env  # noqa: F401  (registers the ids)

        # Default configuration (Kinematics 5×5: presence, x, y, vx, vy of the 5 nearest vehicles,
        # normalised; 5 meta-actions; 30 steps), flattened to the 25-vector CROP's MLPs take.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = gym.make("highway-fast-v0")
        from crop.envs.highway import speed_up

        return _Flatten(speed_up(env))  # the same bytes as the stock step, faster (crop/envs/highway.py)
    if env_id.endswith("NoFrameskip-v4"):
        from crop.envs.atari import make_atari

        return make_atari(env_id, profile)
    raise UnknownEnvError(f"unknown environment {env_id!r}")


@functools.cache
def snapshot_problem(env_id: str, profile: str | None = None) -> str | None:
    """Why LoRe cannot take faithful snapshots of ``env_id`` (one line), or None.  The paper's four, Atari
    (emulator state + wrappers) and highway-env (deepcopy) are known faithful; for any other id a snapshot
    is ``copy.deepcopy`` of the wrapped env, accepted only when two copies of one state replay the same
    observations and rewards for the same actions (an env holding state outside Python objects — a Box2D
    world, a simulator process — or drawing from a global RNG fails this)."""
    if env_id in ENV_SPECS or env_family(env_id) in ("atari", "highway"):
        return None
    if action_bounds(env_id, profile) is not None:
        return (f"LoRe searches a tree that branches over a finite set of actions; {env_id}'s actions are "
                "continuous (a Box), so LoRe does not apply")
    try:
        env = make_env(env_id, profile)
        env.reset(seed=12345)
        rng = np.random.default_rng(0)
        for _ in range(3):
            env.step(int(rng.integers(env.action_space.n)))
        snap = snapshot(env)
        actions = [int(a) for a in rng.integers(env.action_space.n, size=20)]
        replays = []
        for _ in range(2):
            e, trace = restore(env, snap), []
            for a in actions:
                o, r, term, trunc, _ = e.step(a)
                trace.append((np.asarray(o, dtype=np.float32).tobytes(), float(r), bool(term), bool(trunc)))
                if term or trunc:
                    break
            replays.append(trace)
    except Exception as exc:  # deepcopy of an object that cannot be copied, …
        return (f"LoRe needs faithful snapshots of {env_id}, and copy.deepcopy of it fails "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})")
    if replays[0] != replays[1]:
        return (f"LoRe needs faithful snapshots of {env_id}, and two copies of one state of it replay different "
                "transitions (state outside Python objects or a global random generator)")
    return None


#: The environments whose GRe pool steps every copy in the calling process (CartPole's numpy arrays): a GRe job
#: on them has no worker processes to spread over, whatever its threads.
ONE_PROCESS_POOLS = ("CartPole-v0",)


def make_env_pool(env_id: str, num_envs: int, profile: str | None = None, workers: int = 1):
    """``num_envs`` copies for GRe's m trajectories, stepped selectively (:mod:`crop.envs.vector`): CartPole
    vectorised in numpy; Atari in :class:`crop.envs.atari.AtariPool` (the profile's wrapper stack in
    ``workers`` processes, observations as pixels through shared memory: the same observations as
    ``EnvPool``'s, without pickling them); the others (highway) as independent copies in ``EnvPool``."""
    from crop.envs.vector import CartPolePool, EnvPool

    profile = profile or default_profile(env_id)
    check_profile(env_id, profile)
    if env_id in ONE_PROCESS_POOLS:
        return CartPolePool(num_envs, gym.spec(env_id).max_episode_steps)
    if env_id.endswith("NoFrameskip-v4") or env_family(env_id) == "atari":
        from crop.envs.atari import AtariPool

        return AtariPool(env_id, num_envs, workers, profile)
    return EnvPool(env_id, num_envs, workers, profile)


def to_obs(obs) -> np.ndarray:
    """The network's input as float32 (noise is added in this space)."""
    return np.asarray(obs, dtype=np.float32)


def snapshot(env: gym.Env):
    """A faithful copy of ``env``'s whole state, wrappers included.

    CartPole, highway and the vector family: ``copy.deepcopy`` of the *wrapped* env (the TimeLimit counter
    lives in the wrapper; :func:`snapshot_problem` checks that this is faithful for an id outside the
    paper's).  Atari: the emulator's own state plus every wrapper's state (deepcopy would silently give a
    fresh emulator at frame 0) — see :mod:`crop.envs.atari`.
    """
    from crop.envs.atari import atari_snapshot, is_atari

    return atari_snapshot(env) if is_atari(env) else copy.deepcopy(env)


def restore(env: gym.Env | None, snap) -> gym.Env:
    """An environment in the state ``snap`` was taken in; ``snap`` stays untouched for reuse.

    For Atari ``env`` (an instance with the same wrapper chain) is put into that state and returned; for
    the others a new copy of the snapshot is returned and ``env`` is ignored.
    """
    from crop.envs.atari import AtariSnapshot, atari_restore

    if isinstance(snap, AtariSnapshot):
        if env is None:
            raise ValueError("restoring an Atari snapshot needs the environment instance")
        return atari_restore(env, snap)
    return copy.deepcopy(snap)
