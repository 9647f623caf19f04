"""The reward clip each return stage of a run ran with (config ``rewards.clip``, recorded as ``reward_clip`` in
its metadata), and its words: a bound and a return are comparable only when they are of the same rewards.  Read
by the integrity check (a replicate pooled with its run must share its clip) and by every report that sets
returns side by side."""
from __future__ import annotations

from pathlib import Path

from crop.io import meta_path, read_json
from crop.workflow.layout import RUN_FILES

__all__ = ["RETURN_STAGES", "reward_clips", "clip_text"]

#: The stages whose outputs are returns: their metadata record the reward clip they ran with (``reward_clip``,
#: crop.handlers.stages._clip_record), absent where the rewards are the environment's own.
RETURN_STAGES = ("loact", "gre", "attack_global")


def reward_clips(run_dir: Path) -> dict[str, tuple[float, float] | None]:
    """``{stage: (low, high) or None}``: the per-step reward clip each of :data:`RETURN_STAGES` that the run
    folder holds ran with (None: the environment's own rewards)."""
    out = {}
    for key in RETURN_STAGES:
        meta = meta_path(Path(run_dir) / RUN_FILES[key])
        if meta.is_file():
            clip = read_json(meta).get("reward_clip")
            out[key] = None if clip is None else (float(clip[0]), float(clip[1]))
    return out


def clip_text(clips) -> str:
    """"rewards clipped to [a, b]" for the clip ranges ``clips`` (several joined by "or"); "" for none."""
    ranges = sorted({tuple(c) for c in clips if c})
    return ("rewards clipped to " + " or ".join(f"[{a:g}, {b:g}]" for a, b in ranges)) if ranges else ""
