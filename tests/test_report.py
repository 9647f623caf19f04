"""Figures and tables of `crop aggregate` on a synthetic results folder with four environments: exactly the
files crop.workflow.layout names, the paper's spellings, one colour per algorithm everywhere, the multi-panel,
legend, Freeway large-σ and Pong periodic figures, and tables that agree with the raw result files."""
import math
import re

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from crop.__main__ import main
from crop.io import meta_name
from crop.report import aggregate as agg
from crop.report import figures, style, tables
from crop.report.metrics import load_runs
from crop.workflow import layout
from crop.workflow.layout import RUN_FILES

from synthetic_results import make_results, runs_of

PLAN = {
    "CartPole-v0": {"StdTrain": [0.01, 0.1], "GaussAug": [0.01, 0.1]},
    "highway-fast-v0": {"CARRL": [0.05]},
    "PongNoFrameskip-v4": {"StdTrain": [0.01]},
    "FreewayNoFrameskip-v4": {"RadialRL": [0.5, 1.5, 4.0], "SA-MDP-PGD": [1.5]},
}
EPS_FACTORS = [0.0, 0.1]


def _layout_plan(plan):
    return {env: (list(algos), sorted({repr(float(s)) for ss in algos.values() for s in ss}, key=float))
            for env, algos in plan.items()}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    runs = make_results(root, PLAN)
    written = agg.aggregate(root, runs_of(runs), table_eps_factors=EPS_FACTORS, figures_dir=root / "figures",
                            tables_dir=root / "tables")
    return root, runs, written


@pytest.mark.slow
def test_aggregate_writes_exactly_the_declared_files(synthetic):
    root, _, written = synthetic
    expected = set(layout.aggregate_files(root / "figures", root / "tables", _layout_plan(PLAN)))
    on_disk = {p for d in ("figures", "tables") for p in (root / d).iterdir()}
    assert on_disk == expected == set(written)
    names = {p.name for p in on_disk}
    # The paper's spellings, the multi-panel rows, legends, Freeway's large σ and Pong's periodic patterns.
    for name in ["Cartpole_loact_clean.pdf", "CartPole_stepwise_sigma-0.01.png", "CartPole_stepwise.pdf",
                 "CartPole_certified_ratio.png", "CartPole_all_bounds.png", "Cartpole_legend.pdf",
                 "highway-fast_stepwise_sigma-0.05.png", "highway-fast_adasearch_sigma-0.05.pdf",
                 "Freeway_stepwise_sigma-1.5.pdf", "Freeway_stepwise_sigma-4.0.pdf", "Freeway_adasearch_sigma-1.5.pdf",
                 "Freeway_large_sigma.png", "Freeway_loact_clean.png", "Pong_global_mean_sigma-0.01.png",
                 "Pong_periodic_sigma-0.01_StdTrain.png", "Pong_stepwise.png",
                 "CartPole_mean_radius.tex", "CartPole_mean_radius_certified.md", "CartPole_tightness.csv",
                 "Freeway_reward_bounds.md"]:
        assert name in names, name
    assert "legend.png" not in names  # one legend file per environment, no run-wide copy of it
    assert not any(n.startswith("Pong_large_sigma") or n.startswith("CartPole_periodic") for n in names)
    for p in on_disk:
        head = p.read_bytes()[:8]
        if p.suffix == ".png":
            assert head.startswith(b"\x89PNG") and p.stat().st_size > 3000, p
        elif p.suffix == ".pdf":
            assert head.startswith(b"%PDF"), p


def _figs(env, data, wanted):
    """The figures of ``env`` named in ``wanted`` (the others closed as soon as drawn)."""
    out = {}
    for stem, fig in figures.iter_env_figures(env, data):
        if stem in wanted:
            out[stem] = fig
        else:
            matplotlib.pyplot.close(fig)
    assert set(out) == set(wanted)
    return out


@pytest.fixture(scope="module")
def data(synthetic):
    root, runs, _ = synthetic
    return load_runs(root, runs_of(runs))


@pytest.mark.slow
def test_one_colour_per_algorithm_in_every_figure(data):
    seen = {}
    for env in PLAN:
        for stem, fig in figures.iter_env_figures(env, data):
            for ax in fig.axes:
                for line in ax.get_lines():
                    label = line.get_label()
                    for a in style.ALGO_COLORS:
                        if label == style.algo_label(a):
                            assert to_hex(line.get_color()) == style.ALGO_COLORS[a], (stem, label)
                            seen.setdefault(a, set()).add(stem.split("_")[0])
            for lg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
                for h, t in zip(lg.legend_handles, lg.get_texts()):
                    for a in style.ALGO_COLORS:
                        if t.get_text() == style.algo_label(a):
                            assert to_hex(h.get_color()) == style.ALGO_COLORS[a], (stem, a)
            matplotlib.pyplot.close(fig)
    assert seen["StdTrain"] >= {"CartPole", "Pong"}  # StdTrain drawn in two environments, same colour
    assert len(set(style.ALGO_COLORS.values())) == len(style.ALGO_COLORS)


@pytest.mark.slow
def test_multipanel_and_large_sigma_figures(data):
    figs = _figs("FreewayNoFrameskip-v4", data, ["Freeway_stepwise", "Freeway_large_sigma", "Freeway_all_bounds",
                                                 "Freeway_stepwise_sigma-1.5", "Freeway_legend"])
    try:
        # Fig. 1 row: one panel per main-text σ (large σ have their own figure).
        assert [ax.get_title() for ax in figs["Freeway_stepwise"].axes] == ["σ=0.5"]
        # App. F.2: rows (a) stepwise and (b) LoRe, a column per large σ run.
        large = figs["Freeway_large_sigma"].axes
        assert len(large) == 4 and [ax.get_title() for ax in large[:2]] == ["σ=1.5", "σ=4.0"]
        assert "certified radius" in large[0].get_ylabel() and "lower bound" in large[2].get_ylabel()
        # Fig. 3 grid: three rows of bounds.
        assert len(figs["Freeway_all_bounds"].axes) == 3
        # The per-σ panel shows every algorithm run at that σ.
        labels = {ln.get_label() for ln in figs["Freeway_stepwise_sigma-1.5"].axes[0].get_lines()}
        assert {"RadialRL", "SA-MDP (PGD)"} <= labels
        # The legend strip names the environment's algorithms and the line styles.
        texts = [t.get_text() for t in figs["Freeway_legend"].legends[0].get_texts()]
        assert texts[:2] == ["SA-MDP (PGD)", "RadialRL"] and "PGD attack (dashed)" in texts
    finally:
        for f in figs.values():
            matplotlib.pyplot.close(f)
    cart = _figs("CartPole-v0", data, ["CartPole_stepwise"])
    try:
        assert [ax.get_title() for ax in cart["CartPole_stepwise"].axes] == ["σ=0.01", "σ=0.1"]
        # The mean line of a stepwise panel is the per-step mean of loact.csv.
        st = data[("CartPole-v0", "GaussAug", "0.1")]["loact"]
        line = next(ln for ln in cart["CartPole_stepwise"].axes[1].get_lines() if ln.get_label() == "GaussAug")
        np.testing.assert_allclose(line.get_ydata(), st.groupby("step")["radius"].mean().to_numpy())
    finally:
        for f in cart.values():
            matplotlib.pyplot.close(f)


@pytest.mark.slow
def test_pong_periodic_figure_shows_the_recorded_frames(data):
    figs = _figs("PongNoFrameskip-v4", data, ["Pong_periodic_sigma-0.01_StdTrain"])
    try:
        fig = figs["Pong_periodic_sigma-0.01_StdTrain"]
        frames, steps = figures.load_frames(data[("PongNoFrameskip-v4", "StdTrain", "0.01")]["frames_path"])
        images = [ax for ax in fig.axes if ax.images]
        assert len(images) == min(figures.PERIODIC_FRAMES, len(steps))
        shown = [np.asarray(ax.images[0].get_array()) for ax in images]
        picked = [int(re.search(r"t=(\d+)", ax.get_title()).group(1)) for ax in images]
        assert picked[0] == steps.min() and picked[-1] == steps.max()
        for arr, t in zip(shown, picked):
            np.testing.assert_array_equal(arr, frames[list(steps).index(t)])
        plot = next(ax for ax in fig.axes if not ax.images)
        x = plot.get_lines()[0].get_xdata()
        assert x.min() == steps.min() and x.max() == steps.max()
        fig.canvas.draw()   # the frames' letters above the radius plot, never over its curve
        top = plot.get_window_extent().y1
        assert len(plot.texts) == len(images) and all(t.get_window_extent().y0 >= top for t in plot.texts)
    finally:
        for f in figs.values():
            matplotlib.pyplot.close(f)


@pytest.mark.slow
def test_missing_frames_for_pong_is_an_error(tmp_path, capsys):
    runs = make_results(tmp_path, {"PongNoFrameskip-v4": {"StdTrain": [0.01]}})
    (runs[("PongNoFrameskip-v4", "StdTrain", "0.01")] / layout.FRAMES_FILE).unlink()
    with pytest.raises(SystemExit) as e:
        main(["aggregate", str(tmp_path)])
    assert e.value.code == 2
    assert f"{RUN_FILES['frames']}: missing" in capsys.readouterr().err
    assert not (tmp_path / "figures").exists()  # refused before drawing anything


@pytest.mark.slow
def test_tables_agree_with_the_result_files(synthetic):
    root, runs, _ = synthetic
    mr = pd.read_csv(root / "tables" / "CartPole_mean_radius.csv").set_index("algo")
    mc = pd.read_csv(root / "tables" / "CartPole_mean_radius_certified.csv").set_index("algo")
    br = pd.read_csv(root / "tables" / "CartPole_benign_return.csv").set_index("algo")
    for (env, algo, lab), d in runs.items():
        if env != "CartPole-v0":
            continue
        st = pd.read_csv(d / RUN_FILES["loact"])
        assert math.isclose(mr.loc[algo, f"sigma={float(lab)}"], st["radius"].mean(), rel_tol=1e-9)
        # the paper's convention: per step the mean over the episodes certified there (0 where none is), then
        # the mean over the steps any episode reached
        cert = st["certified"].astype(bool)
        per_step = st["radius"].where(cert).groupby(st["step"]).mean().fillna(0.0)
        assert math.isclose(mc.loc[algo, f"sigma={float(lab)}"], per_step.mean(), rel_tol=1e-9)
        ep = pd.read_csv(d / RUN_FILES["loact_episodes"])
        assert math.isclose(br.loc[algo, f"sigma={float(lab)}"], ep["return"].mean(), rel_tol=1e-9)
    rb = pd.read_csv(root / "tables" / "Freeway_reward_bounds.csv")
    tight = pd.read_csv(root / "tables" / "Freeway_tightness.csv")
    assert len(rb) == len(tight) == 4 * len(EPS_FACTORS)
    for r, t in zip(rb.itertuples(), tight.itertuples()):
        d = runs[("FreewayNoFrameskip-v4", r.algo, repr(r.sigma))]
        ag = pd.read_csv(d / RUN_FILES["attack_global"])
        ret = ag[np.isclose(ag["eps"], r.eps)]["return"]
        gre = pd.read_csv(d / RUN_FILES["gre"])
        at = gre[np.isclose(gre["eps"], r.eps)].iloc[0]
        assert math.isclose(r.expectation_bound_raw, at["expectation_bound_raw"], rel_tol=1e-9)
        eb = max(at["expectation_bound_raw"], gre["j_min"].iloc[0])  # reported: a vacuous bound as J_min
        assert math.isclose(r.expectation_bound, eb, rel_tol=1e-9)
        assert math.isclose(at["expectation_bound"], eb, rel_tol=1e-9)   # as gre.csv holds it
        assert math.isclose(r.pgd_global_mean, ret.mean(), rel_tol=1e-9)
        gap_mean, gap_median = t.pgd_mean_minus_expectation_bound, t.pgd_median_minus_percentile_bound
        assert math.isclose(gap_mean, ret.mean() - eb, rel_tol=1e-7, abs_tol=1e-7)
        assert math.isclose(gap_median, r.pgd_global_median - r.percentile_bound_p50, abs_tol=1e-7)
        assert gap_mean >= 0 and gap_median >= 0  # the synthetic results are sound
        if r.eps == 0:
            gap_lore = t.pgd_local_minus_lore_bound
            assert math.isclose(gap_lore, r.pgd_local_return - r.lore_bound, abs_tol=1e-7) and gap_lore >= 0
        else:  # ε = 0.1σ is not on the local attack's grid: no PGD return there, so no gap
            assert math.isnan(r.pgd_local_return) and math.isnan(t.pgd_local_minus_lore_bound)
            assert not math.isnan(r.lore_bound)


@pytest.mark.slow
def test_latex_tables_use_booktabs(synthetic):
    root, _, _ = synthetic
    for name in layout.TABLES:
        tex = (root / "tables" / f"Freeway_{name}.tex").read_text()
        csv = pd.read_csv(root / "tables" / f"Freeway_{name}.csv")
        body = tex[tex.index(r"\midrule") + len(r"\midrule"):tex.index(r"\bottomrule")].strip().splitlines()
        assert tex.index(r"\begin{tabular}") < tex.index(r"\toprule") < tex.index(r"\midrule") \
            < tex.index(r"\bottomrule") < tex.index(r"\end{tabular}")
        assert len(body) == len(csv) and all(row.endswith(r"\\") for row in body)
        header = tex[tex.index(r"\toprule") + len(r"\toprule"):tex.index(r"\midrule")]
        shown = [c for c in csv.columns if not c.endswith(("_raw", *tables.INTERVAL_COLUMNS))]  # CSV-only columns
        assert header.count("&") == len(shown) - 1
        assert "SA-MDP (PGD)" in tex and "SA-MDP-PGD" not in tex.split(r"\toprule")[1]  # display names
    tex = (root / "tables" / "Freeway_mean_radius.tex").read_text()
    csv = pd.read_csv(root / "tables" / "Freeway_mean_radius.csv").set_index("algo")
    assert r"$\sigma=0.5$" in tex and "sigma=0.5 lo" in csv and "sigma=0.5 hi" in csv
    r = csv.loc["RadialRL"]  # the interval beside the value, in the CSV and in the LaTeX cell
    assert r["sigma=1.5 lo"] <= r["sigma=1.5"] <= r["sigma=1.5 hi"]
    assert f"{r['sigma=1.5']:.4g} [{r['sigma=1.5 lo']:.4g}, {r['sigma=1.5 hi']:.4g}]" in tex


def test_latex_escapes_and_marks_missing_values():
    df = pd.DataFrame({"algo": ["SA-MDP-CVX"], "note_x": ["50% & $"], "v": [math.nan]})
    tex = tables.latex_table(df, "cap")
    row = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip()
    assert row == r"SA-MDP (CVX) & 50\% \& \$ & -- \\"
    assert r"note\_x" in tex


def test_markdown_tables_of_the_report_share_one_writer():
    """pipe_table: the columns asked for in their order (absent ones left out), a cut
    table says how many rows it left out and where they are; unpadded rows keep their cells as written."""
    from crop.report.markdown import pipe_table

    rows = [{"b": 1.23456789, "a": "x"}, {"a": "y", "b": 2.0}, {"a": "z", "b": 3.0}]
    text = pipe_table(rows, ["a", "b", "absent"], limit=2, rest="all in the JSON")
    lines = text.splitlines()
    assert re.fullmatch(r"\| a +\| +b \|", lines[0]) and "1.23457" in lines[2] and "y" in lines[3]
    assert len(lines) == 6 and lines[-1] == "… and 1 more rows (all in the JSON)." and "z" not in text
    assert pipe_table(rows, ["a"], pad=False) == "| a |\n|---|\n| x |\n| y |\n| z |"
    assert pipe_table([], ["a"]) == "(none)"
    md = tables.markdown_table(pd.DataFrame({"algo": ["SA-MDP-PGD"], "sigma=0.1": [math.nan]}), "cap")
    assert md.startswith("cap\n\n") and "SA-MDP (PGD)" in md and "σ = 0.1" in md and md.endswith("— |\n")  # empty cell


@pytest.mark.slow
def test_load_runs_complete_or_partial(tmp_path):
    """The figures read complete, intact runs only (a missing or edited file is an error, a replicate needs
    its run); the audit (partial) reads what each run has and leaves out a replicate it cannot use."""
    import shutil

    from crop.report.integrity import IntegrityError

    runs = runs_of(make_results(tmp_path, {"CartPole-v0": {"StdTrain": [0.1], "GaussAug": [0.1]}}))
    std, gauss = (tmp_path / r for r in runs)
    rep = std / "rep-1"
    rep.mkdir()
    for f in (RUN_FILES[k] for k in ("loact", "loact_episodes")):
        shutil.copy(std / meta_name(f), rep / meta_name(f))
        shutil.copy(std / f, rep / f)
    data = load_runs(tmp_path, [f"{runs[0]}/rep-1", *runs])
    key = ("CartPole-v0", "StdTrain", "0.1")
    assert list(data) == [key, ("CartPole-v0", "GaussAug", "0.1")] and len(data[key]["replicates"]) == 1
    assert data[key]["replicates"][0]["loact"].equals(data[key]["loact"])
    (gauss / RUN_FILES["lore"]).unlink()
    with pytest.raises(IntegrityError, match=f"{RUN_FILES['lore']}: missing"):
        load_runs(tmp_path, runs)
    partial = load_runs(tmp_path, runs, partial=True)
    assert "lore" not in partial[("CartPole-v0", "GaussAug", "0.1")] and "lore" in partial[key]
    with pytest.raises(FileNotFoundError, match="without the run itself"):
        load_runs(tmp_path, [f"{runs[0]}/rep-1"])
    assert load_runs(tmp_path, [f"{runs[0]}/rep-1"], partial=True) == {}
    (rep / RUN_FILES["loact_episodes"]).unlink()
    assert load_runs(tmp_path, [runs[0], f"{runs[0]}/rep-1"], partial=True)[key]["replicates"] == []
    with (std / RUN_FILES["gre"]).open("a") as f:
        f.write("1,2,3\n")
    with pytest.raises(IntegrityError, match=RUN_FILES["gre"]):
        load_runs(tmp_path, [runs[0]])


def test_hash_prefixes_stay_text_in_the_audits_provenance_table():
    """A commit or checkpoint prefix of digits only is an identifier: left-aligned and written as it is, not
    parsed as a number (seen with commit 423977515028)."""
    from crop.report.markdown import pipe_table

    rows = [{"checkpoint": "000000123456", "commit": "423977515028", "runtime_s": 1.5}]
    header, rule, row = pipe_table(rows, text=("checkpoint", "commit")).splitlines()
    assert rule.split("|")[1:3] == [":" + "-" * 13, ":" + "-" * 13]  # left-aligned, like any text
    assert "| 000000123456 | 423977515028 |" in row
    assert "-:" in pipe_table(rows).splitlines()[1]  # without text=, tabulate reads them as numbers
