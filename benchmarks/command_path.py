"""The files of ``crop/`` one ``crop`` command runs functions in, from its argv to its result: how far a reader
follows one certificate (docs/layout.md, "One certificate's path").

    python benchmarks/command_path.py loact --env CartPole-v0 --algo StdTrain --sigma 0.01 \\
        --checkpoint DIR/model.pt --qrange DIR/qrange.json --m 200 --episodes 1 --horizon 20 --no-progress \\
        --out /tmp/loact.csv

Python's profile hook records every call of a function defined under ``crop/``, from the import of ``crop`` on;
module and class bodies are not counted (the functions they call are).  Prints the count of files and of
functions, then each file with the functions of it that ran.
"""
from __future__ import annotations

import collections
import inspect
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1] / "crop") + "/"


def trace(argv: list[str]) -> dict[str, set[str]]:
    """``{file under crop/: names of its functions that ran}`` while ``crop ARGV`` runs."""
    ran = collections.defaultdict(set)

    def hook(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(ROOT) and code.co_flags & inspect.CO_NEWLOCALS:
            ran[code.co_filename[len(ROOT):]].add(code.co_name)

    sys.setprofile(hook)   # before crop is imported: what runs when a module is imported runs for the command
    try:
        from crop.__main__ import main

        main(argv)
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    return ran


if __name__ == "__main__":
    files = trace(sys.argv[1:])
    print(f"{len(files)} files, {sum(map(len, files.values()))} functions")
    for name in sorted(files):
        print(f"  {name}: {', '.join(sorted(files[name]))}")
