"""Seeded random Q-networks, for tests and for the module-level helpers that build checkpoints from them."""
import torch


def random_mlp(n_in=4, n_out=2, hidden=(16, 16), seed=0, scale=1.0):
    """An MLP Q-network with torch's default initialisation under ``seed``, its weights multiplied by ``scale``."""
    from crop.models import build_network  # after conftest has put the checkout first on sys.path

    torch.manual_seed(seed)
    net = build_network({"arch": "mlp", "in": n_in, "hidden": list(hidden), "out": n_out})
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(scale)
    return net.eval()
