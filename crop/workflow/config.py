"""The workflow configuration: schema validation with defaults, semantic checks, and the target list.

Used by the Snakefile (before any job is scheduled) and by the CLI, so a bad config is refused with one
message that names the offending field, and nothing is computed.
"""
from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
import math
import os
import re
import stat
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from crop.agents.registry import resolve_source
from crop.io import CappedError, sha256_file
from crop.names import ACTION_TARGET, MAX_PARAMETERS, smoothing_targets

__all__ = ["ConfigError", "load_schema", "validate_config", "check_policy_files", "load_config", "certifications",
           "run_targets", "smoothing_targets", "sigma_label", "trusted_env_ids",
           "ALGORITHMS", "train_defaults", "train_settings", "target_return", "schema"]

ALGORITHMS = ["StdTrain", "GaussAug", "AdvTrain", "SA-MDP-PGD", "SA-MDP-CVX", "RadialRL", "CARRL",
              "NoisyNet", "GradDQN"]


class ConfigError(CappedError):
    pass


# YAML aliases let a small file stand for an enormous tree (a 2 KB config nested 7 levels deep): every loader
# and validator here first measures the tree with aliases expanded, and refuses one past this many values.
MAX_EXPANDED_VALUES = 100_000


def _expanded_size(obj, memo: dict) -> int:
    """Values in ``obj`` (parsed YAML: dicts, lists, scalars) with every shared sub-tree counted each time it
    is used — what an alias expands to — in time linear in the distinct objects."""
    key = id(obj)
    if key not in memo:
        memo[key] = 0   # a cycle (a recursive alias) counts once and then is refused by the bound below
        if isinstance(obj, dict):
            size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in obj.items())
        elif isinstance(obj, (list, tuple)):
            size = 1 + sum(_expanded_size(v, memo) for v in obj)
        else:
            size = 1
        memo[key] = min(size, 10 * MAX_EXPANDED_VALUES)
    return memo[key]


def _too_large(source: str) -> str:
    return (f"{source}: the YAML expands to more than {MAX_EXPANDED_VALUES:,} values (aliases repeating aliases): "
            "refused")


def check_expansion(obj, source: str, error=None) -> None:
    """Refuse (``error``, default :class:`ConfigError`) a parsed document whose aliases expand it past
    :data:`MAX_EXPANDED_VALUES` values."""
    if _expanded_size(obj, {}) > MAX_EXPANDED_VALUES:
        raise (error or ConfigError)(_too_large(source))


def load_bounded_yaml(text: str, source: str, error=None):
    """``yaml.safe_load`` that measures the document with aliases expanded (on the composed nodes, before any
    Python object is built) and refuses it past :data:`MAX_EXPANDED_VALUES` values."""
    loader = yaml.SafeLoader(text)
    try:
        return _bounded_document(loader, source, error or ConfigError)
    except RecursionError:
        raise (error or ConfigError)(f"{source}: the YAML is nested too deeply: refused") from None
    finally:
        loader.dispose()


def _node_size(node, memo: dict) -> int:
    """:func:`_expanded_size` on composed YAML nodes (an alias is the same node object reused)."""
    if id(node) not in memo:
        memo[id(node)] = 0
        kids = ([c for kv in node.value for c in kv] if isinstance(node, yaml.MappingNode) else
                node.value if isinstance(node, yaml.SequenceNode) else [])
        memo[id(node)] = min(1 + sum(_node_size(c, memo) for c in kids), 10 * MAX_EXPANDED_VALUES)
    return memo[id(node)]


def _bounded_document(loader, source: str, error):
    node = loader.get_single_node()
    if node is None:
        return None
    if _node_size(node, {}) > MAX_EXPANDED_VALUES:
        raise error(_too_large(source))
    return loader.construct_document(node)


@functools.lru_cache(maxsize=1)
def _schema_text() -> str:
    return resources.files("crop").joinpath("schemas/config.schema.yaml").read_text()


@functools.lru_cache(maxsize=1)
def _parsed_schema() -> dict:
    return yaml.load(_schema_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def schema() -> dict:
    """The config schema, parsed once and shared: read it, never change it (:func:`load_schema` gives a copy)."""
    return _parsed_schema()


def load_schema() -> dict:
    """A fresh copy of the config schema, for callers that change it."""
    return copy.deepcopy(_parsed_schema())


def _is_integer(checker, instance) -> bool:
    """JSON Schema's ``integer`` as the workflow needs it: a whole number written as one.  The standard counts
    2.0 as an integer, but a count or a seed reaches Python code and command lines as it is written."""
    return isinstance(instance, int) and not isinstance(instance, bool)


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]
    types = validator_class.TYPE_CHECKER.redefine("integer", _is_integer)

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults}, type_checker=types)


def _path(parts) -> str:
    """A config field's path as the errors name it: ``environments.CartPole-v0.sigmas[2]``; a key that is not
    a plain name (quotes, colons, spaces, empty) in brackets as JSON, so the path stays one unambiguous word."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and re.fullmatch(r"[\w\-/]+(?:\.[\w\-/]+)*", p):
            out += f".{p}" if out else p
        else:
            out += f"[{json.dumps(p) if isinstance(p, str) else json.dumps(str(p))}]"
    return out or "(top level)"


def _did_you_mean(word, choices) -> str:
    """' (did you mean 'sigmas'?)' for a misspelt key or name (difflib's close matches), else ''."""
    if not isinstance(word, str):
        return ""
    choices = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close and len(word) >= 3:  # an abbreviation: 'arch' for 'architecture'
        close = [c for c in choices if c.startswith(word)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _as_list(x) -> list:
    return [x] if isinstance(x, str) else list(x)


def _message(err: jsonschema.ValidationError) -> str:
    where = _path(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        named = ", ".join(f"{k!r}{_did_you_mean(k, allowed)}" for k in extra)
        return f"{where}: unknown key {named}; allowed: {sorted(allowed)}"
    if err.validator == "propertyNames" or (err.validator == "enum" and "propertyNames" in err.schema_path):
        return (f"{where}: unknown name {err.instance!r}{_did_you_mean(err.instance, err.validator_value)}; "
                f"allowed: {err.validator_value}")
    if err.validator in ("pattern", "maxLength") and "x-message" in err.schema:  # a label or an id: what it may be
        return f"{where}: {err.instance!r} {err.schema['x-message']}"
    if err.validator == "enum":
        return (f"{where}: {err.instance!r} is not one of {err.validator_value}"
                f"{_did_you_mean(err.instance, err.validator_value)}")
    if err.validator == "exclusiveMinimum":
        return f"{where}: {err.instance!r} must be > {err.validator_value}"
    if err.validator == "exclusiveMaximum":
        return f"{where}: {err.instance!r} must be < {err.validator_value}"
    if err.validator == "minimum":
        return f"{where}: {err.instance!r} must be >= {err.validator_value}"
    if err.validator == "maximum":
        return f"{where}: {err.instance!r} must be <= {err.validator_value}"
    if err.validator == "type" and "integer" in _as_list(err.validator_value) and isinstance(err.instance, float):
        whole = f"; write {int(err.instance)}" if err.instance.is_integer() else ""
        return f"{where}: {err.instance!r} is not an integer{whole}"
    if err.validator == "required":
        return f"{where}: {err.message}"
    return f"{where}: {err.message}"


def _non_finite(obj, parts=()):
    """The key path and value of the first NaN or ±inf anywhere in ``obj`` (YAML's .nan, .inf), else None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return parts, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        hit = _non_finite(v, (*parts, k))
        if hit:
            return hit
    return None


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
            return f"{_path(parts)}: {obj!r} contains a control character; give it without one"
        items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        for k, v in items:
            if isinstance(k, str) and _CONTROL.search(k):
                return f"{_path(parts)}: key {k!r} contains a control character"
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
                return f"{_path(parts)}: {value!r} is not a path; give a non-empty relative or absolute path"
            if value.startswith("-"):
                return (f"{_path(parts)}: {value!r} starts with '-', which a command reads as an option; write "
                        f"./{value} for a relative path")
            if "{" in value or "}" in value:
                return (f"{_path(parts)}: {value!r} contains a brace, which Snakemake reads as a wildcard; give "
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
    hit = _non_finite(cfg)
    if hit:
        raise ConfigError(f"{source}: invalid configuration: {_path(hit[0])}: {hit[1]} is not a finite number")
    envs = cfg.get("environments")
    both = [env for env, ec in envs.items() if isinstance(ec, dict) and "target" in ec and "targets" in ec] \
        if isinstance(envs, dict) else []
    if both:
        raise ConfigError(f"{source}: invalid configuration: environments.{both[0]}: give target or targets, not "
                          "both (targets lists several, target names one)")
    schema = _parsed_schema()
    cls = _with_defaults(jsonschema.validators.validator_for(schema))
    # At one path an unknown key comes first: a misspelt 'sigmaz' also makes 'sigmas' missing, and the
    # message should name the key that was written.
    errors = sorted(cls(schema).iter_errors(cfg), key=lambda e: (list(map(str, e.absolute_path)),
                                                                 e.validator != "additionalProperties", e.message))
    if errors:
        # Descend to the most specific error of a group (oneOf/anyOf) when there is one.
        err = errors[0]
        while err.context:
            err = sorted(err.context, key=lambda e: len(e.absolute_path))[-1]
        raise ConfigError(f"{source}: invalid configuration: {_message(err)}")
    trusted = trusted_env_ids(cfg, trust)
    _check_module_ids(cfg, trusted, source)
    # A second pass fills defaults inside objects that were themselves just defaulted.
    list(cls(schema).iter_errors(cfg))
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
                                  f"nine labels {ALGORITHMS}{_did_you_mean(algo, ALGORITHMS)}; a label of your own "
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
            raise ConfigError(f"{where}.{key}: its actions are continuous (a Box), so there are no Q-values, "
                              "probabilities or votes over a finite set of actions to smooth; leave it out "
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

    if ec.get("target") == ACTION_TARGET:   # no LoRe for a continuous-action agent (crop.workflow.layout.run_stages)
        return
    problem = snapshot_problem(env)
    if problem:
        raise ConfigError(f"{where}: {problem}; the workflow runs LoRe on every environment (crop loact and "
                          "crop gre run without it)")


def _policy_checks_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "crop" / "policy-checks"


def _policy_check_key(path, arch, fmt, sha256, env, profile) -> str | None:
    """What a policy file's check depends on, hashed: the sha256 of the file's bytes, every setting of the
    check and crop's version.  None (no memo) when the path is not a regular file within the size limit: the
    check itself then says what is wrong."""
    from crop import __version__
    from crop.agents.checkpoints import MAX_MEMBER_BYTES

    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MEMBER_BYTES:
        return None
    try:
        digest = sha256_file(path)
    except OSError:
        return None
    facts = {"file_sha256": digest, "architecture": arch, "format": fmt, "pinned_sha256": sha256, "env": env,
             "profile": profile, "crop": __version__}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _checked_network(key: str | None) -> str | None:
    """The network kind ("q" or "policy") a passed check of the same bytes and settings found, or None."""
    if key is None:
        return None
    try:
        kind = (_policy_checks_dir() / key).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return kind if kind in ("q", "policy") else None


def _remember_check(key: str, kind: str) -> None:
    """Remember a passed check (best effort: an unwritable cache only means checking again next time)."""
    folder = _policy_checks_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}"
        tmp.write_text(kind)
        os.replace(tmp, folder / key)
    except OSError:
        pass


def check_policy_files(cfg: dict, source: str = "config") -> dict:
    """Open and check every ``files.<label>`` entry of a validated config as its checkpoint job will
    (:func:`crop.agents.importing.check_policy_file`: a regular, readable file within the size limit, its pinned
    sha256, tensors only, finite real weights that fit the architecture, a network that takes the
    environment's observations and gives one value per action), then judge each environment's smoothing
    targets by what its networks are: a policy network has no Q-values (no q target), softmax of a
    Q-network's values is no policy (no probs target).  An environment that gives neither ``target`` nor
    ``targets`` smooths q for Q-networks and probs for policy networks (filled in as ``target: probs``).

    Returns the config (a copy where a target was filled in); raises :class:`ConfigError` in one line naming
    the entry.  Reads the files (torch is imported only when a config has one).  The workflow parses this
    config in its main process and again in every job's (each SLURM job's too): a check that passed is
    remembered under ``$XDG_CACHE_HOME/crop/policy-checks/``, keyed by the sha256 of the file's bytes, the
    check's settings and crop's version (:func:`_policy_check_key`), so the same bytes are checked once, and
    a changed file, setting or release is checked afresh.  (The checkpoint job's ``crop import`` checks the
    file again whatever the memo holds.)"""
    out = None
    for env, ec in cfg["environments"].items():
        if ec["source"] != "file" or not ec.get("files"):
            continue
        from crop.envs import default_profile

        networks = {}
        for label, f in ec["files"].items():
            check = (f["path"], f.get("architecture", "mlp"), f.get("format", "auto"), f.get("sha256"), env,
                     f.get("profile") or default_profile(env))
            key = _policy_check_key(*check)
            networks[label] = _checked_network(key)
            if networks[label] is None:
                from crop.agents.importing import check_policy_file  # torch: only when a file is checked
                from crop.models import CheckpointError

                try:
                    _, info = check_policy_file(*check)
                except CheckpointError as exc:
                    raise ConfigError(f"{source}: environments.{env}.files.{label}: {exc}") from None
                networks[label] = info["network"]
                if key is not None and _policy_check_key(*check) == key:   # the file did not change meanwhile
                    _remember_check(key, info["network"])
        # A derived policy (CARRL) is a Q-network built from its base's file, which must be one.
        for algo in ec["algorithms"]:
            kind, entry = resolve_source(env, algo, "file", ec["files"])
            if kind == "derive":
                if networks.get(entry["base"]) == "policy":
                    raise ConfigError(f"{source}: environments.{env}.files.{entry['base']}: {algo} is derived from "
                                      f"{entry['base']}'s Q-network, but {ec['files'][entry['base']]['path']} holds a "
                                      "policy network")
                networks[algo] = "q"
        used = {a: networks[a] for a in ec["algorithms"]}

        for algo, network in used.items():   # a Box environment takes actors, a Discrete one none
            if (network == "actor") != (ec.get("target") == ACTION_TARGET):
                what = ("a continuous-action actor" if network == "actor" else f"a discrete-action {network} network")
                held = ec["files"].get(algo, {}).get("path", f"{algo} (derived)")
                kind = "discrete" if network == "actor" else "continuous (a Box)"
                raise ConfigError(f"{source}: environments.{env}.files.{algo}: {held} holds {what}, but {env}'s "
                                  f"actions are {kind}")
        if "target" in ec or "targets" in ec:
            key = "targets" if "targets" in ec else "target"
            for algo, network in used.items():
                wrong = "q" if network == "policy" else "probs"
                if wrong in smoothing_targets(ec):
                    why = ("has no Q-values to smooth; use probs or vote" if network == "policy" else
                           "is a Q-network: softmax of its values is no policy; use vote or q")
                    raise ConfigError(f"{source}: environments.{env}.{key}: {wrong} for {algo}, which {why}")
            continue
        kinds = sorted(set(used.values()))
        if kinds == ["policy"]:
            out = out or copy.deepcopy(cfg)
            out["environments"][env]["target"] = "probs"
        elif len(kinds) > 1:
            policy = sorted(a for a, n in used.items() if n == "policy")
            q = sorted(a for a, n in used.items() if n == "q")
            raise ConfigError(f"{source}: environments.{env}: {', '.join(policy)} policy network(s) and "
                              f"{', '.join(q)} Q-network(s) have no smoothing target in common by default (probs, "
                              "q); give target: vote (any network), or certify them with separate configs")
    return out or cfg


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
    props = schema()["$defs"]["environment"]["properties"]["train"]["properties"]
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
