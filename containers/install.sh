#!/bin/sh
# Install the crop package, with exactly the dependencies pinned in its pyproject.toml, into a virtual
# environment: the one recipe of the container image.  Called by containers/crop.def (%post) and by the
# CI test that builds the same steps with podman (ci/container-build.sh, tests/test_hpc.py).
#
#   sh containers/install.sh SRC [VENV]     SRC: a folder with pyproject.toml, README.md and crop/
#                                           VENV: where to install (default /opt/crop/venv)
#
# pip reads its usual environment: PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels installs offline from a
# wheelhouse (the CI build does so; on Linux PyPI's torch==2.13.0 is the CUDA build, which a GPU node
# wants, and a wheelhouse can hold the CPU build instead).
#
# No separate dependency list: `pip install SRC` reads the pins from pyproject.toml, so an environment
# the package gains later (highway-env, ale-py with opencv-python-headless) lands in the image with it.
# The Atari ROMs ship inside the ale-py wheel (ale-py >= 0.9): nothing to download besides pip's wheels.
set -eu

src=${1:?usage: install.sh SRC [VENV]}
venv=${2:-/opt/crop/venv}

# Python 3 with venv and pip (Debian's python3 refuses system-wide pip installs, PEP 668).  A base that
# already has them (the CI base is bootstrapped with them) skips apt.
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends python3 python3-venv ca-certificates
    rm -rf /var/lib/apt/lists/*
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --no-cache-dir --no-compile --progress-bar off "$src"

# The image works: the CLI runs, the pinned packages import, and (where ale-py is a dependency) its
# bundled Atari ROMs are there.
"$venv/bin/crop" --help >/dev/null
"$venv/bin/python" - <<'EOF'
import importlib.metadata
import importlib.util

import crop, gymnasium, numpy, scipy, torch  # noqa: F401

if importlib.util.find_spec("ale_py"):
    from ale_py import roms

    for game in ("pong", "freeway"):
        roms.get_rom_path(game)
print(f"crop {importlib.metadata.version('crop')} installed with torch {torch.__version__}")
EOF
