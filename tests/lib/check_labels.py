#!/usr/bin/env python3
"""tests/lib/check_labels.py: the test registration of a build directory,
read from `ctest --show-only=json-v1`, against the declared labels.

Usage: check_labels.py CTEST BUILD_DIR LABEL...

Fails (exit 1, each fault on a line) when a test has no label, a label
outside the declared ones, or a declared label (fuzz excepted: its
harnesses register only in a -DBG_FUZZ=ON build) is carried by no test.
It reads the registration only; it runs no test.
"""
import json
import subprocess
import sys


def main():
    ctest, build, declared = sys.argv[1], sys.argv[2], sys.argv[3:]
    out = subprocess.run([ctest, "--test-dir", build, "--show-only=json-v1"],
                         check=True, capture_output=True, text=True).stdout
    tests = json.loads(out)["tests"]
    faults = []
    used = {}
    for t in tests:
        labels = []
        for p in t.get("properties", []):
            if p["name"] == "LABELS":
                labels = p["value"]
        if not labels:
            faults.append(f"{t['name']}: no label (one of {', '.join(declared)})")
        for lab in labels:
            used.setdefault(lab, []).append(t["name"])
            if lab not in declared:
                faults.append(f"{t['name']}: label {lab!r} is not declared ({', '.join(declared)})")
    for lab in declared:
        if lab not in used and lab != "fuzz":
            faults.append(f"label {lab!r} is declared but no test carries it")
    for f in faults:
        print("FAIL:", f)
    print(f"{len(tests)} tests; " + ", ".join(f"{lab} {len(used.get(lab, []))}" for lab in declared))
    return 1 if faults or not tests else 0


if __name__ == "__main__":
    sys.exit(main())
