"""Column names of the per-run result tables (the CSV files of :data:`crop.workflow.layout.RUN_FILES`) that the report
reads: each spelled once, here, for the stages that write them and for :mod:`crop.report` and :mod:`crop.audit`
that read them.
Standard library only (nothing is imported).

=====================  ====================================================================================
file                   columns read by the report
=====================  ====================================================================================
loact.csv              EPISODE, STEP, ACTION (a₁), CERTIFIED, RADIUS (Theorem 1), SMOOTHED_TOP,
                       SMOOTHED_RUNNER_UP, SMOOTHED_TOP_LOWER (L(a₁)), SMOOTHED_OTHERS_UPPER_MAX (max U(a),
                       a ≠ a₁) — one row per step of LoAct's episodes
loact_episodes.csv     EPISODE, RETURN, STEPS — one row per episode
certified_ratio.csv    R, EPISODE, ETA (η_r, Section 6.1)
gre.csv                EPS, P, EXPECTATION_BOUND (max(J̲_E, J_min), Theorem 2; EXPECTATION_BOUND_RAW: J̲_E),
                       PERCENTILE_BOUND (J̲_p, Theorem 3),
                       PERCENTILE_CERTIFIED, HORIZON, ALPHA, SIGMA, J_MIN, J_MAX — one row per (ε, p)
gre_returns.csv        RETURN — one row per σ-randomized trajectory
lore.csv               EPS, LOWER_BOUND (J̲, Theorem 4) — the step function (ε_i, J̲_i)
attack_local.csv       EPS, EPISODE, RETURN, STEPS, FLIPS_CERTIFIED, SAME_START_AS_LORE, HORIZON
attack_local_steps.csv EPS, EPISODE, STEP, OBS_DIGEST, CLEAN_ACTION (a₁), ACTION (attacked), CERTIFIED, RADIUS,
                       SMOOTHED_TOP_LOWER, SMOOTHED_OTHERS_UPPER_MAX, RETURN_SO_FAR (the discounted return before the
                       step, as LoRe counts a node's) — one row per attacked step
lore_states.csv        OBS_DIGEST, STEP (depth), EPS, ACTION (a₁), CERTIFIED, SMOOTHED_TOP_LOWER, ALPHA, RADIUS_a
                       (``radius_0``, …: r(a) of every action) — one row per state LoRe smoothed
attack_global.csv      EPS, EPISODE, RETURN, HORIZON
=====================  ====================================================================================

The SMOOTHED_ columns hold the smoothed output of the run's target (:mod:`crop.smoothing.smoothed`) at a state:
the smoothed Q̃(s, a) for ``q``, the smoothed action probability for ``probs``, the vote share for ``vote``.
:data:`FORMER_NAMES` maps the names older folders gave them to these (:func:`current_names`, through which
:func:`crop.report.records.read_table` reads every received table).
"""

EPISODE = "episode"
STEP = "step"
STEPS = "steps"
CERTIFIED = "certified"
RADIUS = "radius"
#: The top action a₁'s smoothed output (the estimate's mean).
SMOOTHED_TOP = "smoothed_top"
#: The largest smoothed output among the other actions.
SMOOTHED_RUNNER_UP = "smoothed_runner_up"
#: L(a₁): the lower confidence bound of the top action's smoothed output.
SMOOTHED_TOP_LOWER = "smoothed_top_lower"
#: max_{a≠a₁} U(a): the largest upper confidence bound among the other actions.
SMOOTHED_OTHERS_UPPER_MAX = "smoothed_others_upper_max"
RETURN = "return"
RETURN_SO_FAR = "return_so_far"
R = "r"
ETA = "eta"
EPS = "eps"
P = "p"
EXPECTATION_BOUND = "expectation_bound"
EXPECTATION_BOUND_RAW = "expectation_bound_raw"
PERCENTILE_BOUND = "percentile_bound"
PERCENTILE_CERTIFIED = "percentile_certified"
HORIZON = "horizon"
ALPHA = "alpha"
SIGMA = "sigma"
J_MIN = "j_min"
J_MAX = "j_max"
LOWER_BOUND = "lower_bound"
FLIPS_CERTIFIED = "flips_certified"
SAME_START_AS_LORE = "same_start_as_lore"
OBS_DIGEST = "obs_digest"
ACTION = "action"
CLEAN_ACTION = "clean_action"

#: The names older folders' tables gave the SMOOTHED_ columns (they read "q" whatever the target).
FORMER_NAMES = {"q_top": SMOOTHED_TOP, "q_runner_up": SMOOTHED_RUNNER_UP, "q_top_lower": SMOOTHED_TOP_LOWER,
                "q_others_upper_max": SMOOTHED_OTHERS_UPPER_MAX}


def current_names(names) -> list[str]:
    """A table's column names, each former name (:data:`FORMER_NAMES`) read as its column's current one: the one
    place a received header is mapped."""
    return [FORMER_NAMES.get(n, n) for n in names]
