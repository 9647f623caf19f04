"""What the tests share: the repository root, random networks, an imported SAC agent, a local HTTP mirror, the
shipped cost tables (the helpers themselves: networks.py, paths.py, synthetic_results.py, toy_lore.py)."""
import functools
import http.server
import sys
import threading

import numpy as np
import pytest

from networks import random_mlp, sb3_sac
from paths import REPO

sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session")
def repo():
    """The repository's root."""
    return REPO


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def mlp_factory():
    """random_mlp(n_in, n_out, hidden, seed, scale): a seeded random Q-network."""
    return random_mlp


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """model.pt of an SB3 SAC agent for Pendulum-v1 (:func:`networks.sb3_sac`) imported by ``crop import``."""
    from crop.__main__ import main

    d = tmp_path_factory.mktemp("cont")
    src, _, _ = sb3_sac(d / "sac.zip")
    assert main(["import", "--env", "Pendulum-v1", "--algo", "SAC", "--file", str(src), "--eval-episodes", "1",
                 "--out", str(d / "model.pt")]) in (None, 0)
    return d / "model.pt"


@pytest.fixture
def no_calibration(tmp_path, monkeypatch):
    """The cost model's shipped tables, whatever this machine's calibration cache holds."""
    from crop.workflow import cost

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cost._tables.cache_clear()
    yield
    cost._tables.cache_clear()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


@pytest.fixture
def serve():
    """serve(folder) -> base URL of an HTTP server on 127.0.0.1 for that folder (stopped afterwards)."""
    servers = []

    def start(folder):
        h = functools.partial(_Quiet, directory=str(folder))
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), h)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()
