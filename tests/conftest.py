import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(REPO))


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def random_mlp(n_in=4, n_out=2, hidden=(16, 16), seed=0, scale=1.0):
    from crop.models import build_network

    torch.manual_seed(seed)
    net = build_network({"arch": "mlp", "in": n_in, "hidden": list(hidden), "out": n_out})
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(scale)
    return net.eval()


@pytest.fixture
def mlp_factory():
    return random_mlp


@pytest.fixture
def no_calibration(tmp_path, monkeypatch):
    """The cost model's shipped tables, whatever this machine's calibration cache holds."""
    from crop.workflow import cost

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cost._tables.cache_clear()
    yield
    cost._tables.cache_clear()
