"""Sample sizes from the audit's needs: the fewest attacked episodes that let every check of the audit a
config will produce fail on its own (docs/audit.md, "Sizes from the audit's needs").

The audit (:mod:`crop.audit.audit`) judges its chance-based checks by Tarone's restriction and Holm's
step-down at ``audit.alpha``: a check is in the audit's family — can be significant on its own — when its
smallest achievable p-value is at most α/K, with K at most the number T of chance-based tests.  So a check
whose smallest p is ≤ α/T is testable whatever K turns out to be.  A GRe percentile check of n attacked
episodes has smallest p = pⁿ (every attacked return below J̲_p), hence n ≥ log(α/T)/log(p).  The other
checks need nothing from the config here: a single LoRe return (smallest p = α_spent) is judged by its pooled
count over runs, and a flip count's sequential test (smallest p far below α/T) is in the family by itself; both
are counted in T.

The re-run's sizes (``crop audit --rerun``) are here too, so that the parser's help states them from the values
the re-run uses."""
from __future__ import annotations

import math

from crop.names import smoothing_targets

__all__ = ["planned_chance_checks", "global_episodes_needed", "BUDGET_MINUTES", "TIMEOUT_FACTOR", "TIMEOUT_EXTRA_S"]

#: Minutes a re-run job may be predicted to take (``crop audit --rerun-budget``'s default).
BUDGET_MINUTES = 10.0
#: A started job is ended past TIMEOUT_FACTOR × its predicted seconds + TIMEOUT_EXTRA_S: the cost model aims at
#: 0.5–2× of a job's time (docs/speed.md), so 4× covers a machine twice as slow as its table, and the seconds
#: cover the child's imports on a loaded machine.
TIMEOUT_FACTOR, TIMEOUT_EXTRA_S = 4.0, 120.0


def _checks_per_run(ec: dict) -> int:
    """Chance-based checks of one complete run: at each ε both the global attack and GRe have, the
    expectation bound and each percentile bound; at each ε of the local attack, LoRe's bound and the flip
    count of the attack's certified steps."""
    common = ({round(float(e), 12) for e in ec["attack"]["global_eps_factors"]}
              & {round(float(e), 12) for e in ec["gre"]["eps_factors"]})
    return len(common) * (1 + len(ec["gre"]["percentiles"])) + 2 * len(ec["attack"]["local_eps_factors"])


def planned_chance_checks(cfg: dict) -> int:
    """T: the chance-based tests the audit of ``cfg``'s runs will have at most — every run's checks and one
    pooled count per kind (expectation, each percentile, LoRe, flips)."""
    per_runs = sum(len(ec["algorithms"]) * len(ec["sigmas"]) * len(smoothing_targets(ec)) * _checks_per_run(ec)
                   for ec in cfg["environments"].values())
    kinds = 3 + len({p for ec in cfg["environments"].values() for p in ec["gre"]["percentiles"]})
    return per_runs + kinds


def global_episodes_needed(cfg: dict, ec: dict) -> int:
    """The fewest global-attack episodes n with pⁿ ≤ α/T for every percentile p of the environment ``ec``."""
    level = float(cfg["audit"]["alpha"]) / planned_chance_checks(cfg)
    return max(1, max(math.ceil(math.log(level) / math.log(p) - 1e-12) for p in ec["gre"]["percentiles"]))
