"""The settings the report's captions (report/*.rst) quote, as text: what a reader of a figure needs to know of
the protocol that drew it."""
from __future__ import annotations

from crop.config import sigma_label

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
    """Per environment of a validated config, the settings the captions quote (as text)."""

    def eps(xs):
        return ", ".join(f"{x:g}" for x in xs)

    out = {}
    for env, ec in cfg["environments"].items():
        lo, gr, lr, at = ec["loact"], ec["gre"], ec["lore"], ec["attack"]
        out[env] = {
            "algorithms": ", ".join(ec["algorithms"]),
            "sigmas": ", ".join(sigma_label(x) for x in ec["sigmas"]),
            "loact": (
                f"m = {lo['m']} noise samples per state, {lo['episodes']} clean episodes of at most "
                f"{lo['horizon']} steps"
            ),
            "gre": (
                f"m = {gr['m']} randomized trajectories of H = {gr['horizon']} steps, γ = {gr['gamma']}, "
                f"ε/σ ∈ {{{eps(gr['eps_factors'])}}}"
            ),
            "lore": f"m = {lr['m']} noise samples per state, horizon H = {lr['horizon']}, γ = {lr['gamma']}",
            "attack": (
                f"{at['pgd_steps']}-step ℓ2 PGD; global: {at['global_episodes']} episodes, ε/σ ∈ "
                f"{{{eps(at['global_eps_factors'])}}}; local (from LoRe's initial state and others): "
                f"{at['local_episodes']} episodes, ε/σ ∈ {{{eps(at['local_eps_factors'])}}}"
            ),
        }
    text = "; ".join(f"{env}: {v['algorithms']} at σ ∈ {{{v['sigmas']}}}; LoAct {v['loact']}; GRe {v['gre']}; "
                     f"LoRe {v['lore']}; attacks {v['attack']}" for env, v in out.items())
    return Words(out, text)
