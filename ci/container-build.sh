#!/usr/bin/env bash
# Build the steps of containers/crop.def (%files, %post with containers/install.sh, %environment) into a
# podman image, for CI (tests/test_hpc.py): Apptainer cannot be installed there, podman can.
#
#   ci/container-build.sh WORKDIR TAG
#
# Offline except for two downloads on the host: the base, a Debian 12 (bookworm, as the definition
# file's debian:12.x-slim) bootstrapped with debootstrap from CROP_DEBIAN_MIRROR (default
# deb.debian.org) with python3 and python3-venv, and a wheelhouse that the host's pip fills with the
# package's pinned dependencies (so its configuration decides which torch build: CI takes the CPU wheel).
# The build itself runs with --network=none, pip reading the wheelhouse only.
#
# podman runs with runc (crun fails in this sandbox), the ulimits the sandbox allows, and its own storage
# under WORKDIR: export CONTAINERS_CONF=WORKDIR/containers.conf CONTAINERS_STORAGE_CONF=WORKDIR/storage.conf
# to use the image; remove it with `podman rmi -af` (same variables), then rm -rf WORKDIR.
set -euo pipefail

work=${1:?usage: ci/container-build.sh WORKDIR TAG}
tag=${2:?usage: ci/container-build.sh WORKDIR TAG}
repo=$(cd "$(dirname "$0")/.." && pwd)
mirror=${CROP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=localhost/crop-base:bookworm
python=${PYTHON:-python3}

[[ $(id -u) == 0 ]] || { echo "container-build: needs root (debootstrap, rootful podman)" >&2; exit 1; }
mkdir -p "$work"
work=$(cd "$work" && pwd)
nofile=$(ulimit -Hn)
[[ $nofile == unlimited ]] && nofile=1048576
cat >"$work/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
cat >"$work/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$work/run"
CONF
export CONTAINERS_CONF=$work/containers.conf CONTAINERS_STORAGE_CONF=$work/storage.conf

t0=$SECONDS
if ! podman image exists "$base"; then
    rm -rf "$work/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/rootfs" \
        "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
    tar -C "$work/rootfs" -c . | podman import --quiet - "$base" >/dev/null
    rm -rf "$work/rootfs"
fi
echo "container-build: base $base ready ($((SECONDS - t0)) s)"

t0=$SECONDS
"$python" -m pip download --dest "$work/wheelhouse" "$repo" setuptools >"$work/pip-download.log" 2>&1 \
    || { tail -n 20 "$work/pip-download.log" >&2; exit 1; }
printf '[global]\nno-index = true\nfind-links = /wheels\n' >"$work/pip.conf"
echo "container-build: wheelhouse ready ($((SECONDS - t0)) s)"

t0=$SECONDS
rm -rf "$work/context"
(cd "$repo" && "$python" ci/def2containerfile.py containers/crop.def --from "$base" --context "$work/context")
podman build --network=none --volume "$work/wheelhouse:/wheels:ro" \
    --volume "$work/pip.conf:/etc/pip.conf:ro" --tag "$tag" "$work/context" >"$work/build.log" 2>&1 \
    || { tail -n 30 "$work/build.log" >&2; exit 1; }
echo "container-build: image $tag built from containers/crop.def ($((SECONDS - t0)) s)"
