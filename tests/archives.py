"""Archives a publisher might serve, for the fetch tests: a tarball of given members and a small network's
state dict as bytes."""
import io
import tarfile

import torch


def tar_archive(path, members):
    """A gzip tarball at ``path`` of ``members``: a list of (TarInfo fields, bytes | None)."""
    with tarfile.open(path, "w:gz") as tf:
        for kw, data in members:
            kw = dict(kw)
            ti = tarfile.TarInfo(kw.pop("name"))
            for k, v in kw.items():
                setattr(ti, k, v)
            if data is not None:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                tf.addfile(ti)
    return path


def state_bytes(seed=0):
    """The bytes of a 4 → 2 linear network's state dict, its weights drawn with ``seed``."""
    torch.manual_seed(seed)
    buf = io.BytesIO()
    torch.save({"0.weight": torch.randn(2, 4), "0.bias": torch.zeros(2)}, buf)
    return buf.getvalue()
