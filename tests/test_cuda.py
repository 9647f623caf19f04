"""The CUDA-only paths of the engine (smoothing.engine), on a GPU where one is visible (skipped elsewhere; CI has none):
CUDA graphs replay the eager path byte for byte, resume through get/set_state, catch NaNs and keep results in
submission order; the space-to-depth Nature CNN smooths the same Q̃; pipelined LoAct is deterministic."""
import numpy as np
import pytest
import torch

from crop.models import build_network
from crop.smoothing.smoothed import NonFiniteOutputError, SmoothedNetwork, SmoothingSettings

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = "cuda"


def _mlp():
    torch.manual_seed(0)
    return build_network({"arch": "mlp", "in": 25, "hidden": [256, 256], "out": 5}).eval()


def _means(sm, xs):
    out = []
    for sl in (slice(0, 8), slice(0, 8), slice(2, 5), slice(0, 8), slice(1, 2)):
        out += [e.mean for e in sm.estimate_batch(xs[sl])]
    return np.array(out)


def test_graph_replay_equals_the_eager_path_and_resumes():
    xs = np.random.default_rng(0).random((8, 25), dtype=np.float32)
    graphs = SmoothedNetwork(_mlp(), SmoothingSettings(0.3, 10000, -0.1, 0.1, 0.05, seed=3, device=DEV), 5)
    eager = SmoothedNetwork(_mlp(), SmoothingSettings(0.3, 10000, -0.1, 0.1, 0.05, seed=3, device=DEV), 5)
    eager.engine.cuda_graphs = False
    a = _means(graphs, xs)
    assert len(graphs.engine._graphs) == 3
    np.testing.assert_array_equal(a, _means(eager, xs))
    assert len(np.unique(a[:, 0])) > 1, "clipping must not make every mean equal"
    state = graphs.get_state()
    first = [e.mean for e in graphs.estimate_batch(xs)]
    graphs.set_state(state)
    np.testing.assert_array_equal(first, [e.mean for e in graphs.estimate_batch(xs)])


def test_results_in_submission_order_and_nan_named_under_graphs():
    sm = SmoothedNetwork(_mlp(), SmoothingSettings(0.3, 1000, -1, 1, 0.05, seed=1, device=DEV), 5)
    xs = np.zeros((4, 25), np.float32)
    first, second = sm.submit(xs[:2]), sm.submit(xs[2:])
    with pytest.raises(RuntimeError, match="order"):
        second.result()
    first.result(), second.result()

    class NanAt(torch.nn.Module):
        def forward(self, x):
            q = torch.stack([x[:, 0], x[:, 1]], 1)
            return torch.where(x[:, :1] > 5.0, torch.full_like(q, float("nan")), q)

    sm = SmoothedNetwork(NanAt(), SmoothingSettings(0.01, 1000, -1, 1, 0.05, seed=0, device=DEV), 2)
    sm.estimate_batch(np.zeros((3, 4), np.float32))           # captures the graph for B = 3
    bad = np.zeros((3, 4), np.float32)
    bad[1, 0] = 10
    with pytest.raises(NonFiniteOutputError, match="s1"):
        sm.estimate_batch(bad, indices=["s0", "s1", "s2"])


def test_space_to_depth_cnn_smooths_the_same_q():
    torch.manual_seed(0)
    cnn = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()
    x = np.random.default_rng(1).random((2, 4, 84, 84), dtype=np.float32)
    s2d = SmoothedNetwork(cnn, SmoothingSettings(0.5, 10000, -0.03, 0.03, 0.05, seed=1, device=DEV), 6)
    plain = SmoothedNetwork(cnn, SmoothingSettings(0.5, 10000, -0.03, 0.03, 0.05, seed=2, device=DEV), 6)
    plain.engine.space_to_depth = False
    a = np.array([e.mean for e in s2d.estimate_batch(x)])
    b = np.array([e.mean for e in plain.estimate_batch(x)])
    assert s2d.engine._s2d == 4 and plain.engine._s2d == 1
    # independent estimates of the same Q̃: the difference is within a few standard errors (range/√m bounds one)
    assert np.abs(a - b).max() < 5 * np.sqrt(2) * 0.06 / np.sqrt(10000)


def test_pipelined_loact_is_deterministic():
    from crop.certify.loact import LoActSettings, run_loact

    torch.manual_seed(0)
    cnn = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()

    def run():
        sm = SmoothedNetwork(cnn, SmoothingSettings(0.1, 1000, -10, 10, 0.05, seed=4, device=DEV), 6)
        return run_loact("PongNoFrameskip-v4", sm, LoActSettings(4, 12, [0, 1, 2, 3]), progress=False)[0]

    a, b = run(), run()
    assert len(a) == 48
    assert a.equals(b)


@pytest.mark.parametrize("target", ["probs", "vote"])
def test_graph_replay_equals_the_eager_path_for_the_targets_in_zero_one(target):
    """The graph applies the target (softmax, one-hot of the greedy action) as the eager path does."""
    xs = np.random.default_rng(1).random((8, 25), dtype=np.float32)
    graphs = SmoothedNetwork(_mlp(), SmoothingSettings(0.3, 10000, 0.0, 1.0, 0.05, seed=3, device=DEV, target=target),
                             5)
    eager = SmoothedNetwork(_mlp(), SmoothingSettings(0.3, 10000, 0.0, 1.0, 0.05, seed=3, device=DEV, target=target), 5)
    eager.engine.cuda_graphs = False
    a = _means(graphs, xs)
    assert len(graphs.engine._graphs) == 3
    np.testing.assert_array_equal(a, _means(eager, xs))
    np.testing.assert_allclose(a.sum(1), 1.0, atol=1e-6)
    assert a.min() >= 0.0 and a.max() <= 1.0
