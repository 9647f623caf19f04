#!/usr/bin/env python3
"""A test double for `apptainer`, for CI only (Apptainer cannot be installed there): runs the
`apptainer exec` calls that `snakemake --sdm apptainer` makes through podman, in the image that
ci/container-build.sh built from containers/crop.def.  tests/test_hpc.py puts it on PATH as `apptainer`.

    CROP_PODMAN_IMAGE   the podman image that stands in for the .sif the Snakefile names (required)
    CROP_APPTAINER_LOG  a file to which every exec call is appended as one JSON line (optional)

It mimics what Apptainer does by default: the calling user (root in CI), the host environment passed in
(less PATH, LD_LIBRARY_PATH and the Python variables of the host's virtual environment, which are the
image's own business), --home, the current folder and /tmp bound and the working folder kept.  Unlike
Apptainer it gives the container no network (--network=none).  Only the options Snakemake passes are
understood; anything else is refused, so that a change on Snakemake's side shows up here.
"""
import json
import os
import subprocess
import sys

VALUE_OPTIONS = {"--home", "--bind", "-B", "--pwd"}
FLAG_OPTIONS = {"--nv", "--cleanenv", "-e", "--quiet", "-q", "--silent", "-s"}
NOT_PASSED = {"PATH", "LD_LIBRARY_PATH", "PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV", "HOME"}


def main(argv: list[str]) -> int:
    i = 0
    while i < len(argv) and argv[i] in FLAG_OPTIONS:  # global options, e.g. --quiet --silent
        i += 1
    if argv[i:i + 1] in (["--version"], ["version"]):
        print("apptainer version 1.3.6")  # Snakemake parses the last word
        return 0
    if argv[i:i + 1] != ["exec"]:
        sys.exit(f"apptainer (podman test double): only 'exec' and '--version' are supported: {argv}")
    args, i = argv[i + 1:], 0
    opts: dict[str, list[str]] = {}
    while i < len(args) and args[i].startswith("-"):
        name, _, value = args[i].partition("=")
        if name in VALUE_OPTIONS:
            if not value:
                i += 1
                value = args[i]
            opts.setdefault(name.replace("-B", "--bind"), []).append(value)
        elif name not in FLAG_OPTIONS:
            sys.exit(f"apptainer (podman test double): option {name} is not supported")
        else:
            opts.setdefault(name, []).append("")
        i += 1
    image, command = args[i], args[i + 1:]

    cwd = os.getcwd()
    home = opts.get("--home", [cwd])[-1].split(":")[0]
    workdir = opts.get("--pwd", [cwd])[-1]
    mounts = {cwd: cwd, home: home, "/tmp": "/tmp"}
    for spec in opts.get("--bind", []):
        for one in spec.split(","):
            src, _, dst = one.partition(":")
            mounts[src] = dst.split(":")[0] or src
    env = {} if "--cleanenv" in opts else {k: v for k, v in os.environ.items()
                                           if k not in NOT_PASSED and not k.startswith(("CROP_", "PIP_"))}
    for k, v in os.environ.items():
        for prefix in ("APPTAINERENV_", "SINGULARITYENV_"):
            if k.startswith(prefix):
                env[k[len(prefix):]] = v
    env["HOME"] = home

    cmd = ["podman", "run", "--rm", "--network=none", "--workdir", workdir]
    for src, dst in mounts.items():
        cmd += ["--volume", f"{src}:{dst}"]
    for k, v in sorted(env.items()):
        cmd += ["--env", f"{k}={v}"]
    cmd += [os.environ["CROP_PODMAN_IMAGE"], *command]
    if os.environ.get("CROP_APPTAINER_LOG"):
        with open(os.environ["CROP_APPTAINER_LOG"], "a") as log:
            log.write(json.dumps({"image": image, "command": command, "cwd": cwd, "workdir": workdir}) + "\n")
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
