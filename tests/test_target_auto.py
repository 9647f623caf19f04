"""``target: auto``: the qrange stage's pilot chooses one smoothing target per run on its own states and
noise (crop/certify/pilot.py), and the certification then runs exactly as if that target had been given."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from crop.__main__ import main
from crop.certify.pilot import CANDIDATES, PilotSettings, choose_target, pilot_states, run_pilot
from crop.io import derive_seed, meta_name, read_json, sha256_file, write_json
from crop.models import save_network
from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings
from crop.workflow import layout
from crop.workflow.config import ConfigError, run_targets, validate_config

from networks import random_mlp
from paths import REPO

torch.set_num_threads(1)
SIGMA = 0.1


class Fixed(torch.nn.Module):
    """Q(s) = (1, 0) everywhere: the greedy action never changes, so every vote is for action 0."""

    def forward(self, x):
        return torch.tensor([1.0, 0.0]).expand(len(x), 2).clone()


class Flicker(torch.nn.Module):
    """Q(s) = (0.99 + sign(sin(500 s₀)), 0): action 0's value flips between 1.99 and −0.01 at a scale far
    below σ, so its vote is a coin flip, while its mean stays 0.99 far above action 1's 0 — on the V range
    [−0.01, 1.99] action 1 sits near the bottom."""

    def forward(self, x):
        return torch.stack([0.99 + torch.sign(torch.sin(500 * x[:, 0])), torch.zeros(len(x))], 1)


def _pilot(net, v_range, seed=3):
    states = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    g = torch.Generator().manual_seed(seed)
    s = PilotSettings(SIGMA, 500, CANDIDATES["q"], 10_000, 0.05, "hoeffding", v_range=v_range, chunk=500)
    return run_pilot(net, states, g, s)


@pytest.mark.parametrize("net,v_range,winner", [(Fixed(), (-10.0, 10.0), "vote"),
                                                (Flicker(), (-0.01, 1.99), "q")])
def test_the_pilot_picks_the_target_that_clearly_certifies_more(net, v_range, winner):
    res = _pilot(net, v_range)
    loser = ({"q", "vote"} - {winner}).pop()
    pred = res["predicted"]
    assert res["chosen"] == winner
    assert pred[winner]["mean_predicted_radius"] > 2 * pred[loser]["mean_predicted_radius"]
    assert pred[winner]["certified_fraction"] == 1.0


def test_choose_target_takes_the_largest_and_breaks_ties_in_a_fixed_order():
    assert choose_target({"q": 0.1, "vote": 0.2}) == "vote"
    assert choose_target({"vote": 0.3, "q": 0.3}) == "q"
    assert choose_target({"vote": 0.0, "probs": 0.0}) == "probs"
    assert pilot_states(5) == [0, 1, 2, 3, 4] and len(pilot_states(1000)) == 32
    assert pilot_states(1000)[0] == 0 and pilot_states(1000)[-1] == 999


def test_the_pilot_takes_a_generator_never_a_smoother():
    net = random_mlp(n_in=4, n_out=2, hidden=(8,), seed=0)
    sm = SmoothedNetwork(net, SmoothingSettings(SIGMA, 10, 0.0, 1.0, 0.05, target="vote"), 2)
    s = PilotSettings(SIGMA, 10, ("q", "vote"), 100, 0.05, "hoeffding", v_range=(-1.0, 1.0))
    for bad in (sm, sm.engine, 7):
        with pytest.raises(TypeError, match="torch.Generator"):
            run_pilot(net, np.zeros((2, 4), np.float32), bad, s)


def _checkpoint(d):
    d.mkdir(parents=True, exist_ok=True)
    save_network(random_mlp(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0), d / "model.pt")
    write_json(d / "model.json", {"env": "CartPole-v0", "algo": "StdTrain", "profile": "vector",
                                  "net_spec": {"arch": "mlp", "in": 4, "hidden": [16], "out": 2},
                                  "sha256": sha256_file(d / "model.pt")})
    return ["--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", str(SIGMA), "--checkpoint", str(d / "model.pt"),
            "--no-progress"]


PILOT = ["--target", "auto", "--loact-m", "1000", "--loact-horizon", "20", "--alpha", "0.05", "--alpha-mode", "state",
         "--bound", "hoeffding"]
QRANGE = ["--m", "200", "--episodes", "2", "--horizon", "20"]
LOACT = ["--m", "1000", "--episodes", "2", "--horizon", "20"]


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("auto")
    base = _checkpoint(d / "ck")
    main(["qrange", *base, *QRANGE, *PILOT, "--out", str(d / "qa.json")])
    main(["qrange", *base, *QRANGE, "--out", str(d / "q.json")])
    for t in ("auto", "q", "vote"):
        main(["loact", *base, *LOACT, "--target", t, "--qrange", str(d / "qa.json"), "--out", str(d / f"{t}.csv")])
    return d, base


def test_an_auto_run_is_the_run_of_the_chosen_target(auto_run):
    d, _ = auto_run
    qa, q = read_json(d / "qa.json"), read_json(d / "q.json")
    choice = qa["target_choice"]
    assert choice["chosen"] in ("q", "vote") and choice["candidates"] == ["q", "vote"]
    assert choice["pilot_states"] == 32 and choice["pilot_m"] == 200 and choice["cert_m"] == 1000
    # the pilot comes after every V-range draw: the V range is the one of a run without it
    assert (qa["v_min"], qa["v_max"], qa["states"]) == (q["v_min"], q["v_max"], q["states"])
    assert "target_choice" not in q and "loact_m" not in q["provenance"]["settings"]
    assert (d / "auto.csv").read_bytes() == (d / f"{choice['chosen']}.csv").read_bytes()
    meta = json.loads((d / meta_name("auto.csv")).read_text())
    assert meta["target"] == meta["settings"]["target"] == choice["chosen"] and meta["target_choice"] == choice
    assert set(meta["inputs"]) == {"checkpoint", "qrange"}
    # the prediction is of the certification that follows: the chosen target's actual mean radius is near it
    actual = {t: pd.read_csv(d / f"{t}.csv")["radius"].mean() for t in ("q", "vote")}
    assert max(actual, key=actual.get) == choice["chosen"]


def _rewrite(d, src, dst, **change):
    q = read_json(d / src)
    for key, value in change.items():
        if value is None:
            q["target_choice"].pop(key) if key != "target_choice" else q.pop(key)
        elif key == "target_choice":
            q[key] = value
        else:
            q["target_choice"][key] = value
    write_json(d / dst, q)
    return str(d / dst)


@pytest.mark.parametrize("change,needle", [
    ({"target_choice": None}, "no target_choice"),
    ({"chosen": "probs"}, "target_choice.chosen 'probs' is not a target of this network"),
    ({"chosen": "auto"}, "target_choice.chosen 'auto'"),
    ({"pilot_seed": "LOACT"}, "target_choice.pilot_seed is this stage's own noise seed"),
])
def test_a_bad_choice_is_one_line_before_any_work(auto_run, tmp_path, capsys, change, needle):
    d, base = auto_run
    loact_seed = derive_seed(0, "CartPole-v0", "StdTrain", repr(SIGMA), "loact")
    change = {k: (loact_seed if v == "LOACT" else v) for k, v in change.items()}
    bad = _rewrite(d, "qa.json", tmp_path.name + ".json", **change)
    with pytest.raises(SystemExit):
        main(["loact", *base, *LOACT, "--target", "auto", "--qrange", bad, "--out", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("stage,argv,needle", [
    ("loact", ["--target", "auto"], "--target auto needs --qrange"),
    ("qrange", ["--target", "auto", "--loact-m", "100"], "--target auto needs --loact-horizon"),
    ("qrange", ["--loact-m", "100"], "--loact-m: a flag of the pilot of --target auto only"),
])
def test_auto_without_its_inputs_is_one_line(auto_run, tmp_path, capsys, stage, argv, needle):
    _, base = auto_run
    with pytest.raises(SystemExit):
        main([stage, *base, *(QRANGE if stage == "qrange" else LOACT), *argv, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not list(tmp_path.iterdir())


def test_another_checkpoints_choice_is_refused(auto_run, tmp_path, capsys):
    d, _ = auto_run
    other = _checkpoint(tmp_path / "other")
    save_network(random_mlp(n_in=4, n_out=2, hidden=(16,), seed=2), tmp_path / "other" / "model.pt")
    rec = read_json(tmp_path / "other" / "model.json")
    write_json(tmp_path / "other" / "model.json", {**rec, "sha256": sha256_file(tmp_path / "other" / "model.pt")})
    with pytest.raises(SystemExit):
        main(["loact", *other, *LOACT, "--target", "auto", "--qrange", str(d / "qa.json"),
              "--out", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint_sha256" in err[0], err


def test_a_continuous_agent_refuses_auto_in_one_line(imported, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["loact", "--env", "Pendulum-v1", "--algo", "SAC", "--sigma", "0.1", "--checkpoint", str(imported),
              "--target", "auto", "--out", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--target auto: a continuous-action agent" in err[0], err
    cfg = yaml.safe_load((REPO / "tests/configs/continuous.yaml").read_text())
    cfg["environments"]["Pendulum-v1"]["target"] = "auto"
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert "environments.Pendulum-v1.target: its actions are continuous" in str(e.value)
    assert "no targets for auto to choose among" in str(e.value) and "\n" not in str(e.value)


def _smoke(tmp_path, **env):
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "smoke.yaml").read_text())
    cfg["results"] = str(tmp_path / "results")
    for ec in cfg["environments"].values():
        ec.update(env)
    return cfg


def test_a_config_with_target_auto_validates_and_its_runs_live_at_algo_at_auto(tmp_path):
    cfg = validate_config(_smoke(tmp_path, target="auto"))
    runs = run_targets(cfg)
    assert runs and all(t == "auto" for *_, t in runs)
    env, algo, sig, _ = runs[0]
    assert layout.run_dir("r", env, algo, sig, "auto").parent.name == f"{algo}@auto"
    assert "qrange" in layout.run_stages("auto") and "qrange" not in layout.run_stages("vote")
    assert layout.series_label(f"{algo}@auto") == f"{algo} (auto)"
    assert validate_config(_smoke(tmp_path, targets=["q", "auto"]))


@pytest.mark.slow
def test_the_rules_pass_the_pilot_to_qrange_and_the_choice_to_the_certifiers(tmp_path):
    import subprocess
    import sys

    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).state_dict(),
               tmp_path / "q.pt")
    cfg = _smoke(tmp_path, source="file", files={"StdTrain": {"path": str(tmp_path / "q.pt")}},
                 algorithms=["StdTrain"], sigmas=[0.2], target="auto")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                        str(tmp_path), "--configfile", str(path), "-n", "-p"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.splitlines()
    qrange = [ln for ln in lines if "crop qrange " in ln]
    assert len(qrange) == 1 and "StdTrain@auto/sigma-0.2" in qrange[0]
    loact = cfg["environments"]["CartPole-v0"]["loact"]
    assert f"--target auto --loact-m {loact['m']} --loact-horizon {loact['horizon']}" in qrange[0]
    for stage in ("loact", "lore", "attack-local"):
        cmd = next(ln for ln in lines if f"crop {stage} " in ln)
        assert "--target auto --qrange" in cmd and "StdTrain@auto/sigma-0.2/qrange.json" in cmd, cmd


def test_the_audit_rerun_checks_the_pilot_flags_and_accepts_the_chosen_target():
    from crop.audit.rerun import _checked_settings, _NotRun, _same_run
    from crop.workflow.stage_table import STAGES

    row = STAGES["qrange"]
    settings = {"command": "qrange", "env": "CartPole-v0", "algo": "StdTrain", "sigma": 0.1, "m": 200,
                "episodes": 2, "horizon": 20, "target": "auto", "loact_m": 1000, "loact_horizon": 20, "alpha": 0.05,
                "alpha_mode": "state", "bound": "hoeffding"}
    assert _checked_settings({"settings": settings}, row)["loact_m"] == 1000
    for bad in ({"alpha_mode": "--out=/etc/x"}, {"loact_m": "1 --out=/x"}, {"bound": "none"}, {"alpha": 2.0}):
        with pytest.raises(_NotRun):
            _checked_settings({"settings": {**settings, **bad}}, row)
    run = "CartPole-v0/StdTrain@auto/sigma-0.1"
    same = {"env": "CartPole-v0", "algo": "StdTrain", "sigma": 0.1}
    for chosen in ("q", "vote", "auto"):
        _same_run({**same, "target": chosen}, run)
    for wrong, where in (("--qrange=/x", run), ("vote", "CartPole-v0/StdTrain@probs/sigma-0.1")):
        with pytest.raises(ValueError, match="recorded target"):
            _same_run({**same, "target": wrong}, where)


@pytest.mark.parametrize("stage_target,chosen,needle", [
    ("vote", "vote", None),
    ("q", "vote", "settings.target is 'q', but this auto run's pilot chose 'vote'"),
    ("vote", "auto", "target_choice.chosen is 'auto', not one of q, probs, vote"),
])
def test_the_audit_names_an_auto_runs_target_and_refuses_stages_that_certified_another(tmp_path, stage_target,
                                                                                        chosen, needle):
    from crop.audit.provenance import run_provenance

    run = "CartPole-v0/StdTrain@auto/sigma-0.1"
    d = tmp_path / run
    d.mkdir(parents=True)
    write_json(d / "qrange.json", {"target_choice": {"chosen": chosen}})
    write_json(d / meta_name("loact.csv"), {"stage": "loact", "settings": {"target": stage_target}})
    prov, problems, _ = run_provenance(tmp_path, run)
    found = [p["problem"] for p in problems]
    if needle is None:
        assert prov["target"] == "auto: vote" and not found
    else:
        assert len(found) == 1 and needle in found[0], found
        assert prov["target"] == ("auto: vote" if chosen == "vote" else "auto")


def test_a_policy_network_chooses_between_probs_and_vote_without_a_v_range(tmp_path):
    base = _checkpoint(tmp_path)
    rec = read_json(tmp_path / "model.json")
    write_json(tmp_path / "model.json", {**rec, "network": "policy"})
    pilot = [*PILOT[:-1], "clopper_pearson"]
    main(["qrange", *base, *QRANGE, *pilot, "--out", str(tmp_path / "qa.json")])
    qa = read_json(tmp_path / "qa.json")
    assert "v_min" not in qa and qa["target_choice"]["candidates"] == ["probs", "vote"]
    for t in ("auto", qa["target_choice"]["chosen"]):
        main(["loact", *base, *LOACT, "--bound", "clopper_pearson", "--target", t,
              "--qrange", str(tmp_path / "qa.json"), "--out", str(tmp_path / f"{t}.csv")])
    assert (tmp_path / "auto.csv").read_bytes() == (tmp_path / f"{qa['target_choice']['chosen']}.csv").read_bytes()
