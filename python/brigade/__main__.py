"""brigade.__main__: `python -m brigade ARGS` and the `brigade` command that
pip installs both run the brigade CLI (tools/) with ARGS: `python -m brigade
launch -n 2 -- python3 train.py`.

Owns only finding the CLI: BRIGADE (a path), else the one `pip install` put
with the package or recorded (an installed brigade's), else build/brigade of
the source tree the package sits in.
It replaces this process with the CLI (exit status and signals are the
CLI's) and must not look the name up on PATH, where it would find itself.
"""
import os
import sys

from . import _lib


def cli_path():
    cands = [os.environ.get("BRIGADE"), os.path.join(_lib.NATIVE, "bin", "brigade"), _lib.installed()[1],
             os.path.join(os.path.dirname(os.path.dirname(_lib.HERE)), "build", "brigade")]
    cands = [c for c in cands if c]
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise SystemExit("brigade: cannot find the brigade CLI; tried %s (set BRIGADE to its path)" % ", ".join(cands))


def main():
    path = cli_path()
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
