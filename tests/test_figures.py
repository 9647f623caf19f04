"""What a reviewer checks in the figures and tables, as code can see it: math-text labels, one colour and
marker per algorithm in every figure, dashed attack lines above the bounds with an honest legend, sensible
y-limits for flat series, horizontal non-overlapping ticks, GRe curves over the whole x range, Markdown
tables without ``nan`` or raw keys, and both averaging conventions of the mean radius on planted data."""
import math
import re

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from crop.certify.gre import gre_bounds
from crop.io import meta_name
from crop.report import aggregate as agg
from crop.report import figures, style, tables
from crop.report.metrics import load_runs, mean_radius, metric_value, per_step_mean_radius
from crop.workflow import layout
from crop.workflow.config import ALGORITHMS
from crop.workflow.layout import RUN_FILES

from synthetic_results import make_results, rewrite_csv, runs_of

CART = "CartPole-v0"
matplotlib.rcParams["figure.max_open_warning"] = 0  # the fixture keeps every figure of a run open


def _close_all(figs):
    for f in figs.values():
        matplotlib.pyplot.close(f)


def _all_figures(data, env):
    return dict(figures.iter_env_figures(env, data))


@pytest.fixture(scope="module")
def nine(tmp_path_factory):
    """CartPole with all nine algorithms at one σ (the colour and style checks) and Freeway with two."""
    root = tmp_path_factory.mktemp("nine")
    plan = {CART: {a: [0.1] for a in ALGORITHMS}, "FreewayNoFrameskip-v4": {"StdTrain": [0.5], "CARRL": [0.5]}}
    runs = make_results(root, plan)
    data = load_runs(root, runs_of(runs))
    figs = {**_all_figures(data, CART), **_all_figures(data, "FreewayNoFrameskip-v4")}
    yield root, runs, data, figs
    _close_all(figs)


def _legend_texts(fig) -> list[str]:
    """The entries of every legend of ``fig`` (the figure's and its axes')."""
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for lg in legends for t in lg.get_texts()]


def _text_outside_math(label: str) -> str:
    return re.sub(r"\$[^$]*\$", "", label)


@pytest.mark.slow
def test_axis_labels_are_math_text(nine):
    *_, figs = nine
    seen = set()
    for stem, fig in figs.items():
        for ax in fig.axes:
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                assert "_" not in _text_outside_math(label), (stem, label)  # no literal J_E, η_r, …
                assert label.count("$") % 2 == 0, (stem, label)
                seen.add(label.split("\n")[-1])
    assert style.LABELS["J_E"] in seen and r"$\underline{J}_{\mathrm{E}}$" in style.LABELS["J_E"]
    assert style.LABELS["J_p"] in seen and r"$\underline{J}_p$" in style.LABELS["J_p"]
    assert style.LABELS["J"] in seen and r"$\underline{J}$" in style.LABELS["J"]
    assert style.LABELS["eta"] in seen and r"$\eta_r$" in style.LABELS["eta"]
    assert style.LABELS["eps"] in seen and style.LABELS["r"] in seen
    # the bar under J (J̲): Computer Modern, whose J does not descend, so the bar sits under J, not under the
    # subscript as DejaVu's descending italic J puts it
    for stem, fig in figs.items():
        for ax in fig.axes:
            label = ax.yaxis.label
            if r"\underline" in label.get_text():
                assert label.get_math_fontfamily() == "cm", (stem, label.get_text())


@pytest.mark.slow
def test_one_colour_and_marker_per_algorithm_all_distinct(nine):
    *_, figs = nine
    assert list(style.ALGO_COLORS) == ALGORITHMS
    assert len({to_hex(c) for c in style.ALGO_COLORS.values()}) == 9
    assert len(set(style.ALGO_MARKERS.values())) == 9
    drawn = {}
    for stem, fig in figs.items():
        for ax in fig.axes:
            for line in ax.get_lines():
                gid = line.get_gid() or ""
                if ":" in gid:
                    algo = gid.split(":", 1)[1]
                    assert to_hex(line.get_color()) == style.ALGO_COLORS[algo], (stem, gid)
                    if gid.startswith("bound:"):
                        assert line.get_marker() == style.ALGO_MARKERS[algo], (stem, gid)
                    drawn.setdefault(algo, set()).add(stem.split("_")[0])
        for lg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
            for h, t in zip(lg.legend_handles, lg.get_texts()):
                for a in ALGORITHMS:
                    if t.get_text() == style.algo_label(a):
                        assert to_hex(h.get_color()) == style.ALGO_COLORS[a] and h.get_marker() == style.ALGO_MARKERS[a]
    assert set(drawn) == set(ALGORITHMS)
    assert drawn["StdTrain"] == drawn["CARRL"] == {"CartPole", "Freeway"}  # the same colour in both envs


# Machado, Oliveira & Fernandes (2009) simulation matrices (severity 1.0, linear RGB) of the three dichromacies.
_CVD = {"protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                       [-0.003882, -0.048116, 1.051998]],
        "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                         [-0.011820, 0.042940, 0.968881]],
        "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                       [0.004733, 0.691367, 0.303900]]}


def _lab(hex_colour, matrix=None):
    """CIELAB (D65) of an sRGB colour, as seen through a dichromacy simulation ``matrix``."""
    c = np.asarray(matplotlib.colors.to_rgb(hex_colour))
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    if matrix is not None:
        lin = np.clip(np.asarray(matrix) @ lin, 0.0, 1.0)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > 0.008856, np.cbrt(t), 7.787 * t + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_colours_stay_distinct_under_colour_vision_deficiencies():
    """Every pair of the nine colours differs by ΔE*ab ≥ 15 for normal vision and under simulated protanopia,
    deuteranopia and tritanopia (seaborn's "colorblind" palette, used before, falls to 10.8)."""
    for name, matrix in [("normal", None), *_CVD.items()]:
        lab = {a: _lab(c, matrix) for a, c in style.ALGO_COLORS.items()}
        worst = min((float(np.linalg.norm(lab[a] - lab[b])), a, b) for i, a in enumerate(ALGORITHMS)
                    for b in ALGORITHMS[i + 1:])
        assert worst[0] >= 15.0, (name, worst)
    # StdTrain (the baseline, drawn first) is the darkest colour: no later pale line can hide it.
    assert _lab(style.ALGO_COLORS["StdTrain"])[0] == min(_lab(c)[0] for c in style.ALGO_COLORS.values())


@pytest.mark.slow
def test_attack_lines_dashed_above_the_bounds_and_in_the_legend(nine):
    *_, figs = nine
    checked = 0
    for stem, fig in figs.items():
        if not any(k in stem for k in ("global_mean", "global_median", "adasearch", "all_bounds")):
            continue
        for ax in fig.axes:
            bounds = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("bound:")]
            attacks = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("attack:")]
            assert bounds and attacks, stem
            assert {b.get_gid()[6:] for b in bounds} == {a.get_gid()[7:] for a in attacks}
            for a in attacks:
                assert a.get_linestyle() == "--" and a.get_marker() in ("None", None, "", " "), stem
                assert a.get_zorder() > max(b.get_zorder() for b in bounds), stem
                assert a.get_path_effects(), stem  # a white edge keeps the dashes visible over a solid line
            assert all(b.get_linestyle() == "-" for b in bounds)
            checked += 1
        legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        styles = {t.get_text(): h.get_linestyle() for lg in legends for h, t in zip(lg.legend_handles, lg.get_texts())}
        dashed = [t for t, ls in styles.items() if ls == "--"]
        assert dashed and all("PGD" in t for t in dashed), (stem, styles)  # the key shows a dashed sample
        assert any(ls == "-" and "certified" in t for t, ls in styles.items()), stem
    assert checked >= 9
    legend = [t.get_text() for t in figs["Cartpole_legend"].legends[0].get_texts()]
    assert "PGD attack (dashed)" in legend and len(legend) == 11


def _flat_results(root):
    """CartPole, two algorithms: benign returns all 40, LoRe bound and local attack flat at 6, and one
    algorithm that certifies no step (radius 0 everywhere)."""
    runs = make_results(root, {CART: {"StdTrain": [0.1], "CARRL": [0.1]}})
    for (_, algo, _), d in runs.items():
        ep = pd.read_csv(d / RUN_FILES["loact_episodes"])
        ep["return"] = 40.0
        rewrite_csv(d / RUN_FILES["loact_episodes"], ep)
        rewrite_csv(d / RUN_FILES["lore"], pd.DataFrame({"eps": [0.0], "lower_bound": [6.0]}))
        al = pd.read_csv(d / RUN_FILES["attack_local"])
        al["return"] = 6.0
        rewrite_csv(d / RUN_FILES["attack_local"], al)
        if algo == "CARRL":
            st = pd.read_csv(d / RUN_FILES["loact"])
            st["radius"], st["certified"] = 0.0, False
            rewrite_csv(d / RUN_FILES["loact"], st)
    return runs


@pytest.mark.slow
def test_flat_series_get_sensible_y_limits(tmp_path):
    runs = _flat_results(tmp_path)
    data = load_runs(tmp_path, runs_of(runs))
    figs = _all_figures(data, CART)
    try:
        lo, hi = figs["Cartpole_loact_clean"].axes[0].get_ylim()
        assert lo < 40 < hi and hi - lo >= 0.1 * 40  # not 40 ± a tiny band
        for stem in ("CartPole_adasearch_sigma-0.1", "CartPole_all_bounds"):
            ax = figs[stem].axes[-1]
            lo, hi = ax.get_ylim()
            assert lo < 6 < hi and hi - lo >= 1.0, stem
        only_carrl = {k: v for k, v in data.items() if k[1] == "CARRL"}
        fig = dict(figures.iter_env_figures(CART, only_carrl))["CartPole_stepwise_sigma-0.1"]
        lo, hi = fig.axes[0].get_ylim()
        assert lo < 0 < hi and hi >= 0.05 * 0.1  # radius 0 everywhere: an axis on the scale of σ
        assert any("no step certified" in t.get_text() for t in fig.axes[0].texts)
    finally:
        _close_all(figs)


@pytest.mark.slow
def test_sigma_ticks_are_horizontal_and_do_not_overlap(tmp_path):
    sigmas = [0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1]
    runs = make_results(tmp_path, {CART: {"StdTrain": sigmas}})
    data = load_runs(tmp_path, runs_of(runs))
    fig = next(f for s, f in figures.iter_env_figures(CART, data) if s == "Cartpole_loact_clean" or
               matplotlib.pyplot.close(f))
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        shown = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert len(shown) >= 3 and all(t.get_rotation() == 0 for t in ax.get_xticklabels())
        boxes = sorted((t.get_window_extent(r) for t in shown), key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))
        assert [t.get_text() for t in shown][0] == "0.001" and "0.1" in [t.get_text() for t in shown]
    finally:
        matplotlib.pyplot.close(fig)


@pytest.mark.slow
def test_gre_curves_span_the_attack_range(tmp_path):
    """GRe computed up to 0.05σ, the global attack up to 0.4σ: the bound is drawn to 0.4σ, equal to the
    certifier's own formulas (crop.certify.gre.gre_bounds) on the whole grid, and the vacuous median as J_min."""
    sigma = 0.1
    runs = make_results(tmp_path, {CART: {"StdTrain": [sigma]}})
    d = runs[(CART, "StdTrain", repr(sigma))]
    returns = pd.read_csv(d / RUN_FILES["gre_returns"])["return"].to_numpy()[:200]  # too few to certify far out
    rewrite_csv(d / RUN_FILES["gre_returns"], pd.DataFrame({"return": returns}))
    j_min, j_max = 0.0, 40.0
    kw = dict(sigma=sigma, horizon=30, alpha=0.05, percentiles=[0.5], j_min=j_min, j_max=j_max)
    rewrite_csv(d / RUN_FILES["gre"], gre_bounds(returns, eps_grid=[0.0, 0.002, 0.005], **kw))
    ag = pd.read_csv(d / RUN_FILES["attack_global"])
    ag["eps"] = ag["eps"] * 2.0  # the attack's grid now reaches 0.4σ
    rewrite_csv(d / RUN_FILES["attack_global"], ag)
    data = load_runs(tmp_path, runs_of(runs))
    run = data[(CART, "StdTrain", repr(sigma))]
    for kind, col in (("mean", "expectation_bound"), ("median", "percentile_bound")):
        eps, y, n = figures.gre_curve(run, kind, 0.04)
        assert n == 3 and eps[-1] == pytest.approx(0.04) and np.all(np.diff(eps) > 0)
        ref = gre_bounds(returns, eps_grid=eps, **kw)[col].to_numpy()
        if kind == "median":
            assert np.isnan(ref).any()  # far out no order statistic certifies the median …
            ref = np.where(np.isnan(ref), j_min, ref)  # … and the figure shows the trivial bound J_min
        np.testing.assert_allclose(y, ref, rtol=1e-9)  # gre.csv stores 10 significant digits
    figs = _all_figures(data, CART)
    try:
        for stem in ("CartPole_global_mean_sigma-0.1", "CartPole_global_median_sigma-0.1"):
            ax = figs[stem].axes[0]
            bound = next(ln for ln in ax.get_lines() if ln.get_gid() == "bound:StdTrain")
            attack = next(ln for ln in ax.get_lines() if ln.get_gid() == "attack:StdTrain")
            assert max(bound.get_xdata()) == pytest.approx(max(attack.get_xdata())) == pytest.approx(0.04)
            assert ax.get_xlim()[1] >= 0.04
    finally:
        _close_all(figs)


# ------------------------------------------------------------------------------- both averaging conventions

def _planted_steps():
    """Episode 0: radii 0.2, (uncertified), 0.4; episode 1: (uncertified), 0.6 — and it ends a step earlier.
    An uncertified step's stored radius is junk (0.9) on purpose: it must count as 0 or not at all."""
    return pd.DataFrame({"episode": [0, 0, 0, 1, 1], "step": [0, 1, 2, 0, 1],
                         "certified": [True, False, True, False, True], "radius": [0.2, 0.9, 0.4, 0.9, 0.6]})


def test_mean_radius_conventions_on_planted_steps():
    st = _planted_steps()
    assert mean_radius(st, "uncertified_zero") == pytest.approx((0.2 + 0 + 0.4 + 0 + 0.6) / 5)
    assert mean_radius(st, "certified_only") == pytest.approx((0.2 + 0.4 + 0.6) / 3)
    none = st.assign(certified=False)
    assert mean_radius(none, "uncertified_zero") == 0.0 and math.isnan(mean_radius(none, "certified_only"))
    with pytest.raises(ValueError, match="unknown averaging convention"):
        mean_radius(st, "skip")
    # certified_only is the mean over steps of the per-step curve (0 where no episode is certified), not the
    # pooled mean over certified steps: step 0 (0.2 + 0.4) / 2, step 1 0.9, step 2 none certified -> 0
    two = pd.DataFrame({"episode": [0, 1, 0, 0], "step": [0, 0, 1, 2], "certified": [True, True, True, False],
                        "radius": [0.2, 0.4, 0.9, 0.5]})
    assert mean_radius(two, "certified_only") == pytest.approx((0.3 + 0.9 + 0.0) / 3)


def test_per_step_mean_over_the_episodes_still_running():
    st = _planted_steps()
    z = per_step_mean_radius(st, "uncertified_zero")
    c = per_step_mean_radius(st, "certified_only")
    assert list(z.index) == [0, 1, 2] and list(z["running"]) == [2, 2, 1]
    # Step 2: only episode 0 still runs, so the mean is its 0.4 (not 0.4 / 2 with the ended episode as 0).
    np.testing.assert_allclose(z["mean"], [0.1, 0.3, 0.4])
    np.testing.assert_allclose(z["std"], [0.1, 0.3, 0.0])
    np.testing.assert_allclose(c["mean"], [0.2, 0.6, 0.4])
    assert list(c["averaged"]) == [1, 1, 1] and list(z["averaged"]) == [2, 2, 1]


@pytest.mark.slow
def test_tables_give_both_conventions(tmp_path):
    runs = make_results(tmp_path, {CART: {"StdTrain": [0.1], "CARRL": [0.1]}})
    std = runs[(CART, "StdTrain", "0.1")]
    base = pd.read_csv(std / RUN_FILES["loact"]).iloc[:0]
    planted = _planted_steps()
    rewrite_csv(std / RUN_FILES["loact"], pd.concat([base, planted], ignore_index=True)
                .assign(action=0, reward=1.0, smoothed_top=1.0, smoothed_runner_up=0.5, smoothed_top_lower=0.9,
                        smoothed_others_upper_max=0.6))
    carrl = runs[(CART, "CARRL", "0.1")]
    st = pd.read_csv(carrl / RUN_FILES["loact"])
    rewrite_csv(carrl / RUN_FILES["loact"], st.assign(certified=False, radius=0.0))
    data = load_runs(tmp_path, runs_of(runs))
    assert metric_value(data[(CART, "StdTrain", "0.1")], "mean_radius") == pytest.approx(0.24)
    assert metric_value(data[(CART, "StdTrain", "0.1")], "mean_radius_certified") == pytest.approx(0.4)
    agg.aggregate(tmp_path, runs_of(runs), table_eps_factors=[0.0, 0.05], figures_dir=tmp_path / "fig",
                  tables_dir=tmp_path / "tab")
    zero = pd.read_csv(tmp_path / "tab" / "CartPole_mean_radius.csv").set_index("algo")
    cert = pd.read_csv(tmp_path / "tab" / "CartPole_mean_radius_certified.csv").set_index("algo")
    assert zero.loc["StdTrain", "sigma=0.1"] == pytest.approx(0.24)
    assert cert.loc["StdTrain", "sigma=0.1"] == pytest.approx(0.4)
    assert zero.loc["CARRL", "sigma=0.1"] == 0 and math.isnan(cert.loc["CARRL", "sigma=0.1"])
    md = (tmp_path / "tab" / "CartPole_mean_radius_certified.md").read_text()
    assert "certified steps only" in md and re.search(r"\| CARRL\s+\|\s+—\s+\|", md)
    assert "uncertified = 0" in (tmp_path / "tab" / "CartPole_mean_radius.md").read_text()
    # Markdown: no nan, reader's column names (no snake_case keys), ε without binary noise.
    for f in (tmp_path / "tab").glob("*.md"):
        text = f.read_text()
        assert not re.search(r"\bnan\b", text, re.I), f.name
        header = next(line for line in text.splitlines() if line.startswith("|"))
        assert "_" not in header and "gap" not in header, (f.name, header)
    rb = (tmp_path / "tab" / "CartPole_reward_bounds.csv").read_text()
    assert "0.005," in rb and "0.005000000000000001" not in rb
    assert re.search(r"\|\s+0\.005\s+\|", (tmp_path / "tab" / "CartPole_reward_bounds.md").read_text())
    assert math.isnan(metric_value(data[(CART, "CARRL", "0.1")], "mean_radius_certified"))


# ------------------------------------------------------------------ vacuous bounds

@pytest.mark.slow
def test_a_bound_below_j_min_is_shown_as_vacuous(tmp_path):
    """Theorem 2's linear bound falls below J_min at large ε: the tables report J_min, marked † (Markdown)
    or a dagger (LaTeX), keep the raw value in the CSV's expectation_bound_raw, and the tightness against the
    reported bound; the figure draws it at J_min with ▽ markers and says so."""
    sigma = 0.1
    runs = make_results(tmp_path, {CART: {"StdTrain": [sigma]}})
    d = runs[(CART, "StdTrain", repr(sigma))]
    returns = pd.read_csv(d / RUN_FILES["gre_returns"])["return"].to_numpy()
    j_min = 0.0
    kw = dict(sigma=sigma, horizon=30, alpha=0.02, percentiles=[0.5], j_min=j_min, j_max=40.0)
    gre = gre_bounds(returns, eps_grid=[0.0, 0.005, 0.02], **kw)
    raw = gre.drop_duplicates("eps").set_index("eps")["expectation_bound_raw"]
    assert raw.loc[0.02] < j_min < raw.loc[0.0]  # the precondition: one vacuous ε, one not
    rewrite_csv(d / RUN_FILES["gre"], gre)
    data = load_runs(tmp_path, runs_of(runs))
    by_name = tables.env_tables(CART, data, [0.0, 0.2])
    rb, _ = by_name["reward_bounds"]
    rb = rb.set_index("eps")
    assert rb.loc[0.02, "expectation_bound"] == j_min
    assert rb.loc[0.02, "expectation_bound_raw"] == pytest.approx(raw.loc[0.02], rel=1e-9)
    assert rb.loc[0.0, "expectation_bound"] == rb.loc[0.0, "expectation_bound_raw"] == pytest.approx(raw.loc[0.0])
    tight, _ = by_name["tightness"]
    pgd = rb.loc[0.02, "pgd_global_mean"]
    assert tight.set_index("eps").loc[0.02, "pgd_mean_minus_expectation_bound"] == pytest.approx(pgd - j_min)
    written = tables.write_env_tables(CART, data, tmp_path / "tab", [0.0, 0.2])
    md = (tmp_path / "tab" / "CartPole_reward_bounds.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| StdTrain")]
    assert len(rows) == 2 and "0 †" in rows[1] and "†" not in rows[0], rows
    assert "expectation_bound_raw" not in md.split("\n\n")[1] and "raw" not in rows[1]
    assert "vacuous" in md.split("\n")[0]
    tex = (tmp_path / "tab" / "CartPole_reward_bounds.tex").read_text()
    assert tex.count(r"$^\dagger$") == 1
    csv = pd.read_csv(tmp_path / "tab" / "CartPole_reward_bounds.csv")
    assert list(csv.columns).count("expectation_bound_raw") == 1
    assert len(written) == len(layout.TABLES) * len(layout.TABLE_FORMATS)
    figs = _all_figures(data, CART)
    try:
        ax = figs["CartPole_global_mean_sigma-0.1"].axes[0]
        bound = next(ln for ln in ax.get_lines() if ln.get_gid() == "bound:StdTrain")
        assert min(bound.get_ydata()) == j_min
        marks = [ln for ln in ax.get_lines() if ln.get_gid() == "vacuous:StdTrain"]
        # at J_min where the axis shows it, else at the lower edge (J_min far below what claims something)
        edge = j_min if ax.get_ylim()[0] <= j_min else ax.get_ylim()[0]
        assert len(marks) == 1 and min(marks[0].get_xdata()) > 0.005 and set(marks[0].get_ydata()) == {edge}
        assert any("vacuous" in t for t in _legend_texts(figs["CartPole_global_mean_sigma-0.1"]))
    finally:
        _close_all(figs)


@pytest.mark.slow
def test_a_truncated_lore_bound_is_marked(tmp_path):
    """A bounded LoRe search that spent its node budget (lore.meta.json truncated: true): the reward-bounds
    table gets a lore_truncated column true on its rows only, the caption says what it means, and the
    adasearch and all-bounds figures name the algorithm; a folder without one keeps its tables unchanged."""
    import json

    runs = make_results(tmp_path, {CART: {"StdTrain": [0.1], "SA-DQN": [0.1]}})
    clean, _ = tables.env_tables(CART, load_runs(tmp_path, runs_of(runs)), [0.0])["reward_bounds"]
    assert "lore_truncated" not in clean
    meta = runs[(CART, "SA-DQN", "0.1")] / meta_name(RUN_FILES["lore"])
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "nodes": 40, "truncated": True}))
    data = load_runs(tmp_path, runs_of(runs))
    rb, caption = tables.env_tables(CART, data, [0.0])["reward_bounds"]
    assert dict(zip(rb["algo"], rb["lore_truncated"])) == {"StdTrain": False, "SA-DQN": True}
    assert "truncated" in caption and "node budget" in caption
    assert rb.drop(columns="lore_truncated").equals(clean)
    figs = _all_figures(data, CART)
    try:
        for stem in ("CartPole_adasearch_sigma-0.1", "CartPole_all_bounds"):
            notes = [t for t in _legend_texts(figs[stem]) if t.startswith("truncated search (node budget)")]
            assert len(notes) == 1 and "SA-DQN" in notes[0] and "StdTrain" not in notes[0], stem
    finally:
        _close_all(figs)


@pytest.fixture(scope="module")
def two_targets(tmp_path_factory):
    """One label of your own with targets probs and vote (run folders MyPPO@probs, MyPPO@vote): LoAct differs
    between them, GRe and the global attack (the σ-randomized policy, the same for every target) do not."""
    root = tmp_path_factory.mktemp("targets")
    runs = make_results(root, {CART: {"MyPPO": [0.1]}})
    run = load_runs(root, runs_of(runs))[(CART, "MyPPO", "0.1")]
    vote = {**run, "loact": run["loact"].assign(radius=run["loact"]["radius"] * 0.5)}
    data = {(CART, "MyPPO@probs", "0.1"): run, (CART, "MyPPO@vote", "0.1"): vote}
    figs = _all_figures(data, CART)
    yield data, figs
    _close_all(figs)


@pytest.mark.slow
def test_targets_of_one_label_have_distinct_colour_blind_safe_styles(two_targets):
    _, figs = two_targets
    probs, vote = style.series_color("MyPPO@probs"), style.series_color("MyPPO@vote")
    assert probs == style.algo_color("MyPPO") and vote != probs
    assert style.series_marker("MyPPO@probs") != style.series_marker("MyPPO@vote")
    for name, matrix in [("normal", None), *_CVD.items()]:
        assert float(np.linalg.norm(_lab(probs, matrix) - _lab(vote, matrix))) >= 15.0, name
    lines = {ln.get_gid(): ln for ln in figs["CartPole_stepwise_sigma-0.1"].axes[0].lines if ln.get_gid()}
    assert to_hex(lines["bound:MyPPO@probs"].get_color()) == probs
    assert to_hex(lines["bound:MyPPO@vote"].get_color()) == vote


def test_identical_curves_are_drawn_once_and_named(two_targets):
    _, figs = two_targets
    for kind in ("global_mean", "global_median"):
        ax = figs[f"CartPole_{kind}_sigma-0.1"].axes[0]
        gids = [ln.get_gid() for ln in ax.lines]
        assert gids.count("bound:MyPPO@probs") == 1 and gids.count("attack:MyPPO@probs") == 1
        assert "bound:MyPPO@vote" not in gids and "attack:MyPPO@vote" not in gids
        assert "MyPPO (vote): the same curves as MyPPO (probs)" in _legend_texts(ax.figure)
    # curves that differ are both drawn (LoAct's radii)
    gids = [ln.get_gid() for ln in figs["CartPole_stepwise_sigma-0.1"].axes[0].lines]
    assert "bound:MyPPO@probs" in gids and "bound:MyPPO@vote" in gids


@pytest.mark.slow
def test_the_certified_ratio_axis_fits_the_data(nine):
    _, _, data, figs = nine
    ax = figs["CartPole_certified_ratio_sigma-0.1"].axes[0]
    largest = max(float(d["certified_ratio"].loc[d["certified_ratio"]["eta"] > 0, "r"].max())
                  for k, d in data.items() if k[0] == CART)
    grid_end = max(float(d["certified_ratio"]["r"].max()) for k, d in data.items() if k[0] == CART)
    lo, hi = ax.get_xlim()
    assert largest <= hi and hi <= 0.5 * grid_end + largest, (largest, hi, grid_end)
    shown = sum(np.ptp(ln.get_xdata()[ln.get_xdata() <= hi]) for ln in ax.lines if ln.get_gid())
    assert shown > 0


@pytest.mark.slow
def test_only_rows_at_or_above_the_stopping_eps_are_marked_truncated(tmp_path):
    """lore.meta.json's exact_below_eps: the pairs below it are the full search's, so a row at a smaller ε is
    not marked; a run that records no such ε is marked at every ε."""
    import json

    runs = make_results(tmp_path, {CART: {"StdTrain": [0.1], "SA-DQN": [0.1]}})
    meta = runs[(CART, "SA-DQN", "0.1")] / meta_name(RUN_FILES["lore"])
    base = json.loads(meta.read_text())
    for exact_below, marked in ((0.05, [False, True, True]), (None, [True, True, True]), (0.0, [True, True, True])):
        meta.write_text(json.dumps({**base, "nodes": 40, "truncated": True, "exact_below_eps": exact_below}))
        rb, _ = tables.env_tables(CART, load_runs(tmp_path, runs_of(runs)), [0.0, 1.0, 2.0])["reward_bounds"]
        sa = rb[rb["algo"] == "SA-DQN"].sort_values("eps")
        assert sa["lore_truncated"].tolist() == marked, exact_below
        assert not rb[rb["algo"] == "StdTrain"]["lore_truncated"].any()


# ------------------------------------------------------------------ figures that show the result

def _far_j_min(root):
    """One CartPole run whose GRe J_min lies far below everything that claims something (as Pendulum-v1's
    −3255 under bounds of −276 and attacks of −125): J̲_E vacuous at the two largest ε, J̲_p certified by no
    order statistic at the largest."""
    runs = make_results(root, {CART: {"StdTrain": [0.1]}})
    d = runs[(CART, "StdTrain", "0.1")]
    gre = pd.read_csv(d / RUN_FILES["gre"]).sort_values("eps").reset_index(drop=True)
    gre["j_min"] = -3000.0
    gre.loc[gre.index[-2:], ["expectation_bound", "expectation_bound_raw"]] = [[-3000.0, -3500.0], [-3000.0, -4000.0]]
    gre.loc[gre.index[-1], ["percentile_bound", "percentile_certified", "k"]] = [np.nan, False, np.nan]
    rewrite_csv(d / RUN_FILES["gre"], gre)
    return load_runs(root, runs_of(runs)), gre


def test_return_axes_fit_what_claims_something(tmp_path):
    """A J_min far below the bounds and attacks is left off the return axis, which fits the non-vacuous bounds
    and the attacks; every vacuous point is still drawn, a hollow ▽ at the axis' lower edge, in the expectation
    and the percentile panels alike, and the legend says what it means."""
    data, gre = _far_j_min(tmp_path)
    figs = _all_figures(data, CART)
    try:
        panels = {"global_mean": [figs["CartPole_global_mean_sigma-0.1"].axes[0]],
                  "global_median": [figs["CartPole_global_median_sigma-0.1"].axes[0]]}
        grid = figs["CartPole_all_bounds"].axes
        panels["global_mean"].append(grid[0])
        panels["global_median"].append(grid[1])
        vacuous_eps = {"global_mean": sorted(gre["eps"].iloc[-2:]), "global_median": [gre["eps"].iloc[-1]]}
        claims = pd.concat([gre.loc[gre.index[:-2], "expectation_bound"], gre.loc[gre.index[:-1], "percentile_bound"]])
        for kind, axes in panels.items():
            for ax in axes:
                lo, hi = ax.get_ylim()
                assert lo > -3000.0 + 0.5 * (claims.min() + 3000.0), (kind, lo)   # J_min far below the axis
                assert hi - lo < 10 * (claims.max() - claims.min() + 1), (kind, lo, hi)
                marks = [ln for ln in ax.get_lines() if ln.get_gid() == "vacuous:StdTrain"]
                assert len(marks) == 1, kind
                assert sorted(marks[0].get_xdata()) == pytest.approx(vacuous_eps[kind]), kind
                assert set(marks[0].get_ydata()) == {lo} and not marks[0].get_clip_on(), kind
                assert marks[0].get_marker() == "v" and marks[0].get_markerfacecolor() == "white", kind
        for stem in ("CartPole_global_mean_sigma-0.1", "CartPole_global_median_sigma-0.1", "CartPole_all_bounds"):
            notes = [t for t in _legend_texts(figs[stem]) if "vacuous" in t]
            assert notes and all("lower edge" in t and "-3000" in t for t in notes), (stem, notes)
    finally:
        _close_all(figs)


def _text_boxes(fig, renderer) -> list:
    """(text, box) of every text of ``fig`` (the axes' texts and every legend's entries), with the patch drawn
    behind it."""
    texts = [t for ax in fig.axes for t in ax.texts]
    texts += [t for lg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()] for t in lg.get_texts()]
    out = []
    for t in texts:
        if t.get_visible() and t.get_text():
            box = t.get_window_extent(renderer)
            if t.get_bbox_patch() is not None:
                box = matplotlib.transforms.Bbox.union([box, t.get_bbox_patch().get_window_extent(renderer)])
            out.append((t.get_text(), box))
    return out


def _drawn_points(line, frame) -> tuple[np.ndarray, float]:
    """Display points of ``line`` as drawn (its markers, and along its segments every few pixels), those inside
    ``frame`` where the axes clip it; and the half size of its markers (or of its width)."""
    xy = line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float))
    xy = xy[np.isfinite(xy).all(axis=1)]
    dpi = line.figure.dpi
    has_marker = line.get_marker() not in (None, "None", "none", "", " ")
    if line.get_linestyle() not in ("None", "none", "", " ") and len(xy) > 1:
        steps = np.maximum(2, (np.hypot(*np.diff(xy, axis=0).T) / 3).astype(int))
        xy = np.concatenate([np.linspace(a, b, n) for a, b, n in zip(xy[:-1], xy[1:], steps)])
    if line.get_clip_on():   # points off the axes are not drawn
        xy = xy[(xy[:, 0] >= frame.x0 - 0.5) & (xy[:, 0] <= frame.x1 + 0.5)
                & (xy[:, 1] >= frame.y0 - 0.5) & (xy[:, 1] <= frame.y1 + 0.5)]
    size = line.get_markersize() if has_marker else line.get_linewidth()
    return xy, 0.5 * size * dpi / 72


def _overlaps(fig) -> list[str]:
    """Every text of ``fig`` whose box covers data: a drawn marker or a stretch of a drawn line."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = _text_boxes(fig, renderer)
    found = []
    for ax in fig.axes:
        frame = ax.get_window_extent(renderer)
        for line in ax.get_lines():
            if not line.get_visible() or not (line.get_gid() or "").count(":"):
                continue
            xy, h = _drawn_points(line, frame)
            for text, b in boxes:
                inside = (xy[:, 0] > b.x0 - h) & (xy[:, 0] < b.x1 + h) & (xy[:, 1] > b.y0 - h) & (xy[:, 1] < b.y1 + h)
                if inside.any():
                    found.append(f"{text!r} over {line.get_gid()}")
    return found


def test_no_text_covers_data(tmp_path, two_targets):
    """Notes (vacuous points, identical curves, legends) sit outside the axes: no text's box covers a drawn
    marker or line of a series, in a panel with vacuous points at J_min, with them at the lower edge, or with a
    curve drawn once."""
    runs = make_results(tmp_path / "near", {CART: {"StdTrain": [0.1], "AdvTrain": [0.1]}})
    d = runs[(CART, "StdTrain", "0.1")]
    gre = pd.read_csv(d / RUN_FILES["gre"]).sort_values("eps").reset_index(drop=True)
    gre.loc[gre.index[-2:], "expectation_bound"] = -5.0   # below J_min = 0: vacuous, J_min on the axis
    rewrite_csv(d / RUN_FILES["gre"], gre)
    near = _all_figures(load_runs(tmp_path / "near", runs_of(runs)), CART)
    far = _all_figures(_far_j_min(tmp_path / "far")[0], CART)
    try:
        for figs in (near, far, two_targets[1]):
            for stem in ("CartPole_global_mean_sigma-0.1", "CartPole_global_median_sigma-0.1", "CartPole_all_bounds",
                         "CartPole_stepwise_sigma-0.1", "CartPole_adasearch_sigma-0.1"):
                assert _overlaps(figs[stem]) == [], stem
    finally:
        _close_all(near)
        _close_all(far)


def test_stepwise_is_one_thin_smooth_line_per_series_with_episode_ends_marked(tmp_path):
    """Noisy radii over a 200-step horizon: one thin line per algorithm (a running mean over episodes and a few
    steps, much smoother than the per-step mean), and a marker where an episode ended before the horizon."""
    runs = make_results(tmp_path, {CART: {"StdTrain": [0.1], "AdvTrain": [0.1]}})
    data = load_runs(tmp_path, runs_of(runs))
    rng = np.random.default_rng(0)
    lengths = {"StdTrain": [200, 200, 200, 120, 150], "AdvTrain": [200] * 5}
    for a, ls in lengths.items():
        rows = [{"episode": e, "step": t, "certified": True, "radius": float(rng.uniform(0.0, 0.1))}
                for e, n in enumerate(ls) for t in range(n)]
        data[(CART, a, "0.1")] = {**data[(CART, a, "0.1")], "loact": pd.DataFrame(rows),
                                  "loact_settings": {"horizon": 200}}
    figs = _all_figures(data, CART)
    try:
        for stem in ("CartPole_stepwise_sigma-0.1", "CartPole_stepwise"):
            ax = figs[stem].axes[0]
            drawn = [ln for ln in ax.get_lines() if ln.get_linestyle() not in ("None", "none", "", " ")]
            assert len(drawn) <= len(lengths), (stem, [ln.get_gid() for ln in drawn])
            for a in lengths:
                line = next(ln for ln in drawn if ln.get_gid() == f"bound:{a}")
                assert line.get_linewidth() <= 1.3, (stem, a)
                raw = per_step_mean_radius(data[(CART, a, "0.1")]["loact"])["mean"].to_numpy()
                tv = lambda y: float(np.abs(np.diff(np.asarray(y, dtype=float))).sum())  # noqa: E731
                assert tv(line.get_ydata()) < 0.4 * tv(raw), (stem, a)
            ends = [ln for ln in ax.get_lines() if ln.get_gid() == "episode-over:StdTrain"]
            assert len(ends) == 1 and sorted(ends[0].get_xdata()) == [119, 149], stem
            assert not any((ln.get_gid() or "") == "episode-over:AdvTrain" for ln in ax.get_lines()), stem
            assert any("episode over" in t for t in _legend_texts(figs[stem])), stem
    finally:
        _close_all(figs)


def test_lore_vacuous_points_are_marked_and_the_legend_says_so_once(tmp_path):
    """A LoRe bound at J_min (CartPole's 0 over LoRe's horizon) is a hollow ▽ at J_min in LoRe's panel, as in
    GRe's; in the grid, where GRe's vacuous points sit at the lower edge (J_min = −3000 off the axis) and LoRe's
    at J_min, the legend has one ▽ entry that names both."""
    data, _ = _far_j_min(tmp_path)
    run = data[(CART, "StdTrain", "0.1")]
    run["lore"] = pd.DataFrame({"eps": [0.0, 0.05, 0.15], "lower_bound": [6.0, 4.0, 0.0]})
    figs = _all_figures(data, CART)
    try:
        for ax in (figs["CartPole_adasearch_sigma-0.1"].axes[0], figs["CartPole_all_bounds"].axes[2]):
            marks = [ln for ln in ax.get_lines() if ln.get_gid() == "vacuous:StdTrain"]
            assert len(marks) == 1 and list(marks[0].get_xdata()) == [0.15] and list(marks[0].get_ydata()) == [0.0]
            assert marks[0].get_marker() == "v" and marks[0].get_markerfacecolor() == "white"
            assert ax.get_ylim()[0] <= 0.0
        single = [t for t in _legend_texts(figs["CartPole_adasearch_sigma-0.1"]) if "vacuous" in t]
        assert len(single) == 1 and "drawn at $J_{\\min}$" in single[0] and "= 0)" in single[0], single
        notes = [t for t in _legend_texts(figs["CartPole_all_bounds"]) if "vacuous" in t]
        assert len(notes) == 1 and "-3000 or 0" in notes[0] and "lower edge" in notes[0], notes
    finally:
        _close_all(figs)


def test_gre_csv_bounds_are_at_least_j_min_and_drawn_as_written(tmp_path):
    """Every bound gre.csv holds is ≥ J_min (Theorem 2's below it is clipped to it, its value kept in
    expectation_bound_raw), the agreement check recomputes the same, and the figure draws what gre.csv holds."""
    from crop.audit.agreement import run_disagreements

    runs = make_results(tmp_path, {CART: {"StdTrain": [0.1]}})
    d = runs[(CART, "StdTrain", "0.1")]
    returns = pd.read_csv(d / RUN_FILES["gre_returns"])["return"].to_numpy()
    rewrite_csv(d / RUN_FILES["gre"], gre_bounds(returns, sigma=0.1, horizon=30, alpha=0.02, percentiles=[0.5],
                                                 eps_grid=[0.0, 0.005, 0.02], j_min=0.0, j_max=40.0))
    gre = pd.read_csv(d / RUN_FILES["gre"]).drop_duplicates("eps").sort_values("eps")
    assert (gre["expectation_bound_raw"] < 0.0).any()   # the precondition: Theorem 2 below J_min somewhere
    for col in ("expectation_bound", "cdf_expectation_bound", "percentile_bound"):
        assert (gre[col].dropna() >= gre["j_min"].iloc[0]).all(), col
    assert run_disagreements(d) == []
    data = load_runs(tmp_path, runs_of(runs))
    figs = _all_figures(data, CART)
    try:
        ax = figs["CartPole_global_mean_sigma-0.1"].axes[0]
        bound = next(ln for ln in ax.get_lines() if ln.get_gid() == "bound:StdTrain")
        assert list(bound.get_xdata()[:3]) == list(gre["eps"])
        assert list(bound.get_ydata()[:3]) == list(gre["expectation_bound"])
    finally:
        _close_all(figs)


def test_a_gre_csv_of_the_previous_release_still_agrees_with_its_returns(tmp_path):
    """Before the raw column, gre.csv held Theorem 2's value itself as expectation_bound: a folder made then is
    not a disagreement; the same file with a changed bound still is."""
    from crop.audit.agreement import run_disagreements

    runs = make_results(tmp_path, {CART: {"StdTrain": [0.1]}})
    d = runs[(CART, "StdTrain", "0.1")]
    returns = pd.read_csv(d / RUN_FILES["gre_returns"])["return"].to_numpy()
    table = gre_bounds(returns, sigma=0.1, horizon=30, alpha=0.02, percentiles=[0.5], eps_grid=[0.0, 0.005, 0.02],
                       j_min=0.0, j_max=40.0)
    old = table.assign(expectation_bound=table["expectation_bound_raw"]).drop(columns="expectation_bound_raw")
    assert (old["expectation_bound"] < 0.0).any()   # the precondition: a value the new rule would clip
    rewrite_csv(d / RUN_FILES["gre"], old)
    assert run_disagreements(d) == []
    rewrite_csv(d / RUN_FILES["gre"], old.assign(expectation_bound=old["expectation_bound"] + 1.0))
    assert [p["file"].rsplit("/", 1)[-1] for p in run_disagreements(d)] == [RUN_FILES["gre"]]
