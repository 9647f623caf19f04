"""The handlers of the per-run stages of :data:`crop.workflow.stage_table.STAGES`: one ``cmd_*`` function per
``crop`` subcommand, called with the parsed arguments (aggregate and audit: :mod:`crop.handlers.report`).

Certification and attacks run the same sequence (:class:`StageRun`): verify and load the checkpoint and the V
range, build the smoothed Q-values with the stage's own noise stream, run one certifier or attack, then write
each output atomically with its provenance (settings, seed, input hashes, confidence accounting) in
``.meta.json``.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from crop import columns as cols
from crop.handlers.auto_target import pilot_flags, pilot_settings, predicted_text, resolve_auto
from crop.io import InputError, write_frames
from crop.names import AUTO_TARGET, CONTINUOUS_BOUND
from crop.schema import schema_default
from crop.workflow.stage_table import STAGES

__all__ = ["StageRun", "cmd_qrange", "cmd_loact", "cmd_gre", "cmd_lore", "cmd_attack_local", "cmd_attack_global"]


def setup(args) -> float:
    import torch

    torch.set_num_threads(args.threads)
    return time.time()


def recorded_settings(args, **resolved) -> dict:
    """The settings a result records: every option as it ran (a stage's --settings spelled out, and what the
    stage ``resolved`` itself, such as the target or GRe's block)."""
    skip = {"progress"} | ({"settings"} if args.command in STAGES else set())
    return {**{k: v for k, v in vars(args).items() if k not in skip}, **resolved}


def _episode_seeds(seed: int, env: str, n: int, kind: str = "episode") -> list[int]:
    """Initial-state seeds shared by every algorithm and σ, so their numbers compare like for like (LoAct,
    the V range, LoRe's initial state and the local attack, whose checks hold given the initial state)."""
    from crop.io import derive_seed

    return [derive_seed(seed, env, kind, i) % (2**31) for i in range(n)]


def global_attack_seeds(seed: int, env: str, algo: str, sigma: float, eps_grid, n: int) -> list:
    """The global attack's initial-state seeds, one list of ``n`` per ε, drawn afresh for every run (env,
    algo, σ) and ε.  GRe's bounds (Theorems 2, 3) are about the return from a *random* initial state: the
    audit counts its checks over runs and ε as independent, which initial states shared between them would
    break (their counts would move together).  Like the stage's noise seed they name the algorithm, not the
    target: the global attack acts by π′, the same for every target, so a target's run holds the same
    numbers — a duplicate the audit's pooled counts recognise by its seed and leave out."""
    from crop.io import derive_seed

    return [[derive_seed(seed, env, algo, repr(float(sigma)), "global-attack-episode", repr(float(e)), i)
             % (2**31) for i in range(n)] for e in eps_grid]


def _stage_seed(args, stage: str) -> int:
    from crop.io import derive_seed

    return derive_seed(args.seed, args.env, args.algo, repr(float(args.sigma)), stage)


def resolve_target(args, meta: dict) -> str:
    """The smoothing target of a stage: ``--target``, else the checkpoint's default (``probs`` for a policy
    network, ``q`` for a Q-network); ``q`` of a policy network is refused (it has no Q-values), and so is
    ``probs`` of a Q-network (softmax(Q) depends on the Q-values' scale: not a policy's probabilities).
    ``auto`` is returned as such (:func:`resolve_auto` reads the choice)."""
    network = meta.get("network", "q")
    if network == "actor":
        return _actor_target(args)
    target = getattr(args, "target", None) or ("probs" if network == "policy" else "q")
    if target == AUTO_TARGET:
        return AUTO_TARGET
    if network == "policy" and target == "q":
        raise InputError(f"{args.checkpoint}: a policy network (model.json network: policy) has no Q-values to "
                         "smooth; use --target probs or vote (config: target)")
    if network == "q" and target == "probs":
        raise InputError(f"{args.checkpoint}: a Q-network (model.json network: q) has no action probabilities "
                         "(softmax of Q-values depends on their scale); use --target vote or q (config: target)")
    return target


#: What the stages that smooth over a finite set of actions are (their rows of the stage table), for the
#: one-line refusal of a continuous agent.
_DISCRETE_ONLY = {name: row.discrete for name, row in STAGES.items() if row.discrete}


def _actor_target(args) -> str:
    """The target of a continuous-action actor (model.json network: actor): its action itself, certified per
    dimension by percentile smoothing (crop loact); q, probs and vote, and the stages built on a finite set of
    actions, are refused in one line."""
    if args.command in _DISCRETE_ONLY:
        raise InputError(f"{args.checkpoint}: a continuous-action agent (model.json network: actor): "
                         f"{_DISCRETE_ONLY[args.command]}, which a Box action space does not have; crop gre, "
                         "crop attack-global and crop loact (per action dimension) certify it")
    target = getattr(args, "target", None)
    if target == AUTO_TARGET:
        raise InputError(f"{args.checkpoint}: --target auto: a continuous-action agent (model.json network: actor) "
                         "has no smoothing targets to choose among; leave the target out (config: target)")
    if target:
        what = {"q": "Q-values", "probs": "action probabilities", "vote": "greedy-action votes"}.get(target, target)
        raise InputError(f"{args.checkpoint}: a continuous-action agent (model.json network: actor) has no {what} "
                         f"over a finite set of actions (--target {target}); leave the target out (config: target): "
                         "LoAct certifies its action per dimension by percentile smoothing")
    return "action"


class StageRun:
    """One run of a certification or attack stage (its row of the stage table:
    :class:`crop.workflow.stage_table.StageRow`),
    what every such run shares: verify and load the checkpoint (and the V range where its row of
    the stage table reads one), build the smoother, then record provenance and write each output atomically
    beside its ``.meta.json``.  ``resolved``: parameters the stage settled itself, recorded as they ran."""

    def __init__(self, args, **resolved):
        from crop.certify.qrange import load_qrange
        from crop.models import load_checkpoint
        from crop.smoothing.smoothed import TARGET_RANGE

        self.args, self.row = args, STAGES[args.command]
        self.name = self.row.rule
        self.started = setup(args)
        self.net, self.meta = load_checkpoint(args.checkpoint, args.env, args.algo)
        self.profile = self.meta.get("profile")
        self.target = resolve_target(args, self.meta)
        self.seed = _stage_seed(args, args.command)
        self.choice = None
        if self.target == AUTO_TARGET and self.row.v_range:   # the target chosen by qrange's pilot, as if given
            self.target, self.choice = resolve_auto(args, self.meta, self.seed)
        self.resolved = {**resolved, **({"target": self.target} if self.row.v_range else {})}
        # The V range is the q target's only: probs and vote lie in [0, 1] (Theorem 1 with V range [0, 1]).
        qrange = self.row.v_range and self.target == "q"
        self.inputs = ("checkpoint", "qrange") if qrange or self.choice else ("checkpoint",)
        if qrange:
            if not getattr(args, "qrange", None):
                raise InputError("the q target needs --qrange (qrange.json of the same env/algo/sigma)")
            self.v_min, self.v_max = load_qrange(args.qrange, args.env, args.algo, args.sigma)
        elif self.target in TARGET_RANGE:
            self.v_min, self.v_max = TARGET_RANGE[self.target]
        self.device = args.device

    def smoother(self, alpha: float):
        """Smoothed Q-values (Definition 1) of the checkpoint, with the stage's own noise stream."""
        from crop.models import n_actions
        from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

        a = self.args
        # The action count is the checkpoint's (SA-DQN's Pong networks use 4 of the 6 actions).
        settings = SmoothingSettings(a.sigma, a.m, self.v_min, self.v_max, alpha, bound=a.bound, target=self.target,
                                     chunk=a.chunk, seed=self.seed, device=a.device)
        sm = SmoothedNetwork(self.net, settings, n_actions(self.meta["net_spec"]))
        self.device = str(sm.device)
        return sm

    def provenance(self, **info) -> dict:
        from crop.io import provenance, sha256_file

        a = self.args
        inputs = {n: {"path": str(getattr(a, n)), "sha256": sha256_file(getattr(a, n))} for n in self.inputs}
        prov = provenance(self.name, recorded_settings(a, **self.resolved), seed=self.seed, inputs=inputs,
                          device=self.device, started=self.started)
        # --target auto: settings.target is the chosen target; the pilot's record beside it
        return {**prov, **({"target_choice": self.choice} if self.choice else {}), **info}

    def write(self, info: dict, **outputs) -> None:
        """``outputs``: an output's key in the stage table → a table, or ``(writer, rows)``; an optional output
        whose flag was not given is skipped."""
        from crop.io import write_csv, write_with_meta

        prov = self.provenance(**info)
        paths = {o.key: getattr(self.args, o.option) for o in self.row.outputs}
        for key, out in outputs.items():
            writer, rows = out if isinstance(out, tuple) else ((lambda t: lambda p: write_csv(p, t))(out), len(out))
            if paths[key]:
                write_with_meta(paths[key], writer, prov, rows=rows)


# ------------------------------------------------------------------------------------------------ stages

def cmd_qrange(args) -> None:
    from crop.certify.qrange import QRangeSettings, estimate_qrange
    from crop.io import write_json

    flags = pilot_flags(args)   # before any work: the pilot's flags checked
    st = StageRun(args)
    if st.target not in ("q", AUTO_TARGET):
        raise InputError(f"{args.checkpoint}: a policy network has no V range to estimate (its targets probs and "
                         "vote lie in [0, 1]); --target auto estimates none either, only the pilot's choice")
    settings = QRangeSettings(args.sigma, args.m, args.episodes, args.horizon,
                              _episode_seeds(args.seed, args.env, args.episodes, "qrange-episode"), seed=st.seed,
                              chunk=args.chunk, device=args.device, method=args.method, quantile=args.quantile)
    pilot = pilot_settings(args, flags, st.meta) if flags else None
    res = estimate_qrange(args.env, st.net, settings, profile=st.profile, progress=args.progress, pilot=pilot)
    if pilot is not None and "q" not in pilot.targets:   # a policy network: no V range, only the pilot
        res = {k: res[k] for k in ("states", "samples_per_state", "episodes", "returns", "target_choice")}
    write_json(args.out, {"env": args.env, "algo": args.algo, "sigma": args.sigma, **res,
                          "checkpoint_sha256": st.meta["sha256"], "provenance": st.provenance()})
    vr = f"[{res['v_min']:.6g}, {res['v_max']:.6g}] ({args.method})" if "v_min" in res else "no V range"
    choice = res.get("target_choice")
    chose = f"; target auto chose {choice['chosen']} ({predicted_text(choice)})" if choice else ""
    print(f"qrange {args.env}/{args.algo} σ={args.sigma}: {vr} from {res['states']} states × {args.m} samples"
          f"{chose}")


def cmd_loact(args) -> None:
    """LoAct (Algorithm 1, Theorem 1) in the steps of Cohen et al.'s ``certify``: load the checkpoint and its V
    range, smooth it, certify every step of clean episodes, write the tables with their provenance."""
    from crop.certify.loact import LoActSettings, run_loact
    from crop.smoothing.stats import loact_state_alpha

    st = StageRun(args)   # load: the checkpoint (verified), its smoothing target and V range
    if st.target == "action":   # a continuous-action agent: percentile smoothing per action dimension
        return _loact_continuous(st, args)
    if getattr(args, "clip_rewards", False):
        raise InputError("--clip-rewards: a discrete-action agent's benign returns are compared with LoRe's bound "
                         "and the local attack's returns, of the environment's own rewards; leave it out")
    sm = st.smoother(loact_state_alpha(args.alpha, args.alpha_mode, args.horizon))   # smooth: Q̃ of Eq. (2)
    # certify every step of clean episodes, from the initial states every algorithm and σ share
    settings = LoActSettings(args.episodes, args.horizon, _episode_seeds(args.seed, args.env, args.episodes),
                             frames_window=tuple(args.frames_window))
    frames: list = []
    steps, episodes = run_loact(args.env, sm, settings, profile=st.profile, progress=args.progress, frames=frames)
    _write_loact(st, sm, steps, episodes, frames)   # write: the tables with their provenance


def _write_loact(st: StageRun, sm, steps, episodes, frames: list) -> None:
    """LoAct's tables (steps, episodes, the certified ratio per radius, frames) with the confidence their radii
    hold at, and the run's line."""
    import numpy as np

    from crop.certify.loact import certified_ratio
    from crop.smoothing.stats import episode_confidence

    args, longest = st.args, int(episodes[cols.STEPS].max())
    st.write({"target": st.target, "v_min": st.v_min, "v_max": st.v_max, "states_certified": int(len(steps)),
              "alpha_mode": args.alpha_mode, "per_state_alpha": sm.alpha, "per_bound_alpha": sm.alpha_each,
              "confidence": {"per_state": 1 - sm.alpha, "per_episode": episode_confidence(sm.alpha, longest),
                             "rule": "union bound: the 2|A| one-sided bounds of a state each at per_bound_alpha; "
                                     f"an episode of <= {longest} states at per_state_alpha each"},
              "note": "radius is 0 at uncertified steps and counts in every mean"},
             loact=steps, loact_episodes=episodes,
             certified_ratio=certified_ratio(steps, args.sigma * np.linspace(0, 4, 81)),
             frames=(lambda p: write_frames(p, frames, args.env), len(frames)))
    _loact_line(args, f"target {st.target}", steps, episodes)


def _loact_continuous(st: StageRun, args) -> None:
    """LoAct of a continuous-action agent (:mod:`crop.certify.percentile`): one row per step and action dimension.
    Its bounds are exact binomial order statistics (no --bound to choose); its frames file (--out-frames) is
    empty, as a vector environment's."""
    import numpy as np

    from crop.certify.loact import certified_ratio
    from crop.certify.percentile import PercentileSettings, run_loact_continuous, step_ratio
    from crop.smoothing.stats import episode_confidence, loact_state_alpha

    if args.bound != schema_default("bound"):
        raise InputError(f"--bound {args.bound}: a continuous-action agent's LoAct bounds percentiles of the action "
                         "by exact binomial order statistics, not smoothed Q-values by a bound to choose; leave "
                         "--bound out")
    st.resolved["bound"] = CONTINUOUS_BOUND
    alpha_state = loact_state_alpha(args.alpha, args.alpha_mode, args.horizon)
    clip = _reward_clip(_spec_with_facts(args), args)
    st.device = "cpu"   # the percentile certificate runs on the CPU (an actor's forward is small)
    settings = PercentileSettings(args.sigma, args.m, args.episodes, args.horizon,
                                  _episode_seeds(args.seed, args.env, args.episodes), alpha_state=alpha_state,
                                  tolerance=getattr(args, "action_tolerance", None), seed=st.seed, chunk=args.chunk,
                                  reward_clip=clip)
    steps, episodes, info = run_loact_continuous(args.env, st.net, settings, profile=st.profile, progress=args.progress)
    longest = int(episodes[cols.STEPS].max())
    per_step = step_ratio(steps)
    st.write({"target": st.target, "certificate": "percentile smoothing per action dimension (Chiang et al. 2020, "
              "Theorem 1)", **info, "alpha_mode": args.alpha_mode, "per_state_alpha": alpha_state,
              "states_certified": int(len(per_step)), **_clip_record(clip),
              "confidence": {"per_state": 1 - alpha_state, "per_episode": episode_confidence(alpha_state, longest),
                             "rule": "union bound: the 2·d·G one-sided bounds of a state (two ends, d dimensions, G "
                                     "grid points) each at per_bound_alpha; an episode of <= "
                                     f"{longest} states at per_state_alpha each"},
              "note": "radius is 0 at uncertified steps and counts in every mean; certified_ratio counts a step "
                      "when every dimension is certified, at the smallest radius over the dimensions"},
             loact=steps, loact_episodes=episodes,
             certified_ratio=certified_ratio(per_step, args.sigma * np.linspace(0, 4, 81)),
             # no game frames (vector observations), as a vector environment's: the workflow's one rule
             frames=(lambda p: write_frames(p, [], args.env), 0))
    _loact_line(args, f"(percentile smoothing, {len(info['tolerance'])} action dimension(s))", per_step, episodes)


def _loact_line(args, smoothing: str, steps, episodes) -> None:
    """LoAct's line (``smoothing``: how it smoothed): the share of steps certified, mean radius, benign return."""
    print(f"LoAct {args.env}/{args.algo} σ={args.sigma} {smoothing}: {steps[cols.CERTIFIED].mean():.1%} of "
          f"{len(steps)} steps certified, mean radius {steps[cols.RADIUS].mean():.4g} (uncertified = 0), "
          f"benign return {episodes[cols.RETURN].mean():.1f} ± {episodes[cols.RETURN].std(ddof=0):.1f}")


def _spec_with_facts(args):
    """The environment's facts with the config's reward facts (--reward-range, --return-range)."""
    from crop.envs import env_spec

    rewards = {"range": getattr(args, "reward_range", None), "return_range": getattr(args, "return_range", None)}
    try:
        return env_spec(args.env, rewards)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _return_range(spec, args) -> tuple[float, float]:
    from crop.envs import MissingFactError

    try:
        return spec.return_range(args.horizon, args.gamma)
    except MissingFactError as exc:
        raise InputError(f"{exc} (crop {args.command} on its own: --reward-range LOW HIGH)") from None
    except ValueError as exc:
        raise InputError(f"--reward-range: {exc}") from None


def _lore_checks(spec, args) -> None:
    """LoRe needs the reward range (pruning only when it is >= 0) and faithful snapshots; one line, before any
    work, where either is missing."""
    from crop.envs import ENV_SPECS, snapshot_problem

    if args.env in ENV_SPECS:
        return
    _return_range(spec, args)
    problem = snapshot_problem(args.env)
    if problem:
        raise InputError(problem)


def cmd_gre(args) -> None:
    import numpy as np
    import pandas as pd

    from crop.certify.gre import GReSettings, gre_bounds, sample_randomized_returns
    from crop.certify.gre_resume import GReResume
    from crop.io import derive_seed

    spec = _spec_with_facts(args)
    j_min, j_max = _return_range(spec, args)   # before any work: GRe needs the reward range
    clip = _reward_clip(spec, args)
    batch = spec.gre_block(args.m, args.batch)
    st = StageRun(args, batch=batch)
    settings = GReSettings(args.sigma, args.m, args.horizon, args.gamma, seed=st.seed,
                           env_seed=derive_seed(args.seed, args.env, "gre-initial-states") % 2**31, chunk=args.chunk,
                           device=args.device, workers=args.workers or args.threads, batch=batch, reward_clip=clip)
    resume = Path(args.out).with_name(Path(args.out).name + ".resume")
    returns = sample_randomized_returns(args.env, st.net, settings, profile=st.profile, progress=args.progress,
                                        resume=GReResume(resume, (j_min, j_max)))
    if returns.min() < j_min - 1e-9 or returns.max() > j_max + 1e-9:   # the declared facts are false: no bound
        raise InputError(f"{args.env}: randomized returns in [{returns.min():g}, {returns.max():g}] leave [J_min, "
                         f"J_max] = [{j_min:g}, {j_max:g}] of the declared reward range; give the true one "
                         f"(rewards.range{', rewards.return_range' if spec.game_return_range else ''})")
    table = gre_bounds(returns, sigma=args.sigma, horizon=args.horizon, alpha=args.alpha, j_min=j_min, j_max=j_max,
                       eps_grid=[f * args.sigma for f in args.eps_factors], percentiles=args.percentiles)
    st.write({"j_min": j_min, "j_max": j_max, **_clip_record(clip),
              "note": "each bound (expectation_bound, cdf_expectation_bound, percentile_bound) holds with "
                      "probability >= 1 - alpha; empty percentile_bound = no k qualifies"},
             gre=table, gre_returns=pd.DataFrame({cols.RETURN: returns}))
    resume.unlink(missing_ok=True)  # only now: a kill before gre.csv and its meta are written resumes from it
    print(f"GRe {args.env}/{args.algo} σ={args.sigma}: {args.m} randomized returns, mean {returns.mean():.2f}, "
          f"median {np.median(returns):.1f}")


def _reward_clip(spec, args) -> tuple[float, float] | None:
    """The per-step reward range every reward is clipped to (``--clip-rewards``, config ``rewards.clip``), or
    None; one line, before any work, where the range is not declared."""
    if not getattr(args, "clip_rewards", False):
        return None
    if spec.reward_range is None:
        raise InputError(f"--clip-rewards clips to the declared reward range, and {args.env} has none: give "
                         "--reward-range LOW HIGH (config: rewards.range)")
    if getattr(args, "return_range", None) is not None:
        raise InputError("--return-range bounds the game's own return, not the return of clipped rewards "
                         "(--clip-rewards); leave one of them out")
    return (float(spec.reward_range[0]), float(spec.reward_range[1]))


def _clip_record(clip) -> dict:
    """What an output's metadata says of clipped rewards: the range, and that its returns are the clipped ones."""
    if clip is None:
        return {}
    return {"reward_clip": list(clip),
            "reward_clip_note": f"every step's reward was clipped to [{clip[0]:g}, {clip[1]:g}] before it entered a "
                                "return: returns and bounds are of the clipped rewards, not the environment's own"}


def cmd_lore(args) -> None:
    from crop.certify.lore import CHECKPOINT_EVERY, LoReSettings, Problem, Resume, Search, run_lore
    from crop.io import sha256_file
    from crop.smoothing.stats import lore_schedule_text, lore_state_alpha

    spec = _spec_with_facts(args)
    _lore_checks(spec, args)
    if args.report_double and args.max_nodes is None:
        raise InputError("--report-double (lore.report_double) reports the bound at twice the node budget: it "
                         "needs --max-nodes (lore.max_nodes)")
    every = CHECKPOINT_EVERY if args.checkpoint_every is None else args.checkpoint_every
    st = StageRun(args, checkpoint_every=every)
    sm = st.smoother(args.alpha)
    resume = Path(args.out).with_name(Path(args.out).name + ".resume")
    # Appendix E: negative rewards count as 0 in LoRe (named in the output); pruning needs rewards ≥ 0.
    reward_fn = spec.lore_reward_fn()
    alpha_of = None if args.alpha_mode == "state" else (lambda i: lore_state_alpha(args.alpha, "family", i))
    # A bounded search counts an open subtree at its worst case, from the lowest reward as the search counts it
    # (the modification max(r, 0) is monotone: it maps the range's low end to the new one).  Nothing tighter is
    # sound here: the game's score range (rewards.return_range) bounds a whole game's score, not the counted
    # return of a prefix, and with max(r, 0) (Pong, Freeway) r_min = 0 already makes w(n) the return so far.
    reward_min = None
    if args.max_nodes is not None:
        _return_range(spec, args)  # one line where the reward range is missing
        reward_min = spec.reward_range[0] if reward_fn is None else reward_fn(spec.reward_range[0])
    settings = LoReSettings(
        Problem(args.horizon, _episode_seeds(args.seed, args.env, 1)[0], args.gamma, reward_fn, spec.lore_reward),
        Search(math.inf if args.eps_max_factor is None else args.eps_max_factor * args.sigma,
               prune=spec.nonnegative_rewards or reward_fn is not None, alpha_of=alpha_of,
               max_nodes=args.max_nodes, reward_min=reward_min, order=args.order,
               report_double=args.report_double),
        run_key={"checkpoint_sha256": sha256_file(args.checkpoint)})
    result = run_lore(args.env, sm, settings, profile=st.profile, progress=args.progress,
                      resume=Resume(resume, every, remove=False))
    table, info, states = result.table, result.info, result.states
    info["reward_modification"] = spec.lore_reward
    # nodes and truncated also at the top: a truncated bound is marked in the figures and tables
    st.write({"nodes": info["nodes"], "truncated": info["truncated"], "exact_below_eps": info["exact_below_eps"],
              "explored": info["explored"],
              "target": st.target, "v_min": st.v_min, "v_max": st.v_max, "search": info, "alpha_mode": args.alpha_mode,
              "per_state_alpha_schedule": lore_schedule_text(args.alpha, args.alpha_mode),
              "confidence": {"per_state_lowest": 1 - (info["per_state_alpha_first"] or args.alpha),
                             "tree": info["confidence_union"],
                             "rule": "union bound over the distinct states smoothed (search.alpha_spent = sum of "
                                     "their per-state alphas; each state's 2|A| bounds at alpha_i/(2|A|))"},
              "initial_state": "the initial state of LoAct episode 0"}, lore=table, lore_states=states)
    resume.unlink(missing_ok=True)  # only now: a kill before lore.csv and its meta are written resumes from it
    print(f"LoRe {args.env}/{args.algo} σ={args.sigma}: {len(table)} critical radii, "
          f"{info['nodes']} nodes{' (budget spent: truncated)' if info['truncated'] else ''}, "
          f"{info['distinct_states_smoothed']} states smoothed, {info['nodes_per_s']} nodes/s, "
          f"bound at ε=0: {table[cols.LOWER_BOUND].iloc[0]}{_lore_budget_text(info)}")


def _lore_budget_text(info: dict) -> str:
    """What a bounded search adds to LoRe's line: its order, how much of the tree it explored, and the bound at
    twice the budget where it was asked for."""
    if info["max_nodes"] is None:
        return ""
    out = f" ({info['order']}; explored {info['explored_nodes']} of {info['known_nodes']} nodes known"
    if info["explored_at_eps"] is not None:
        out += f" at ε={info['explored_at_eps']:g}"
    double = info["double_budget"]
    if double is not None:
        out += f"; at {double['max_nodes']} nodes: {double['lower_bound_at_smallest_eps']}"
    return out + ")"


def cmd_attack_local(args) -> None:
    import pandas as pd

    from crop.certify.attack import LocalAttackSettings, run_local_attack
    from crop.envs import env_spec
    from crop.smoothing.stats import episode_confidence, loact_state_alpha

    st, spec = StageRun(args), env_spec(args.env)
    sm = st.smoother(loact_state_alpha(args.alpha, args.alpha_mode, args.horizon))
    # Returns over LoRe's horizon with LoRe's reward modification, so the two compare like for like.
    steps: list = []
    settings = LocalAttackSettings([f * args.sigma for f in args.eps_factors],
                                   _episode_seeds(args.seed, args.env, args.episodes), args.horizon,
                                   steps=args.pgd_steps, m_grad=args.m_grad, seed=_stage_seed(args, "attack-local-pgd"),
                                   gamma=args.gamma, reward_fn=spec.lore_reward_fn())
    table = run_local_attack(args.env, sm, settings, profile=st.profile, progress=args.progress, steps_out=steps)
    table[cols.SAME_START_AS_LORE] = table[cols.EPISODE] == 0
    st.write({"reward_modification": spec.lore_reward, "alpha_mode": args.alpha_mode, "per_state_alpha": sm.alpha,
              "confidence": {"per_state": 1 - sm.alpha,
                             "per_episode": episode_confidence(sm.alpha, args.horizon)}},
             attack_local=table, attack_local_steps=pd.DataFrame(steps))
    print(f"local PGD {args.env}/{args.algo} σ={args.sigma}: min return per ε "
          f"{_per_eps(table.groupby(cols.EPS)[cols.RETURN].min())}")


def cmd_attack_global(args) -> None:
    from crop.certify.attack import GlobalAttackSettings, run_global_attack

    clip = _reward_clip(_spec_with_facts(args), args) if getattr(args, "clip_rewards", False) else None
    st = StageRun(args)
    grid = [f * args.sigma for f in args.eps_factors]
    settings = GlobalAttackSettings(
        args.sigma, grid, global_attack_seeds(args.seed, args.env, args.algo, args.sigma, grid, args.episodes),
        args.horizon, steps=args.pgd_steps, n_eot=args.n_eot, gamma=args.gamma, seed=st.seed, device=args.device,
        reward_fn=None if clip is None else (lambda r: min(max(float(r), clip[0]), clip[1])))
    table = run_global_attack(args.env, st.net, settings, profile=st.profile, progress=args.progress)
    st.write(_clip_record(clip), attack_global=table)
    print(f"global PGD {args.env}/{args.algo} σ={args.sigma}: median return per ε "
          f"{_per_eps(table.groupby(cols.EPS)[cols.RETURN].median())}")


def _per_eps(values) -> str:
    """``{ε: value}`` for a log line, without binary noise (0.005, not 0.005000000000000001)."""
    return "{" + ", ".join(f"{e:.6g}: {v:.4g}" for e, v in values.items()) + "}"
