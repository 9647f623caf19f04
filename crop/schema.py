"""The config schema (crop/schemas/config.schema.yaml), the one place a setting's type, bounds and default live,
and how a document is read against it: YAML bounded in size, the schema parsed once, its defaults filled in,
and a failed check said in one line that names the field.

Every layer reads the schema through one accessor: :func:`parsed_schema` (the whole, parsed once),
:func:`schema_node` (a setting's node, its ``$ref`` resolved by :func:`resolved`, the one resolver) and
:func:`schema_default` (a setting's default: the settings objects of every layer take theirs from it, through
:func:`default_of`).  Every check against it is the jsonschema validator's, with the workflow's ``integer``
(:func:`validator_for`): the config's (crop.workflow.config), a flag's (crop.workflow.cli_options,
:func:`node_errors`) and a received record's (crop.report.records, crop.audit.rerun).
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
import re
from importlib import resources

import jsonschema
import yaml

from crop.io import CappedError

__all__ = ["parsed_schema", "resolved", "schema_node", "schema_default", "default_of", "load_schema",
           "ConfigError", "MAX_EXPANDED_VALUES", "check_expansion", "load_bounded_yaml", "is_integer",
           "validator_for", "node_errors", "field_path", "did_you_mean", "as_list", "error_message",
           "non_finite"]


@functools.lru_cache(maxsize=1)
def parsed_schema() -> dict:
    """The config schema, parsed once and shared by every reader: read it, never change it."""
    text = resources.files("crop").joinpath("schemas/config.schema.yaml").read_text()
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def resolved(node: dict) -> dict:
    """A schema node with its ``$ref`` (to ``#/$defs/…``) merged in; the node's own keywords win."""
    if "$ref" not in node:
        return node
    target = parsed_schema()
    for part in node["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    return {**resolved(target), **{k: v for k, v in node.items() if k != "$ref"}}


def schema_node(key: str, schema: dict | None = None) -> dict:
    """The schema node of ``key``, its ``$ref`` resolved: a top-level setting (``"chunk"``,
    ``"report.table_eps_factors"``) or a definition's (``"label"``; ``"environment.gre.batch"``, a key of an
    environment's block), each dot a step into ``properties``; of ``schema``, the loaded one by default (or
    one with the added stages' blocks, crop.workflow.stage_table.config_schema).  Read it, never change it."""
    schema = parsed_schema() if schema is None else schema
    first, *rest = key.split(".")
    node = resolved(schema["properties"][first] if first in schema["properties"] else schema["$defs"][first])
    for part in rest:
        node = resolved(node["properties"][part])
    return node


def schema_default(key: str):
    """The schema's default of a top-level key (``"chunk"``) or of an environment's (``"environment.gre.batch"``),
    a fresh copy: a settings field's ``default_factory``, so a library caller computes what the workflow does."""
    return copy.deepcopy(schema_node(key)["default"])


def default_of(key: str):
    """``dataclasses.field`` whose default is :func:`schema_default` of ``key``, read when an object is made."""
    return dataclasses.field(default_factory=functools.partial(schema_default, key))


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


def load_schema() -> dict:
    """A fresh copy of the config schema, for callers that change it."""
    return copy.deepcopy(parsed_schema())


def is_integer(checker, instance) -> bool:
    """JSON Schema's ``integer`` as the workflow needs it: a whole number written as one.  The standard counts
    2.0 as an integer, but a count or a seed reaches Python code and command lines as it is written."""
    return isinstance(instance, int) and not isinstance(instance, bool)


def validator_for(schema: dict, *, defaults: bool = False):
    """The validator class every check of crop uses: jsonschema's for ``schema``'s draft, its ``integer``
    :func:`is_integer`'s; with ``defaults``, one that fills each missing property with its default (a copy) as
    it validates, so a config is checked and completed in one walk."""
    base = jsonschema.validators.validator_for(schema)
    types = base.TYPE_CHECKER.redefine("integer", is_integer)
    if not defaults:
        return jsonschema.validators.extend(base, type_checker=types)
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults}, type_checker=types)


def node_errors(node: dict, value) -> list[jsonschema.ValidationError]:
    """Every way ``value`` fails ``node`` (a node of the config schema, or an object of such nodes), by the
    validator configs are checked with (:func:`validator_for`), its ``$ref``s resolved against the schema's
    ``$defs``.  It reads ``value``, never changes it (no defaults filled in)."""
    return list(_node_validator()({**node, "$defs": parsed_schema()["$defs"]}).iter_errors(value))


@functools.cache
def _node_validator():
    return validator_for(parsed_schema())


def field_path(parts) -> str:
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


def did_you_mean(word, choices) -> str:
    """' (did you mean 'sigmas'?)' for a misspelt key or name (difflib's close matches), else ''."""
    if not isinstance(word, str):
        return ""
    choices = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close and len(word) >= 3:  # an abbreviation: 'arch' for 'architecture'
        close = [c for c in choices if c.startswith(word)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def as_list(x) -> list:
    return [x] if isinstance(x, str) else list(x)


def error_message(err: jsonschema.ValidationError) -> str:
    where = field_path(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        named = ", ".join(f"{k!r}{did_you_mean(k, allowed)}" for k in extra)
        return f"{where}: unknown key {named}; allowed: {sorted(allowed)}"
    if err.validator == "propertyNames" or (err.validator == "enum" and "propertyNames" in err.schema_path):
        return (f"{where}: unknown name {err.instance!r}{did_you_mean(err.instance, err.validator_value)}; "
                f"allowed: {err.validator_value}")
    if err.validator in ("pattern", "maxLength") and "x-message" in err.schema:  # a label or an id: what it may be
        return f"{where}: {err.instance!r} {err.schema['x-message']}"
    if err.validator == "enum":
        return (f"{where}: {err.instance!r} is not one of {err.validator_value}"
                f"{did_you_mean(err.instance, err.validator_value)}")
    if err.validator == "exclusiveMinimum":
        return f"{where}: {err.instance!r} must be > {err.validator_value}"
    if err.validator == "exclusiveMaximum":
        return f"{where}: {err.instance!r} must be < {err.validator_value}"
    if err.validator == "minimum":
        return f"{where}: {err.instance!r} must be >= {err.validator_value}"
    if err.validator == "maximum":
        return f"{where}: {err.instance!r} must be <= {err.validator_value}"
    if err.validator == "type" and "integer" in as_list(err.validator_value) and isinstance(err.instance, float):
        whole = f"; write {int(err.instance)}" if err.instance.is_integer() else ""
        return f"{where}: {err.instance!r} is not an integer{whole}"
    if err.validator == "required":
        return f"{where}: {err.message}"
    return f"{where}: {err.message}"


def non_finite(obj, parts=()):
    """The key path and value of the first NaN or ±inf anywhere in ``obj`` (YAML's .nan, .inf), else None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return parts, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        hit = non_finite(v, (*parts, k))
        if hit:
            return hit
    return None
