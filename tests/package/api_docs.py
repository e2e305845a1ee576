#!/usr/bin/env python3
"""test_api_docs: the build's API reference (BUILD/docs/api.md, written by the
`docs` target) is what scripts/gen_api.py makes of the headers now, and it
lists every public function.

1. Runs the generator into a temporary file and compares it with the build's
   copy; a missing copy or a difference fails (the `docs` target did not run,
   or its dependencies missed a change), with the first lines of the diff.
2. Cross-checks the generator's parser with two other readings of the API:
   - every function prototype a regular expression finds at the start of a
     line of include/brigade/*.h (comments removed) has an entry;
   - every bg_ symbol exported by libbrigade.so (`nm -D`, when the library is
     built) that a public header names has an entry. bg__ symbols are
     internal; exported bg_ symbols no header names are listed, not failed.

Environment: BRIGADE_SOURCE_DIR, BRIGADE_BINARY_DIR, BG_NM (set by CTest).
Exits 1 on any failure, with a message that says what to do.
"""
import difflib
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

DIFF_LINES = 40
PROTOTYPE = re.compile(r"^(?!typedef\b)[A-Za-z_][\w \t*]*?[\s*](bg_\w+)\s*\(", re.M)


def entries(api):
    """Names that have an entry (an anchor) in the reference."""
    return set(re.findall(r'<a id="([^"]+)"></a>', api))


def header_text(src):
    """Every public header with its comments removed, joined."""
    text = ""
    for path in sorted(glob.glob(os.path.join(src, "include", "brigade", "*.h"))):
        text += re.sub(r"/\*.*?\*/", " ", open(path, encoding="utf-8").read(), flags=re.S) + "\n"
    return text


def exported(binary, nm):
    """bg_ functions and data libbrigade.so exports, or None when it cannot tell."""
    lib = os.path.join(binary, "libbrigade.so") if binary else ""
    if not lib or not os.path.exists(lib) or not nm:
        return None
    r = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"api docs: {nm} -D {lib} failed: {r.stderr.strip()}")
        return None
    return {m.group(1) for m in re.finditer(r"^\S*\s+[TDBR]\s+(bg_\w+)$", r.stdout, re.M)
            if not m.group(1).startswith("bg__")}


def main():
    src = os.environ.get("BRIGADE_SOURCE_DIR") or os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    binary = os.environ.get("BRIGADE_BINARY_DIR", "")
    nm = os.environ.get("BG_NM") or shutil.which("nm")
    built_path = os.path.join(binary, "docs", "api.md")
    failed = False

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "api.md")
        r = subprocess.run([sys.executable, os.path.join(src, "scripts", "gen_api.py"), "--source", src,
                            "--output", out], capture_output=True, text=True)
        sys.stdout.write(r.stderr)
        if r.returncode != 0:
            print(f"FAIL: scripts/gen_api.py exited with {r.returncode}")
            return 1
        fresh = open(out, encoding="utf-8").read()

    if not binary or not os.path.exists(built_path):
        print(f"FAIL: no {built_path or 'BRIGADE_BINARY_DIR/docs/api.md'}: build the docs target "
              "(cmake --build BUILD --target docs)")
        return 1
    built = open(built_path, encoding="utf-8").read()
    if built != fresh:
        failed = True
        print(f"FAIL: {built_path} is out of date: the docs target missed a change (cmake --build BUILD)")
        diff = list(difflib.unified_diff(built.split("\n"), fresh.split("\n"), "docs/api.md (built)",
                                         "docs/api.md (from the headers)", lineterm="", n=2))
        print("\n".join(diff[:DIFF_LINES]))
        if len(diff) > DIFF_LINES:
            print(f"... ({len(diff) - DIFF_LINES} more diff lines)")

    listed = entries(fresh)
    headers = header_text(src)
    declared = sorted({n for n in PROTOTYPE.findall(headers) if not n.startswith("bg__")})
    missing = [n for n in declared if n not in listed]
    if missing:
        failed = True
        print(f"FAIL: public functions of include/brigade/*.h that scripts/gen_api.py did not list: "
              f"{', '.join(missing)} (the generator's parser needs fixing)")

    symbols = exported(binary, nm)
    if symbols is None:
        print("api docs: no libbrigade.so or nm: exported symbols not checked")
    else:
        named = {s for s in symbols if re.search(r"\b" + s + r"\b", headers)}
        missing = sorted(s for s in named if s not in listed)
        if missing:
            failed = True
            print(f"FAIL: symbols exported by libbrigade.so and declared in a public header but absent "
                  f"from the reference: {', '.join(missing)} (the generator's parser needs fixing)")
        private = sorted(symbols - named)
        if private:
            print(f"api docs: exported bg_ symbols no public header declares (not public API): "
                  f"{', '.join(private)}")
        print(f"api docs: {len(named)} exported symbols of the public headers checked")

    print(f"api docs: {len(declared)} prototypes in the headers, {len(listed)} entries in {built_path}"
          + (": FAILED" if failed else ": ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
