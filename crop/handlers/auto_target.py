"""``target: auto`` in the stages (docs/statistics.md, "target: auto"): the qrange stage's pilot flags, and a
certification stage's reading of the target the pilot chose (:mod:`crop.certify.pilot`)."""
from __future__ import annotations

from crop.io import InputError
from crop.names import AUTO_TARGET

__all__ = ["resolve_auto", "pilot_flags", "pilot_settings", "predicted_text"]


def resolve_auto(args, meta: dict, seed: int) -> tuple[str, dict]:
    """``--target auto`` of a certification stage: (the target the qrange stage's pilot chose, its record),
    read from ``--qrange``'s ``target_choice`` (:mod:`crop.certify.pilot`), verified to be for this
    env/algo/σ and checkpoint, a target this network supports, and drawn from a noise stream other than this
    stage's (``seed``).  Bad input: one line naming the field, before any work."""
    from crop.certify.pilot import CANDIDATES
    from crop.certify.qrange import check_qrange_run
    from crop.io import read_json

    if not getattr(args, "qrange", None):
        raise InputError("--target auto needs --qrange (qrange.json of the same env/algo/sigma, with the pilot's "
                         "target_choice)")
    q = read_json(args.qrange)
    check_qrange_run(args.qrange, q, args.env, args.algo, args.sigma)
    if q.get("checkpoint_sha256") != meta.get("sha256"):
        raise InputError(f"{args.qrange}: checkpoint_sha256 is not {args.checkpoint}'s: the pilot ran on another "
                         "network")
    choice = q.get("target_choice")
    if not isinstance(choice, dict):
        raise InputError(f"{args.qrange}: no target_choice (run crop qrange with --target auto)")
    supported = CANDIDATES.get(meta.get("network", "q"), ())
    if choice.get("chosen") not in supported:
        raise InputError(f"{args.qrange}: target_choice.chosen {choice.get('chosen')!r} is not a target of this "
                         f"network (supported: {', '.join(supported)})")
    if choice.get("pilot_seed") == seed:
        raise InputError(f"{args.qrange}: target_choice.pilot_seed is this stage's own noise seed: the target must "
                         "not be chosen on the certification's noise")
    return choice["chosen"], choice


#: The qrange stage's flags of ``--target auto`` (the stage table's pilot flags), given only for it.
_PILOT_OPTIONS = ("loact_m", "loact_horizon", "alpha", "alpha_mode", "bound")


def pilot_flags(args) -> dict | None:
    """The pilot flags of ``crop qrange --target auto`` (checked: all given), or None for a run of a fixed
    target, which may give none of them; its recorded settings then carry no pilot flag (its qrange.json is
    the same as before the pilot existed)."""
    given = {k: getattr(args, k, None) for k in _PILOT_OPTIONS}
    if getattr(args, "target", None) != AUTO_TARGET:
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise InputError(f"--{extra[0].replace('_', '-')}: a flag of the pilot of --target auto only")
        for k in (*_PILOT_OPTIONS, "target"):
            if hasattr(args, k):
                delattr(args, k)
        return None
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise InputError(f"--target auto needs --{missing[0].replace('_', '-')} (LoAct's, whose radius the pilot "
                         "predicts)")
    return given


def pilot_settings(args, flags: dict, meta: dict):
    """The pilot (:class:`crop.certify.pilot.PilotSettings`) of a qrange stage's checkpoint (``meta``): its
    network's candidates, LoAct's m and per-state α (:func:`crop.smoothing.stats.loact_state_alpha`), the bound."""
    from crop.certify.pilot import CANDIDATES, PilotSettings
    from crop.smoothing.stats import loact_state_alpha

    alpha_state = loact_state_alpha(flags["alpha"], flags["alpha_mode"], flags["loact_horizon"])
    return PilotSettings(args.sigma, args.m, CANDIDATES[meta.get("network", "q")], flags["loact_m"], alpha_state,
                         flags["bound"], chunk=args.chunk)


def predicted_text(choice: dict) -> str:
    return ", ".join(f"{t}: mean predicted radius {v['mean_predicted_radius']:.4g}"
                     for t, v in choice["predicted"].items())
