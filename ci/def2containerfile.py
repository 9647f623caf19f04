"""Translate an Apptainer definition file into a Containerfile with the same steps, for podman.

    python ci/def2containerfile.py containers/crop.def --from IMAGE --context DIR

Writes DIR/Containerfile and DIR/post.sh, and copies the %files sources (relative to the current
folder, as `apptainer build` reads them) into DIR.  Only the sections this project's definition file
uses are translated: %files (COPY), %post (RUN, with /bin/sh -e as Apptainer runs it), %environment
(ENV, from `export NAME=VALUE` lines) and %test (RUN, after the rest); %runscript and %labels are not
needed to run the workflow's steps.  The base (Bootstrap/From) is replaced by --from: CI cannot pull
from a registry, so it builds on a debootstrap'ed Debian of the same release instead.
"""
import argparse
import re
import shutil
from pathlib import Path

SECTION = re.compile(r"^%(\w+)\s*$")


def sections(text: str) -> dict[str, list[str]]:
    out, name = {"header": []}, "header"
    for line in text.splitlines():
        m = SECTION.match(line)
        if m:
            name = m.group(1)
            out[name] = []
        else:
            out[name].append(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("definition")
    ap.add_argument("--from", dest="base", required=True)
    ap.add_argument("--context", required=True, type=Path)
    args = ap.parse_args()

    sec = sections(Path(args.definition).read_text())
    unknown = set(sec) - {"header", "files", "post", "environment", "runscript", "test", "labels"}
    if unknown:
        raise SystemExit(f"{args.definition}: sections {sorted(unknown)} are not translated")
    ctx = args.context
    ctx.mkdir(parents=True, exist_ok=True)
    lines = [f"FROM {args.base}"]
    for line in sec.get("files", []):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        src, dst = line.split()
        if Path(src).is_dir():
            shutil.copytree(src, ctx / src, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (ctx / src).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / src)
        lines.append(f"COPY {src} {dst}")
    (ctx / "post.sh").write_text("\n".join(sec.get("post", [])) + "\n")
    lines += ["COPY post.sh /tmp/post.sh", "RUN /bin/sh -e /tmp/post.sh && rm /tmp/post.sh"]
    for line in sec.get("environment", []):
        m = re.match(r"\s*export\s+(\w+)=(.*)$", line)
        if m:
            lines.append(f"ENV {m.group(1)}={m.group(2)}")
        elif line.strip() and not line.lstrip().startswith("#"):
            raise SystemExit(f"%environment line not translated: {line!r}")
    test = [ln.strip() for ln in sec.get("test", []) if ln.strip() and not ln.lstrip().startswith("#")]
    if test:
        lines.append("RUN " + " && ".join(test))
    (ctx / "Containerfile").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
