"""A LoRe search (Algorithm 3) stopped at any node and resumed from its resume file reaches the same result,
byte for byte, as an uninterrupted run: the search state and both random streams of the smoother (the
noise generator and the randomised-rounding stream of ``clopper_pearson``) are restored."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crop.certify.lore import LoRe, Resume, lore_bound_at, run_lore
from crop.io import meta_name, sha256_file, write_json
from crop.models import save_network
from crop.smoothing import stats
from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings
from crop.workflow.layout import RUN_FILES

from networks import random_mlp
from toy_lore import ToyWalk, lore_settings


class Killed(Exception):
    """Stands for SIGKILL: raised from inside the search, after the last save."""


class DyingSmoother(SmoothedNetwork):
    """Makes ``lives`` smoothing calls (LoRe's batches of pending nodes), then the process 'dies' (before the
    next batch's noise is drawn)."""

    def __init__(self, *a, lives, **kw):
        super().__init__(*a, **kw)
        self.lives = lives

    def estimate_batch(self, obs_batch, indices=None, alpha=None):
        if self.lives == 0:
            raise Killed
        self.lives -= 1
        return super().estimate_batch(obs_batch, indices, alpha=alpha)


def _smoothed(net_kw, sm_args, lives=None, **settings):
    """The smoother of a case (``sm_args``: σ, m, v_min, v_max, α, |A|; ``settings`` override any field of its
    :class:`SmoothingSettings`); one that dies after ``lives`` calls."""
    *head, n_actions = sm_args
    made = SmoothingSettings(**{**dict(zip(("sigma", "m", "v_min", "v_max", "alpha"), head)), **settings})
    if lives is None:
        return SmoothedNetwork(random_mlp(**net_kw), made, n_actions)
    return DyingSmoother(random_mlp(**net_kw), made, n_actions, lives=lives)


def _lore(smoother, env_id, make=None, profile=None, **settings):
    """The search of a case: ``settings`` are the fields of LoRe's settings by name."""
    return LoRe(env_id, smoother, lore_settings(**settings), profile=profile, make=make)


def _run(smoother, resume_file, every, env_id, make=None, profile=None, **settings):
    resume = None if resume_file is None else Resume(resume_file, every)
    result = run_lore(env_id, smoother, lore_settings(**settings), profile=profile, progress=False, make=make,
                      resume=resume)
    table, info = result.table, result.info
    return table.to_csv(index=False, float_format="%.17g").encode(), info


def _case(env):
    if env == "toy":
        return (dict(n_in=2, n_out=3, hidden=(16,), seed=3, scale=3.0), (0.3, 2000, -6.0, 6.0, 0.05, 3),
                dict(env_id="toy", horizon=8, env_seed=0, make=lambda: ToyWalk(signed=False), gamma=0.9))
    return (dict(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0), (0.05, 300, -4.0, 4.0, 0.05, 2),
            dict(env_id="CartPole-v0", horizon=10, env_seed=3))


@pytest.mark.parametrize("env,bound,mode,lives", [
    ("toy", "clopper_pearson", "state", 0), ("toy", "clopper_pearson", "state", 1),
    ("toy", "clopper_pearson", "state", 9), ("toy", "clopper_pearson", "family", 6),
    ("toy", "hoeffding", "state", 9), ("toy", "hoeffding", "family", 5),
    ("CartPole-v0", "clopper_pearson", "state", 30), ("CartPole-v0", "hoeffding", "family", 30)])
@pytest.mark.slow
def test_resumed_search_is_byte_identical(tmp_path, env, bound, mode, lives):
    net_kw, sm_args, kw = _case(env)
    if mode == "family":
        kw["alpha_of"] = lambda i: stats.lore_state_alpha(0.05, "family", i)
    clean_sm = _smoothed(net_kw, sm_args, bound=bound, seed=7)
    clean, clean_info = _run(clean_sm, None, 60.0, **kw)

    resume = tmp_path / "lore.resume"
    dying = _smoothed(net_kw, sm_args, bound=bound, seed=7, lives=lives)
    with pytest.raises(Killed):
        _run(dying, resume, 0.0, **kw)  # saves before every node
    assert resume.exists()
    fresh = _smoothed(net_kw, sm_args, bound=bound, seed=7)  # a new process: a new smoother
    resumed, info = _run(fresh, resume, 1e9, **kw)
    assert info["resumed"] is True and clean_info["resumed"] is False
    assert info["distinct_states_smoothed"] > lives + 3, "states must be smoothed after the resume to bite"
    assert info["smoothing_calls"] < info["distinct_states_smoothed"], "batches of pending nodes must be replayed"
    assert resumed == clean
    volatile = ("resumed", "runtime_s", "nodes_per_s")
    assert {k: v for k, v in info.items() if k not in volatile} == \
        {k: v for k, v in clean_info.items() if k not in volatile}
    assert fresh.calls == clean_sm.calls and not resume.exists()


def test_every_certificate_after_the_resume_is_the_uninterrupted_one(tmp_path):
    """Stronger than equal outputs: the certificate of every state smoothed after the resume (Clopper–
    Pearson, whose bounds use the rounding stream) equals the uninterrupted run's, bit for bit."""
    net_kw, sm_args, kw = _case("toy")
    clean = _lore(_smoothed(net_kw, sm_args, bound="clopper_pearson", seed=2), **kw)
    clean.certify(progress=False)
    resume = tmp_path / "lore.resume"
    dying = _lore(_smoothed(net_kw, sm_args, bound="clopper_pearson", seed=2,
                                        lives=5), **kw)
    with pytest.raises(Killed):
        dying.certify(resume=Resume(resume, 0.0), progress=False)
    again = _lore(_smoothed(net_kw, sm_args, bound="clopper_pearson", seed=2), **kw)
    again.certify(resume=Resume(resume, 1e9), progress=False)
    assert list(again.memo) == list(clean.memo) and len(clean.memo) > 10
    for key, c in clean.memo.items():
        assert again.memo[key].radii.tobytes() == c.radii.tobytes()
    assert again.states_table().equals(clean.states_table())   # lore_states.csv: depth, ε and L(a₁) restored too


def test_a_resume_file_of_another_run_is_ignored(tmp_path):
    net_kw, sm_args, kw = _case("toy")
    resume = tmp_path / "lore.resume"
    dying = _lore(_smoothed(net_kw, sm_args, seed=2, lives=5), **kw)
    with pytest.raises(Killed):
        dying.certify(resume=Resume(resume, 0.0), progress=False)
    other = _lore(_smoothed(net_kw, sm_args, bound="clopper_pearson", seed=2), **kw)
    _, info = other.certify(resume=Resume(resume, 1e9), progress=False)
    assert info["resumed"] is False  # another bound: another run, started afresh


def _setup(d: Path, bound: str):
    d.mkdir(parents=True)
    net = random_mlp(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0)
    save_network(net, d / "model.pt")
    write_json(d / "model.json", {"env": "CartPole-v0", "algo": "StdTrain", "profile": "vector",
                                  "net_spec": {"arch": "mlp", "in": 4, "hidden": [16], "out": 2},
                                  "sha256": sha256_file(d / "model.pt")})
    write_json(d / RUN_FILES["qrange"], {"env": "CartPole-v0", "algo": "StdTrain", "sigma": 0.05,
                                   "v_min": -4.0, "v_max": 4.0})
    return [sys.executable, "-m", "crop", "lore", "--env", "CartPole-v0", "--algo", "StdTrain",
            "--sigma", "0.05", "--checkpoint", str(d / "model.pt"), "--qrange", str(d / RUN_FILES["qrange"]),
            "--m", "300", "--horizon", "13", "--seed", "5", "--checkpoint-every", "0.3", "--out",
            str(d / RUN_FILES["lore"]), "--no-progress", "--bound", bound]


def _version(path) -> tuple[int, int]:
    """Which save a file is: each save replaces it by a new file (a new inode), and two saves within one tick of
    the file system's clock have the same mtime."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


@pytest.mark.slow
@pytest.mark.parametrize("bound,sig", [("hoeffding", signal.SIGKILL), ("clopper_pearson", signal.SIGKILL),
                                       ("clopper_pearson", signal.SIGTERM)])
def test_lore_survives_sigkill_and_sigterm(tmp_path, bound, sig):
    """Killed mid-search through the stage (SIGKILL: from its last save; SIGTERM, a cluster's wall-time kill:
    it saves at the next node and exits 143) and rerun with the same command: the same lore.csv, byte for
    byte, as an uninterrupted run."""
    clean = _setup(tmp_path / "clean", bound)
    subprocess.run(clean, check=True, capture_output=True, timeout=600)
    killed = _setup(tmp_path / "killed", bound)
    resume = tmp_path / "killed" / f"{RUN_FILES['lore']}.resume"
    p = subprocess.Popen(killed, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    saves = 0
    last = None
    while time.time() < deadline and p.poll() is None:  # wait for the search to have saved twice
        if resume.exists() and _version(resume) != last:
            last = _version(resume)
            saves += 1
            if saves >= 2:  # at least one save after the first, so the state file is being rewritten
                break
        time.sleep(0.05)
    assert p.poll() is None, "the search finished before it could be killed; make it longer"
    os.kill(p.pid, sig)
    err = p.communicate(timeout=60)[1]
    if sig == signal.SIGTERM:
        assert p.returncode == 143 and "SIGTERM: search state saved" in err, err[-2000:]
        assert _version(resume) != last, "SIGTERM must save the state it stops at"
    assert resume.exists() and not (tmp_path / "killed" / RUN_FILES["lore"]).exists()
    subprocess.run(killed, check=True, capture_output=True, timeout=600)
    a, b = tmp_path / "clean" / RUN_FILES["lore"], tmp_path / "killed" / RUN_FILES["lore"]
    assert a.read_bytes() == b.read_bytes()
    assert json.loads((tmp_path / "killed" / meta_name(RUN_FILES["lore"])).read_text())["search"]["resumed"] is True
    assert not resume.exists()


@pytest.mark.slow
def test_the_stage_records_a_truncated_bounded_search(tmp_path):
    """crop lore --max-nodes: lore.meta.json records the nodes, truncated and what was explored at its top; the
    depth-first bound is below the unbounded one's (the same noise per state); --report-double records the bound
    at twice the budget and prints it; --report-double without a budget is one line naming both options."""
    import pandas as pd

    runs, lines = {}, {}
    for name, extra in (("bounded", ["--max-nodes", "40", "--order", "depth-first"]), ("full", []),
                        ("best", ["--max-nodes", "40", "--report-double"])):
        cmd = _setup(tmp_path / name, "hoeffding")
        cmd[cmd.index("--horizon") + 1] = "8"
        lines[name] = subprocess.run(cmd + extra, check=True, capture_output=True, text=True,
                                     timeout=600).stdout.strip().splitlines()[-1]
        runs[name] = (pd.read_csv(tmp_path / name / RUN_FILES["lore"]),
                      json.loads((tmp_path / name / meta_name(RUN_FILES["lore"])).read_text()))
    (bounded, meta), (full, full_meta), (_, best) = runs["bounded"], runs["full"], runs["best"]
    assert best["truncated"] is True and best["search"]["order"] == "best-first" and 0 < best["explored"] < 1
    double = best["search"]["double_budget"]
    assert double["max_nodes"] == 80 and double["nodes"] <= 80 and "at 80 nodes" in lines["best"]
    assert f"explored {best['search']['explored_nodes']} of {best['search']['known_nodes']}" in lines["best"]
    assert full_meta["explored"] == 1.0 and "explored" not in lines["full"]
    bad = subprocess.run(_setup(tmp_path / "bad", "hoeffding") + ["--report-double"], capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode != 0 and "--report-double" in bad.stderr and "--max-nodes" in bad.stderr
    assert meta["nodes"] == 40 and meta["truncated"] is True and meta["settings"]["max_nodes"] == 40
    assert meta["exact_below_eps"] == meta["search"]["exact_below_eps"] >= 0.0
    assert full_meta["truncated"] is False and full_meta["nodes"] > 40
    for eps in full["eps"]:
        assert lore_bound_at(bounded, eps) <= lore_bound_at(full, eps)


class _Payload:
    """A pickle that runs a shell command when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _kill_and_resume_file(tmp_path, lives=5):
    """A toy search killed after ``lives`` smoothing calls: its resume file and the run's arguments."""
    net_kw, sm_args, kw = _case("toy")
    resume = tmp_path / "lore.resume"
    dying = _lore(_smoothed(net_kw, sm_args, seed=2, lives=lives), **kw)
    with pytest.raises(Killed):
        dying.certify(resume=Resume(resume, 0.0), progress=False)
    return resume, lambda: _lore(_smoothed(net_kw, sm_args, seed=2), **kw)


def test_a_planted_pickle_runs_nothing_and_is_ignored(tmp_path, capsys):
    """The resume file is data: a pickle whose unpickling runs os.system is never unpickled; the search
    notes it on stderr and starts afresh, with the uninterrupted result."""
    import pickle

    _, make = _kill_and_resume_file(tmp_path)
    clean_table, _ = make().certify(progress=False)
    marker = tmp_path / "pwned"
    resume = tmp_path / "planted.resume"
    resume.write_bytes(pickle.dumps({"key": None, "x": _Payload(marker)}))
    table, info = make().certify(resume=Resume(resume, 1e9), progress=False)
    assert not marker.exists() and info["resumed"] is False
    assert "ignoring the resume file" in capsys.readouterr().err
    assert table.equals(clean_table) and not resume.exists()


@pytest.mark.parametrize("tamper", ["bytes", "truncated", "node_J", "path_actions", "memo_radii", "object"])
def test_a_damaged_or_hostile_resume_file_is_ignored(tmp_path, capsys, tamper):
    """Whatever the bytes — random, cut short, an array changed so that the environment does not replay the
    saved nodes, certificates of another shape, an object array (a pickle inside the .npz) — the file is
    ignored with a line on stderr and the result is the uninterrupted one."""
    import numpy as np

    resume, make = _kill_and_resume_file(tmp_path)
    clean_table, _ = make().certify(progress=False)
    data = resume.read_bytes()
    if tamper == "bytes":
        resume.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif tamper == "truncated":
        resume.write_bytes(data[: len(data) // 2])
    else:
        with np.load(resume, allow_pickle=False) as z:
            f = {k: z[k] for k in z.files}
        if tamper == "node_J":
            f["node_J"] = f["node_J"] + 1.0
        elif tamper == "path_actions":
            f["path_actions"] = (f["path_actions"] + 1) % 3
        elif tamper == "memo_radii":
            f["memo_radii"] = f["memo_radii"][:, :2]
        else:
            f["stack"] = np.array([_Payload(tmp_path / "pwned")], dtype=object)
        with open(resume, "wb") as out:
            np.savez(out, **f)
    table, info = make().certify(resume=Resume(resume, 1e9), progress=False)
    assert info["resumed"] is False and "ignoring the resume file" in capsys.readouterr().err
    assert table.equals(clean_table) and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("order,double,lives", [("depth-first", False, 2), ("best-first", False, 2),
                                               ("best-first", False, 5), ("best-first", True, 2),
                                               ("best-first", True, 6), ("depth-first", True, 10)])
def test_a_bounded_search_resumes_byte_identically_and_its_budget_keys_the_file(tmp_path, order, double, lives):
    """max_nodes, in either order, with or without the bound at twice the budget: a killed bounded search
    resumes to the uninterrupted bounded result (truncated), its record included; a resume file written under
    another budget belongs to another run and is ignored."""
    net_kw, sm_args, kw = _case("toy")
    kw = {**kw, "max_nodes": 20, "reward_min": 0.0, "order": order, "report_double": double, "batch": 2}
    clean, clean_info = _run(_smoothed(net_kw, sm_args, seed=7), None, 60.0, **kw)
    assert clean_info["truncated"] is True and clean_info["nodes"] == 20
    assert (clean_info["double_budget"] is not None) == double
    volatile = ("resumed", "runtime_s", "nodes_per_s")
    for budget, resumed in ((21, False), (20, True)):
        resume = tmp_path / f"lore-{budget}.resume"
        with pytest.raises(Killed):
            _run(_smoothed(net_kw, sm_args, seed=7, lives=lives), resume, 0.0, **kw)
        table, info = _run(_smoothed(net_kw, sm_args, seed=7), resume, 1e9,
                           **{**kw, "max_nodes": budget})
        assert info["resumed"] is resumed
        if resumed:
            assert table == clean and info["truncated"] is True
            assert {k: v for k, v in info.items() if k not in volatile} == \
                {k: v for k, v in clean_info.items() if k not in volatile}


class _FlatLinear(__import__("torch").nn.Module):
    """A random linear Q-network on the flattened observation (any shape)."""

    def __init__(self, n_in, n_out, seed):
        import torch

        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(n_in, n_out)

    def forward(self, x):
        return self.lin(x.flatten(1))


@pytest.mark.slow
@pytest.mark.parametrize("order", ["best-first", "depth-first"])
@pytest.mark.parametrize("env,n_in,n_actions,sigma", [("highway-fast-v0", 25, 5, 0.5),
                                                      ("PongNoFrameskip-v4", 4 * 84 * 84, 6, 0.5)])
def test_highway_and_atari_replay_their_resumed_nodes(tmp_path, env, n_in, n_actions, sigma, order):
    """The resume file stores action paths, not snapshots: highway-env and ALE replay them from the seeded
    reset exactly (each node's return and observation digest checked), so a search killed mid-way resumes to
    the uninterrupted result, byte for byte (bounded, so that it stays small)."""
    def smoother(cls=SmoothedNetwork, **kw):
        return cls(_FlatLinear(n_in, n_actions, 4), SmoothingSettings(sigma, 64, -2.0, 2.0, 0.05, seed=3), n_actions,
                   **kw)

    kw = dict(env_id=env, horizon=6, env_seed=11, batch=2, max_nodes=60, reward_min=0.0,
              reward_fn=lambda r: max(float(r), 0.0), order=order)
    clean, clean_info = _run(smoother(), None, 60.0, **kw)
    resume = tmp_path / "lore.resume"
    with pytest.raises(Killed):   # killed half-way through its smoothing calls
        _run(smoother(DyingSmoother, lives=clean_info["smoothing_calls"] // 2), resume, 0.0, **kw)
    resumed, info = _run(smoother(), resume, 1e9, **kw)
    assert info["resumed"] is True and resumed == clean and info["nodes"] == clean_info["nodes"] > 10
    assert info["smoothing_calls"] > clean_info["smoothing_calls"] // 2 >= 1, "smoothed on both sides of the kill"


@pytest.mark.parametrize("change", ["network", "profile", "reward", "run_key"])
def test_a_resume_file_of_another_network_profile_or_reward_is_ignored(tmp_path, capsys, change):
    """The key holds the network (a digest of its parameters), the preprocessing profile, the reward
    modification and the caller's run key (the stage's checkpoint sha256): with the target ``probs`` every
    network shares the range [0, 1], yet a file left by network A never resumes network B's search — B's
    result is its uninterrupted one, not A's tree and certificates."""
    sm_args = (0.3, 2000, 0.0, 1.0, 0.05, 3)
    net_a = dict(n_in=2, n_out=3, hidden=(16,), seed=3, scale=3.0)
    base = dict(env_id="toy", horizon=8, env_seed=0, make=lambda: ToyWalk(signed=False), gamma=0.9,
                reward_fn=lambda r: r, run_key={"checkpoint_sha256": "a"})
    other = {"network": ({**net_a, "seed": 11}, {}), "profile": (net_a, {"profile": "vector"}),
             "reward": (net_a, {"reward_fn": lambda r: max(r, 0.1)}),
             "run_key": (net_a, {"run_key": {"checkpoint_sha256": "b"}})}[change]
    resume = tmp_path / "lore.resume"
    dying = _lore(_smoothed(net_a, sm_args, seed=2, lives=6, target="probs"), **base)
    with pytest.raises(Killed):
        dying.certify(resume=Resume(resume, 0.0), progress=False)

    def make():
        return _lore(_smoothed(other[0], sm_args, seed=2, target="probs"),
                    **{**base, **other[1]})

    clean, _ = make().certify(progress=False)
    table, info = make().certify(resume=Resume(resume, 1e9), progress=False)
    assert info["resumed"] is False and "belongs to another run" in capsys.readouterr().err
    assert table.equals(clean)


def _rewrite(resume, change):
    """Rewrite the resume file's arrays (and header) through ``change(f, header)``, saved as save() does."""
    import io

    import numpy as np

    with np.load(resume, allow_pickle=False) as z:
        f = {k: z[k] for k in z.files}
    header = json.loads(bytes(f["header"]).decode())
    change(f, header)
    f["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **f)
    resume.write_bytes(buf.getvalue())


def _field(name, value):
    def change(f, header):
        header[name] = value
    return change


@pytest.mark.parametrize("change", [_field("tie", "oops"), _field("calls", 1.5), _field("J", None),
                                    _field("rounding", {"bit_generator": "PCG64", "state": "x"}),
                                    lambda f, h: f.update(generator=f["generator"][:-3])])
def test_a_rejected_file_leaves_the_noise_state_untouched(tmp_path, capsys, change):
    """One bad field, wherever it is (a header count, the rounding stream's state, the noise generator's
    bytes): the file is ignored and the fresh run is byte-identical to an uninterrupted one — the smoother's
    random state is not set from a file that is then rejected."""
    resume, make = _kill_and_resume_file(tmp_path, lives=6)
    _rewrite(resume, change)
    clean, _ = make().certify(progress=False)
    search = make()
    table, info = search.certify(resume=Resume(resume, 1e9), progress=False)
    assert info["resumed"] is False and "ignoring the resume file" in capsys.readouterr().err
    assert table.equals(clean)


def _negative_stack(f, h):
    f["stack"] = f["stack"] - len(f["node_J"])  # a negative index would wrap to a node of the list


def _other_radius(f, h):
    f["queue_r"] = f["queue_r"] * 0.5


def _repeated_tie(f, h):
    f["queue_tie"] = f["queue_tie"].copy()
    f["queue_tie"][-1] = f["queue_tie"][0]


def _alpha_dropped(f, h):
    h["alphas"] = h["alphas"][:-1]


def _eps_below_pairs(f, h):
    h["pairs"] = h["pairs"] + [[h["eps"] + 1.0, 0.0]]


def _forged_ends(f, h):
    import numpy as np

    f["path_ends"] = np.array([len(f["path_actions"]) + 5] * len(f["path_ends"]), np.int64)


@pytest.mark.parametrize("change", [_negative_stack, _other_radius, _repeated_tie, _alpha_dropped, _eps_below_pairs,
                                    _forged_ends])
def test_an_inconsistent_resume_file_is_ignored(tmp_path, capsys, change):
    """The saved state must be a search's: stack and queue indices in range (no negative wrap), one alpha per
    memoised state, each queued radius its node's certificate's, unique ties, the current eps at or above the
    last recorded pair's, path ends in order and in range; a file failing any is ignored with one line."""
    resume, make = _kill_and_resume_file(tmp_path, lives=6)
    _rewrite(resume, lambda f, h: None)
    assert make().load(resume, _root(make)) is True  # the rewrite alone keeps the file valid
    _rewrite(resume, change)
    clean, _ = make().certify(progress=False)
    table, info = make().certify(resume=Resume(resume, 1e9), progress=False)
    err = capsys.readouterr().err
    assert info["resumed"] is False and err.count("ignoring the resume file") == 1 and table.equals(clean)


def _nan_radius(f, h):
    f["memo_radii"] = f["memo_radii"].copy()
    f["memo_radii"][0, 0] = float("nan")


def _negative_eps(f, h):
    f["memo_eps"] = f["memo_eps"] - 1.0


def _nan_lower(f, h):
    f["memo_lower"] = f["memo_lower"] * float("nan")


@pytest.mark.parametrize("how", ["dev_zero", "fifo", "oversized", _nan_radius, _negative_eps, _nan_lower,
                                 _field("J", -float("inf")), _field("eps", -0.5)])
def test_a_resume_file_that_is_no_regular_file_or_holds_impossible_numbers_is_ignored(tmp_path, capsys, how):
    """A symbolic link to /dev/zero (a zip reader would read it to the end of memory), a FIFO (opening it would
    wait), a file over the largest file the search's budget allows, a NaN radius or lower bound, a negative ε,
    a return J of -inf: one line on stderr, the search starts afresh, and its result is the uninterrupted one."""
    resume, make = _kill_and_resume_file(tmp_path, lives=6)
    if how == "dev_zero":
        resume.unlink()
        resume.symlink_to("/dev/zero")
    elif how == "fifo":
        resume.unlink()
        os.mkfifo(resume)
    elif how == "oversized":
        from crop.certify.lore_resume import largest_file

        most = largest_file(make(), _root(make))   # the toy's tree: Σ_{d≤8} 3^d nodes, 12 MB
        assert resume.stat().st_size < most < 2**25
        with open(resume, "ab") as out:
            out.truncate(int(most) + 1)
    else:
        _rewrite(resume, how)
    clean, _ = make().certify(progress=False)
    table, info = make().certify(resume=Resume(resume, 1e9), progress=False)
    err = capsys.readouterr().err
    assert info["resumed"] is False and err.count("ignoring the resume file") == 1, err[-600:]
    assert table.equals(clean)


def _root(make):
    """The root node of the search ``make()`` builds (what certify() passes to load())."""
    from crop.certify.lore import _Node
    from crop.envs import snapshot, to_obs

    search = make()
    env = search.make()
    obs, _ = env.reset(seed=search.problem.env_seed)
    return _Node(snapshot(env), to_obs(obs), 0, 0.0, False)


def test_a_small_file_cannot_take_more_memory_than_its_size(tmp_path, capsys):
    """A resume file whose entry inflates to far more than the file (a zip bomb), or that has an unknown
    member: refused from the zip directory, before anything is inflated or read."""
    import tracemalloc
    import zipfile

    from numpy.lib import format as npf

    resume, make = _kill_and_resume_file(tmp_path, lives=3)
    bomb = tmp_path / "bomb.resume"
    n = 200 * 2**20
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("header.npy", "w", force_zip64=True) as f:
            npf.write_array_header_2_0(f, {"descr": "|u1", "fortran_order": False, "shape": (n,)})
            for _ in range(n // 2**20):
                f.write(b"\0" * 2**20)
    assert bomb.stat().st_size < 2**20
    tracemalloc.start()
    try:
        assert make().load(bomb, _root(make)) is False
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, peak
    with zipfile.ZipFile(resume, "a") as z:
        z.writestr("extra.npy", b"")
    assert make().load(resume, _root(make)) is False
    assert capsys.readouterr().err.count("ignoring the resume file") == 2


@pytest.mark.slow
def test_the_resume_file_outlives_a_failed_write_of_the_outputs(tmp_path, monkeypatch):
    """The stage deletes the resume file only once lore.csv and its meta are written: a failure (or a kill)
    between the end of the search and the outputs leaves it for the rerun, which resumes and then removes it."""
    import crop.handlers.stages
    from crop.__main__ import main
    from crop.io import OutputError

    d = tmp_path / "run"
    argv = _setup(d, "hoeffding")[3:]
    argv[argv.index("--horizon") + 1] = "6"
    argv[argv.index("--checkpoint-every") + 1] = "1e-9"
    resume = d / f"{RUN_FILES['lore']}.resume"

    def full_disk(self, info, **outputs):
        raise OutputError(28, f"cannot write {d / RUN_FILES['lore']}: No space left on device")

    with monkeypatch.context() as m:
        m.setattr(crop.handlers.stages.StageRun, "write", full_disk)
        with pytest.raises(SystemExit):
            main(argv)
    assert resume.exists() and not (d / RUN_FILES["lore"]).exists()
    main(argv)
    meta = json.loads((d / meta_name(RUN_FILES["lore"])).read_text())
    assert (d / RUN_FILES["lore"]).exists() and meta["search"]["resumed"] is True and not resume.exists()


def test_every_setting_is_in_the_resume_key(tmp_path):
    """The resume key is derived from the environment (id, profile, factory) and every field of LoRe's settings
    (crop.certify.lore.LoReSettings): changing any one changes it and a resume file written under the other
    settings is refused before anything of it is used; a field added to the settings joins the key without a
    word more; the unchanged settings resume."""
    from dataclasses import field, fields, make_dataclass, replace

    from crop.certify.lore import LoReSettings, Problem, Search

    net_kw, sm_args, kw = _case("toy")
    resume = tmp_path / "lore.resume"
    dying = _lore(_smoothed(net_kw, sm_args, seed=2, lives=5), **kw)
    with pytest.raises(Killed):
        dying.certify(resume=Resume(resume, 0.0), progress=False)
    base = dying.settings
    environment = {"env_id": "toy2", "profile": "vector", "make": lambda: ToyWalk(signed=True)}
    for name, value in environment.items():
        where = {"env_id": dying.env_id, "profile": dying.profile, "make": dying.make, name: value}
        search = LoRe(where["env_id"], _smoothed(net_kw, sm_args, seed=2), base, profile=where["profile"],
                      make=where["make"])
        assert search.key() != dying.key() and search.load(resume, None) is False, name
    other = {"horizon": 9, "env_seed": 1, "gamma": 0.8, "reward_fn": lambda r: max(r, 0.0), "reward_key": "clip",
             "eps_max": 1.0, "prune": False, "alpha_of": lambda i: 0.01 / i ** 2, "batch": 3,
             "max_nodes": 50, "reward_min": -1.0, "order": "depth-first", "report_double": True,
             "run_key": {"checkpoint_sha256": "0" * 64}}
    names = {f.name for f in fields(Problem)} | {f.name for f in fields(Search)} | {"run_key"}
    assert set(other) == names, "a new setting needs a changed value here"
    for name, value in other.items():
        if name == "run_key":
            changed = replace(base, run_key=value)
        elif name in Problem.__dataclass_fields__:
            changed = replace(base, problem=replace(base.problem, **{name: value}))
        else:
            extra = {"max_nodes": {"reward_min": -1.0}, "report_double": {"max_nodes": 50, "reward_min": -1.0}}.get(
                name, {})
            changed = replace(base, search=replace(base.search, **{name: value}, **extra))
        search = LoRe(dying.env_id, _smoothed(net_kw, sm_args, seed=2), changed, make=dying.make)
        assert search.key() != dying.key() and search.load(resume, None) is False, name
    # a field added to the settings is in the key
    Wider = make_dataclass("Wider", [("new_option", int, field(default=0))], bases=(Search,), frozen=True)
    wide = LoReSettings(base.problem, Wider(**{f.name: getattr(base.search, f.name) for f in fields(Search)}))
    assert wide.key()["search"]["new_option"] == 0 and wide.key() != base.key()
    assert replace(wide, search=replace(wide.search, new_option=1)).key() != wide.key()
    # so is every field of the smoother's settings (crop.smoothing.smoothed.SmoothingSettings)
    sm_other = {"sigma": 0.2, "m": 123, "v_min": -5.0, "v_max": 5.0, "alpha": 0.01, "bound": "betting",
                "target": "vote", "chunk": 7, "seed": 3, "device": None}
    assert set(sm_other) == {f.name for f in fields(SmoothingSettings)}, "a new setting needs a changed value here"
    for name, value in sm_other.items():
        if name == "device":   # no second device here: the key holds the device as the smoother resolved it
            assert dying.key()["smoothing"]["device"] == "cpu"
            continue
        changed = {name: value, **({"v_min": 0.0, "v_max": 1.0} if name == "target" else {})}
        search = LoRe(dying.env_id, _smoothed(net_kw, sm_args, **{"seed": 2, **changed}), base, make=dying.make)
        assert search.key() != dying.key() and search.load(resume, None) is False, name
    again = LoRe(dying.env_id, _smoothed(net_kw, sm_args, seed=2), base, make=dying.make)
    assert again.certify(resume=Resume(resume, 1e9), progress=False)[1]["resumed"] is True


def test_lore_functions_take_at_most_eight_parameters():
    """crop/certify/lore.py and lore_resume.py: every function at most 8 parameters (self, *args and **options
    counted), every class at most 8 fields — settings are grouped (Problem, Search), not passed one by one."""
    import ast

    import crop.certify.lore
    import crop.certify.lore_resume

    trees = [ast.parse(Path(m.__file__).read_text()) for m in (crop.certify.lore, crop.certify.lore_resume)]
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            assert n <= 8, (node.name, n)
        elif isinstance(node, ast.ClassDef):
            n = sum(isinstance(s, ast.AnnAssign) for s in node.body)
            assert n <= 8, (node.name, n)

