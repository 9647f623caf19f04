"""The settings the report's captions (report/*.rst) quote, as text: what a reader of a figure needs to know of
the protocol that drew it."""
from __future__ import annotations

from crop.names import ACTION_TARGET, AUTO_TARGET, smoothing_targets
from crop.workflow.config import sigma_label
from crop.workflow.layout import run_stages
from crop.workflow.stage_table import caption, stage_settings

__all__ = ["caption_settings", "audit_settings", "Words"]


class Words(dict):
    """A mapping the captions read by key (``snakemake.params.audit.alpha``) that Snakemake's report shows in
    words: it prints a job's params as ``name={value}``, which for a plain dict is its Python repr.  The repr
    stays the dict's, so Snakemake's record of the params (and its rerun triggers) is unchanged."""

    def __init__(self, data: dict, text: str):
        super().__init__(data)
        self.text = text

    def __str__(self) -> str:
        return self.text


def audit_settings(audit: dict) -> Words:
    """A validated config's ``audit`` block, for the captions and in words."""
    ref = audit.get("reference")
    reference = "the paper's published numbers" if ref == "paper" else (ref or "none")
    text = (f"α = {audit['alpha']:g}; reference: {reference}; tolerances: {audit.get('tolerances') or 'built-in'}; "
            f"strict: {'yes' if audit.get('strict') else 'no'}")
    return Words(audit, text)


def caption_settings(cfg: dict) -> Words:
    """Per environment of a validated config, the settings the captions quote (as text): each stage's caption
    (its row of the stage table) with the settings the stage runs with; the two attacks in one; ``clip``, what
    the captions of the figures of returns (benign return, GRe and the global attack, all bounds) add where the
    rewards are clipped (``rewards.clip``; absent otherwise, as ``no_lore`` where LoRe runs)."""
    def quoted(env, command):
        return caption(command, stage_settings(cfg, env, command))

    out = {}
    for env, ec in cfg["environments"].items():
        rewards = ec.get("rewards") or {}
        out[env] = {
            "algorithms": ", ".join(ec["algorithms"]),
            "sigmas": ", ".join(sigma_label(x) for x in ec["sigmas"]),
            **{name: quoted(env, name) for name in ("loact", "gre", "lore")},
            "attack": f"{quoted(env, 'attack-global')}; {quoted(env, 'attack-local')}",
        }
        if rewards.get("clip"):   # LoAct's benign returns, GRe's bounds and the global attack's returns: clipped
            # quoted only by the captions of figures that show returns (radii never depend on the rewards)
            out[env]["clip"] = (f"returns and bounds of rewards clipped to [{rewards['range'][0]:g}, "
                                f"{rewards['range'][1]:g}] (rewards.clip), not the environment's own")
        ran = {name for t in smoothing_targets(ec) for name in run_stages(t, ec.get("skip", ()))}
        if "lore" not in ran:   # crop.workflow.layout.has_lore: no adasearch figures, no J̲ row
            out[env]["no_lore"] = (("continuous actions (a Box): no LoRe or local attack, whose tree branches over "
                                    "a finite set of actions" if ec.get("target") == ACTION_TARGET else
                                    "LoRe not run (the config's skip: lore)") + ", so no adasearch figure and no J̲ row")
            out[env]["lore"] = "not run"   # the settings of stages that never ran are not quoted
        if "attack-local" not in ran:
            out[env]["attack"] = quoted(env, "attack-global")
        if AUTO_TARGET in smoothing_targets(ec):
            out[env]["auto"] = ("target auto: each run's smoothing target chosen before certification by a pilot on "
                                "the qrange stage's own states and noise, labelled \"ALGO (auto: TARGET)\"")
    text = "; ".join(f"{env}: {v['algorithms']} at σ ∈ {{{v['sigmas']}}}; LoAct {v['loact']}; GRe {v['gre']}; "
                     + ("" if v.get("no_lore") else f"LoRe {v['lore']}; ")
                     + f"attacks {v['attack']}" + (f"; {v['clip']}" if v.get("clip") else "")
                     + (f"; {v['auto']}" if v.get("auto") else "") for env, v in out.items())
    return Words(out, text)
