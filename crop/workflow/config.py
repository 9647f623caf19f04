"""The workflow configuration: validation against the schema (:mod:`crop.schema`), the checks the
schema cannot make, and the target list.

Used by the Snakefile (before any job is scheduled) and by the CLI, so a bad config is refused with one
message that names the offending field, and nothing is computed.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml

from crop.agents.registry import resolve_source
from crop.names import ACTION_TARGET, MAX_PARAMETERS, smoothing_targets
from crop.schema import (
    ConfigError,
    check_expansion,
    did_you_mean,
    error_message,
    field_path,
    load_bounded_yaml,
    non_finite,
    schema_node,
    validator_for,
)
from crop.workflow.policy_checks import check_policy_files
from crop.workflow.stage_table import config_schema

__all__ = ["ConfigError", "validate_config", "check_policy_files", "load_config", "certifications",
           "run_targets", "smoothing_targets", "sigma_label", "trusted_env_ids",
           "ALGORITHMS", "train_defaults", "train_settings", "target_return"]

ALGORITHMS = ["StdTrain", "GaussAug", "AdvTrain", "SA-MDP-PGD", "SA-MDP-CVX", "RadialRL", "CARRL",
              "NoisyNet", "GradDQN"]


#: Config keys that name files or folders (``*``: any key at that level).  They reach shell commands quoted,
#: and Snakemake's file patterns as they are, where a brace would start a wildcard.
PATH_KEYS = (("results",), ("checkpoints", "mirror"), ("checkpoints", "cache"), ("checkpoints", "lock"),
             ("audit", "reference"), ("audit", "tolerances"), ("environments", "*", "files", "*", "path"))
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _values_at(cfg, pattern, parts=()):
    if not pattern:
        yield parts, cfg
        return
    if isinstance(cfg, dict):
        for k in (cfg if pattern[0] == "*" else [pattern[0]] if pattern[0] in cfg else []):
            yield from _values_at(cfg[k], pattern[1:], (*parts, k))


def _check_strings(cfg: dict) -> str | None:
    """What is wrong with the first string that must not reach a file name or a log as it is: a control
    character (a newline, an escape) anywhere, or a path key that is empty or holds a brace."""
    def walk(obj, parts=()):
        if isinstance(obj, str) and _CONTROL.search(obj):
            return f"{field_path(parts)}: {obj!r} contains a control character; give it without one"
        items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        for k, v in items:
            if isinstance(k, str) and _CONTROL.search(k):
                return f"{field_path(parts)}: key {k!r} contains a control character"
            bad = walk(v, (*parts, k))
            if bad:
                return bad
        return None

    bad = walk(cfg)
    if bad:
        return bad
    for pattern in PATH_KEYS:
        for parts, value in _values_at(cfg, pattern):
            if not isinstance(value, str):
                continue
            if not value.strip():
                return f"{field_path(parts)}: {value!r} is not a path; give a non-empty relative or absolute path"
            if value.startswith("-"):
                return (f"{field_path(parts)}: {value!r} starts with '-', which a command reads as an option; write "
                        f"./{value} for a relative path")
            if "{" in value or "}" in value:
                return (f"{field_path(parts)}: {value!r} contains a brace, which Snakemake reads as a wildcard; give "
                        "the path without braces")
    return None


def trusted_env_ids(config: dict, trust=()) -> frozenset[str]:
    """The environment ids of ``config`` (parsed YAML, validated or not) whose ``module:Id`` form may import
    its module: those the config marks ``import_module: true``, and ``trust`` (``--trust-env``: ids the user
    typed).  Importing a module runs its code, and a config may come from someone else, so an id imports only
    when its reader says so for that id; this is the one place that decides."""
    envs = config.get("environments") if isinstance(config, dict) else None
    marked = [env for env, ec in envs.items() if isinstance(ec, dict) and ec.get("import_module") is True] \
        if isinstance(envs, dict) else []
    return frozenset([*marked, *trust])


def _check_module_ids(cfg: dict, trusted: frozenset, source: str) -> None:
    """Refuse, in one line and before anything imports it, a ``module:Id`` id that is not ``trusted``; and an
    ``import_module`` on an id that imports nothing."""
    for env, ec in cfg["environments"].items():
        if ":" not in env:
            if "import_module" in ec:
                raise ConfigError(f"{source}: environments.{env}.import_module: only a module:Id id imports a "
                                  "module; leave it out")
        elif env not in trusted:
            module, key = env.partition(":")[0], f'environments."{env}"'
            raise ConfigError(f"{source}: {key}: module:Id imports module {module}, which runs its code; set "
                              f"{key}.import_module: true if it is yours (crop validate-config, plan and audit "
                              f"also take --trust-env {env})")


def validate_config(config: dict, source: str = "config", trust=()) -> dict:
    """Validate ``config`` against the schema, fill in defaults, and check what the schema cannot: every
    number finite (before the schema's bounds, which NaN would pass or fail confusingly), no control
    character in any string, every path key a non-empty path.

    A ``module:Id`` environment id imports its module only when :func:`trusted_env_ids` allows it (the
    config's ``import_module: true``, or ``trust``: ``--trust-env``); any other is refused right after the
    schema, before any environment is looked up, and the checks that look environments up run inside
    :func:`crop.envs.untrusted_env_ids`, so validating a received config runs none of its code.

    Returns a new dict; raises :class:`ConfigError` naming the first bad field (in path order).
    """
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: the configuration must be a mapping, got {type(config).__name__}")
    check_expansion(config, source)
    cfg = copy.deepcopy(config)
    hit = non_finite(cfg)
    if hit:
        raise ConfigError(f"{source}: invalid configuration: {field_path(hit[0])}: {hit[1]} is not a finite number")
    envs = cfg.get("environments")
    both = [env for env, ec in envs.items() if isinstance(ec, dict) and "target" in ec and "targets" in ec] \
        if isinstance(envs, dict) else []
    if both:
        raise ConfigError(f"{source}: invalid configuration: environments.{both[0]}: give target or targets, not "
                          "both (targets lists several, target names one)")
    full = config_schema()
    cls = validator_for(full, defaults=True)
    # At one path an unknown key comes first: a misspelt 'sigmaz' also makes 'sigmas' missing, and the
    # message should name the key that was written.
    errors = sorted(cls(full).iter_errors(cfg), key=lambda e: (list(map(str, e.absolute_path)),
                                                                 e.validator != "additionalProperties", e.message))
    if errors:
        # Descend to the most specific error of a group (oneOf/anyOf) when there is one.
        err = errors[0]
        while err.context:
            err = sorted(err.context, key=lambda e: len(e.absolute_path))[-1]
        raise ConfigError(f"{source}: invalid configuration: {error_message(err)}")
    trusted = trusted_env_ids(cfg, trust)
    _check_module_ids(cfg, trusted, source)
    # A second pass fills defaults inside objects that were themselves just defaulted.
    list(cls(full).iter_errors(cfg))
    bad = _check_strings(cfg)
    if bad:
        raise ConfigError(f"{source}: invalid configuration: {bad}")
    _check_case(cfg, source)
    from crop.envs import untrusted_env_ids

    with untrusted_env_ids(trusted):
        _check_environments(cfg, config, source)
    return cfg


def _check_environments(cfg: dict, config: dict, source: str) -> None:
    """The checks of :func:`validate_config` that look the environments up (make them, read their spaces)."""
    for env, ec in cfg["environments"].items():
        given = (config["environments"].get(env) or {}).get("lore") or {}
        if "alpha_mode" not in given:   # LoRe follows the top-level alpha_mode unless it names its own
            ec["lore"]["alpha_mode"] = cfg["alpha_mode"]
    for env, ec in cfg["environments"].items():
        _continuous_target(env, ec, config["environments"].get(env) or {}, source)
    _resolve_auto_sizes(cfg)
    for env, ec in cfg["environments"].items():
        _check_environment(env, ec, source)
        for i, algo in enumerate(ec["algorithms"]):
            if algo not in ALGORITHMS and ec["source"] != "file":
                raise ConfigError(f"{source}: environments.{env}.algorithms[{i}]: {algo!r} is not one of the paper's "
                                  f"nine labels {ALGORITHMS}{did_you_mean(algo, ALGORITHMS)}; a label of your own "
                                  "needs source: file and "
                                  f"environments.{env}.files.{algo} (docs/own-policy.md)")
            try:
                kind, entry = resolve_source(env, algo, ec["source"], ec.get("files"))
                if kind == "derive":   # its base checkpoint is obtained under the same setting
                    resolve_source(env, entry["base"], ec["source"], ec.get("files"))
            except KeyError as exc:
                raise ConfigError(f"{source}: environments.{env}.algorithms[{i}]: {exc.args[0]}") from None
            # Trained, published and derived checkpoints are Q-networks: softmax(Q) is not a policy's
            # probabilities (a file's kind is known only once imported: the stage refuses it then).
            if kind != "file" and "probs" in smoothing_targets(ec):
                key = "targets" if "targets" in ec else "target"
                raise ConfigError(f"{source}: invalid configuration: environments.{env}.{key}: probs smooths a "
                                  f"policy network's probabilities; {algo} ({kind}) is a Q-network: use vote or q")


def _case_clash(names) -> tuple[str, str] | None:
    """Two of ``names`` that differ only in case (one folder on a case-insensitive file system), else None."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            return other, name
    return None


def _check_case(cfg: dict, source: str) -> None:
    """Environment ids and an environment's labels name folders and files: two that differ only in case would
    write into one folder on a case-insensitive file system (macOS, Windows, many shared drives)."""
    clashes = [("environments", _case_clash(cfg["environments"]))]
    for env, ec in cfg["environments"].items():
        labels = list(dict.fromkeys([*ec["algorithms"], *ec.get("files", {})]))
        clashes.append((f"environments.{env}.algorithms", _case_clash(labels)))
    for where, clash in clashes:
        if clash:
            raise ConfigError(f"{source}: invalid configuration: {where}: {clash[0]!r} and {clash[1]!r} differ only "
                              "in case, so their folders collide on a case-insensitive file system; rename one")


def _resolve_auto_sizes(cfg: dict) -> None:
    """Replace every ``auto`` sample size by the one the audit of this config needs
    (:mod:`crop.workflow.audit_sizes`)."""
    from crop.workflow.audit_sizes import global_episodes_needed

    for ec in cfg["environments"].values():
        if ec["attack"]["global_episodes"] == "auto":
            ec["attack"]["global_episodes"] = global_episodes_needed(cfg, ec)


def _continuous_target(env: str, ec: dict, given: dict, source: str) -> None:
    """A continuous-action environment (a Box) is certified through its action (target ``action``: LoAct
    per action dimension, GRe, the global attack; :func:`crop.workflow.layout.run_stages`): filled in here, since
    a Box agent has no Q-values, probabilities or votes over a finite set of actions to smooth.  It needs
    ``source: file`` (crop trains DQNs only); a target given for it is refused in one line."""
    from crop.envs import ENV_SPECS, action_bounds

    if env in ENV_SPECS:
        return
    try:
        if action_bounds(env) is None:
            return
    except Exception:   # an id crop cannot make: _check_environment names the problem in one line
        return
    where = f"{source}: environments.{env}"
    for key in ("target", "targets"):
        if key in given:
            what = "no targets for auto to choose among" if "auto" in str(given[key]) else \
                "no Q-values, probabilities or votes over a finite set of actions to smooth"
            raise ConfigError(f"{where}.{key}: its actions are continuous (a Box), so there are {what}; leave it out "
                              "(LoAct certifies the action per dimension by percentile smoothing)")
    if ec["source"] != "file":
        raise ConfigError(f"{where}.source: its actions are continuous (a Box), and crop trains and fetches "
                          "discrete-action DQNs only; give source: file with your agent's files "
                          "(docs/own-policy.md, Continuous-action agents)")
    ec["target"] = ACTION_TARGET


def _check_environment(env: str, ec: dict, source: str) -> None:
    """What the schema cannot check of one environment: the id is one crop can make (registered, Discrete
    actions), the reward facts GRe and LoRe need are known (the workflow runs both), LoRe can take faithful
    snapshots, and the files' profiles exist.  Only an id outside the paper's four makes an environment."""
    from crop.envs import (
        ENV_SPECS,
        MissingFactError,
        UnknownEnvError,
        check_profile,
        env_spec,
        missing_reward_range,
        snapshot_problem,
    )

    where = f"{source}: environments.{env}"
    rewards = ec.get("rewards", {})
    for key in ("range", "return_range"):
        lo_hi = rewards.get(key)
        if lo_hi is not None and not lo_hi[0] < lo_hi[1]:
            raise ConfigError(f"{where}.rewards.{key}: {lo_hi} must be [low, high] with low < high")
    try:
        spec = env_spec(env, rewards)
        for f in ec.get("files", {}).values():
            if f.get("profile") is not None:
                check_profile(env, f["profile"])
    except (UnknownEnvError, MissingFactError, ValueError) as exc:
        raise ConfigError(f"{where}: {str(exc).removeprefix(env + ': ')}") from None
    if rewards.get("clip"):   # one return per run: every stage that reports a return must clip the same way
        if ec.get("target") != ACTION_TARGET:
            raise ConfigError(f"{where}.rewards.clip: a discrete-action environment's LoRe and local attack bound "
                              "and attack the environment's own rewards, so clipping GRe's, the global attack's "
                              "and the benign returns would compare returns of two different rewards; leave it "
                              "out (crop gre / crop attack-global --clip-rewards clip by hand)")
        if rewards.get("range") is None:
            raise ConfigError(f"{where}.rewards.clip: clips every reward to rewards.range, which is not given; "
                              "give rewards.range: [low, high]")
        if rewards.get("return_range") is not None:
            # The game's return range does not bound the clipped return (clipping lifts low rewards and cuts
            # high ones), and GRe's bounds would rest on it.
            raise ConfigError(f"{where}.rewards.return_range: bounds the game's own return, not the return of "
                              "rewards clipped to rewards.range (rewards.clip); leave one of them out")
    if len(spec.obs_shape) == 1:   # a vector environment's trained policy is an MLP of train.hidden
        dims = [spec.obs_shape[0], *ec["train"]["hidden"], spec.n_actions]
        n = sum((a + 1) * b for a, b in zip(dims, dims[1:]))
        if n > MAX_PARAMETERS:
            raise ConfigError(f"{where}.train.hidden: {ec['train']['hidden']} makes an MLP of {n:,} parameters, over "
                              f"the limit of {MAX_PARAMETERS:,} (1 GiB of float32 weights)")
    if spec.reward_range is not None:
        try:
            spec.return_range(ec["gre"]["horizon"], ec["gre"]["gamma"])
        except ValueError as exc:
            raise ConfigError(f"{where}.rewards.range: {exc} (gre.horizon)") from None
    if env in ENV_SPECS:
        return
    if spec.reward_range is None:
        raise ConfigError(f"{source}: {missing_reward_range(env)}")

    if ec.get("target") == ACTION_TARGET or "lore" in ec.get("skip", ()):   # no LoRe (layout.run_stages)
        return
    problem = snapshot_problem(env)
    if problem:
        raise ConfigError(f"{where}: {problem}; LoRe cannot run on it: give skip: [lore] (the other stages run "
                          "without it)")


def load_config(path: str | Path, trust=()) -> dict:
    """The validated config of the file ``path``; ``trust``: the ``module:Id`` ids the command line allows to
    import their module (:func:`validate_config`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file; give the path of a workflow config (config.yaml or "
                          "one in configs/)")
    try:
        data = load_bounded_yaml(path.read_text(), str(path))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    return validate_config(data or {}, str(path), trust)


def sigma_label(sigma: float) -> str:
    """σ as it appears in paths and figure names (the paper's spelling: 0.001, 0.1, 1.0, 1.5)."""
    return repr(float(sigma))


def certifications(cfg: dict) -> list[tuple[str, str, str]]:
    """(env, algo, sigma label) for every certification the config asks for."""
    return [(env, algo, sigma_label(s))
            for env, ec in cfg["environments"].items()
            for algo in ec["algorithms"]
            for s in ec["sigmas"]]


def run_targets(cfg: dict) -> list[tuple[str, str, str, str]]:
    """(env, algo, sigma label, smoothing target) for every run the config asks for."""
    return [(env, algo, sigma_label(s), t)
            for env, ec in cfg["environments"].items()
            for algo in ec["algorithms"]
            for s in ec["sigmas"]
            for t in smoothing_targets(ec)]


def train_defaults() -> dict:
    """The defaults of an environment's ``train`` block, from the schema (the one place they live)."""
    props = schema_node("environment.train")["properties"]
    return {k: copy.deepcopy(v["default"]) for k, v in props.items() if "default" in v}


def train_settings(env_cfg: dict, algo: str) -> dict:
    """What ``crop train``/``crop derive`` need of a validated environment block for one algorithm: the
    common budget, the DQN overrides and this algorithm's recipe overrides only (so that changing one
    recipe's settings does not invalidate the other algorithms' checkpoints)."""
    train = env_cfg.get("train", {})
    out = {k: copy.deepcopy(v) for k, v in train.items() if k != "recipes"}
    recipe = train.get("recipes", {}).get(algo)
    if recipe:
        out["recipes"] = {algo: copy.deepcopy(recipe)}
    return out


def target_return(env_id: str, value: float | None) -> float | None:
    """A config's ``train.target_return``: null means the environment's own threshold (CartPole-v0: 195,
    "solved"; None — no threshold — for the others)."""
    from crop.envs import env_spec  # lazily: the Snakefile imports this module

    return env_spec(env_id).solved_return if value is None else value
