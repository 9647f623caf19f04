"""What a run's soundness checks read and return: the inputs of their chance estimates from the run's files
(the V range, the attack's m, α and horizon, LoRe's settings and certified states), one check's row, and the
tolerance a bound is compared with."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from crop import columns as cols
from crop.io import meta_path, read_json
from crop.report.metrics import spec_fact
from crop.report.records import read_table
from crop.workflow.layout import RUN_FILES

__all__ = ["TOL", "NOT_RECORDED", "row", "chance_inputs", "radius_columns", "planned_horizon"]

TOL = 1e-9


NOT_RECORDED = "not recorded"

def row(check: str, eps: float, bound, observed, violation: bool = False, **evidence) -> dict:
    return {"check": check, "eps": eps, "bound": bound, "observed": observed, "violation": bool(violation),
            **evidence}

def chance_inputs(d: Path, env: str, n_actions: int | None = None) -> dict:
    """What the chance estimates need, from the run's files; missing entries are None.  ``n_actions``: the
    smoothed network's outputs (read from its checkpoint's model.json by :func:`crop.audit.checks.run_checks`),
    the actions a flip can go to."""
    def meta(key):
        f = meta_path(d / RUN_FILES[key])
        return read_json(f) if f.is_file() else {}

    lm, am, lo = meta("loact"), meta("attack_local"), meta("lore")
    q = read_json(d / RUN_FILES["qrange"]) if (d / RUN_FILES["qrange"]).is_file() else {}
    v_min = lm.get("v_min", q.get("v_min"))
    v_max = lm.get("v_max", q.get("v_max"))
    a_set = am.get("settings") or {}
    def table(key):
        return read_table(d / RUN_FILES[key]) if (d / RUN_FILES[key]).is_file() else None

    lore_states = table("lore_states")
    if lore_states is not None:
        # LoRe wrote one radius column per output of the smoother it used: never count fewer (model.json is not
        # hashed; an edited or missing record must not shrink a flip bound).
        n_actions = max(n_actions or 0, len(radius_columns(lore_states))) or None
    return {"steps": table("loact"), "attack_steps": table("attack_local_steps"), "lore_states": lore_states,
            "lore_horizon": (lo.get("settings") or {}).get("horizon"),
            # what makes the attacked return and LoRe's bound compare like for like (a replay of one game)
            "attack_gamma": a_set.get("gamma", NOT_RECORDED), "lore_gamma": (lo.get("settings") or {}).get(
                "gamma", NOT_RECORDED), "attack_reward_modification": am.get("reward_modification", NOT_RECORDED),
            "lore_reward_modification": (lo.get("search") or {}).get("reward_modification", NOT_RECORDED),
            "lore_pruning": (lo.get("search") or {}).get("pruning"), "reward_min": _reward_min(env, lo),
            "v_min": v_min, "v_max": v_max, "m": a_set.get("m"), "horizon": a_set.get("horizon"),
            "alpha": am.get("per_state_alpha", a_set.get("alpha")), "n_actions": n_actions,
            "loact_alpha": lm.get("per_state_alpha"), "lore_alpha": _lore_largest_state_alpha(lo)}

def _reward_min(env: str, lmeta: dict) -> float | None:
    """The lowest reward per step LoRe counted, for unmodified rewards: the lower end of the reward range its
    run declared (``settings.reward_range``, the config's ``rewards.range``), else the environment's own; None
    where unknown or where LoRe modified the rewards."""
    if (lmeta.get("search") or {}).get("reward_modification") is not None:
        return None
    declared = (lmeta.get("settings") or {}).get("reward_range")
    rr = declared if isinstance(declared, (list, tuple)) and len(declared) == 2 else spec_fact(env, "reward_range")
    try:
        return float(rr[0]) if rr is not None else None
    except (TypeError, ValueError):
        return None

def _lore_largest_state_alpha(lmeta: dict):
    """The largest per-state α LoRe used (its first state's under alpha_mode family), or None."""
    search = lmeta.get("search") or {}
    for a in (search.get("per_state_alpha_first"), search.get("per_state_alpha"),
              (lmeta.get("settings") or {}).get("alpha")):
        if a is not None:
            return float(a)
    return None


def radius_columns(states: pd.DataFrame) -> list[str]:
    """lore_states.csv's ``radius_a`` columns in action order: one per output of the smoothed network, which
    may be fewer than the environment's actions (a policy trained on a reduced action set)."""
    n = sum(1 for name in states.columns if re.fullmatch(rf"{cols.RADIUS}_\d+", str(name)))
    return [f"{cols.RADIUS}_{a}" for a in range(n)]

def planned_horizon(r, chance: dict | None) -> int | None:
    """The attacked episode's planned length (its ``horizon`` column, else the attack's recorded setting)."""
    if cols.HORIZON in r.index and not pd.isna(r[cols.HORIZON]):
        return int(r[cols.HORIZON])
    h = (chance or {}).get("horizon")
    return int(h) if h is not None else None
