#!/usr/bin/env python3
"""test_exports: libbrigade.so exports exactly the public API.

Lists the dynamic symbols libbrigade.so defines (`nm -D --defined-only`) and
reads the functions include/brigade/*.h declare (prototypes at the start of a
line, comments removed; static inline helpers, typedefs and macros are not
symbols). Fails on:
  - an exported symbol no public header declares (an internal helper that
    leaked: make it static, name it bg__..., or declare it in a private header);
  - a declared function the library does not export (a prototype without a
    definition, or one the version script left out);
  - any exported data object (the API is functions only).
Counts are printed: public functions, exported symbols.

This reading of the headers is independent of the one that writes the
version script (cmake/exports.cmake, in CMake's regular expressions): the two
agreeing is part of the check. A self-check first feeds the comparison a
made-up export list with one leak and one gap, and fails if either goes
unreported.

Environment: BRIGADE_SOURCE_DIR, BRIGADE_BINARY_DIR, BG_NM (set by CTest).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

PROTOTYPE = re.compile(r"^(?!typedef\b|static\b)[A-Za-z_][\w \t*]*?[\s*](bg_[a-z]\w*)\s*\(", re.M)


def declared(src):
    """bg_ functions the public headers declare, with the header of each."""
    names = {}
    for path in sorted(glob.glob(os.path.join(src, "include", "brigade", "*.h"))):
        text = re.sub(r"/\*.*?\*/", " ", open(path, encoding="utf-8").read(), flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        for n in PROTOTYPE.findall(text):
            names.setdefault(n, os.path.basename(path))
    return names


def exported(lib, nm):
    """{name: nm type letter} of the symbols lib defines in its dynamic table."""
    r = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {nm} -D --defined-only {lib}: {r.stderr.strip()}")
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[re.sub(r"@.*", "", parts[2])] = parts[1]
    return out


def compare(decl, exp):
    """Failure messages (empty: they agree)."""
    fails = []
    leaked = sorted(n for n in exp if n not in decl)
    if leaked:
        fails.append(f"libbrigade.so exports {len(leaked)} symbol(s) no public header declares: "
                     f"{', '.join(leaked)}")
    missing = sorted(n for n in decl if n not in exp)
    if missing:
        fails.append(f"{len(missing)} function(s) of the public headers are not exported: "
                     + ", ".join(f"{n} ({decl[n]})" for n in missing))
    data = sorted(n for n, t in exp.items() if t not in "Ti" and n in decl)
    if data:
        fails.append(f"exported data objects (the API is functions only): {', '.join(data)}")
    return fails


def self_check():
    decl = {"bg_a": "a.h", "bg_b": "a.h"}
    fails = compare(decl, {"bg_a": "T", "bg__leak": "T"})
    if len(fails) != 2 or "bg__leak" not in fails[0] or "bg_b" not in fails[1]:
        print(f"FAIL: the comparison missed a made-up leak or gap: {fails}")
        return False
    if compare(decl, {"bg_a": "T", "bg_b": "T"}):
        print("FAIL: the comparison failed two equal sets")
        return False
    return True


def main():
    src = os.environ.get("BRIGADE_SOURCE_DIR") or os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    binary = os.environ.get("BRIGADE_BINARY_DIR", "")
    nm = os.environ.get("BG_NM") or shutil.which("nm")
    lib = os.path.join(binary, "libbrigade.so")
    if not self_check():
        return 1
    if not nm or not os.path.exists(lib):
        print(f"FAIL: need nm ({nm}) and {lib}")
        return 1
    decl = declared(src)
    exp = exported(lib, nm)
    fails = compare(decl, exp)
    for f in fails:
        print("FAIL: " + f)
    print(f"exports: {len(decl)} public functions in include/brigade/*.h, {len(exp)} symbols exported by "
          f"libbrigade.so" + (": FAILED" if fails else ": ok"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
