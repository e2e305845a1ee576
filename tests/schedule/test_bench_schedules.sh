#!/usr/bin/env bash
# tests/schedule/test_bench_schedules.sh: `brigade bench schedules` over a
# small grid. References: 1F1B's closed forms (step 3(m+p-1), both bubbles
# (p-1)/(m+p-1) at unit costs), `brigade schedule --compare` (the same step
# and bubbles for every generator), the search never slower than a generator
# of the layouts it searches, and the SVG's title, axis and legend.
. "$(dirname "$0")/../lib/harness.sh"

"$B" bench schedules --stages 2,4 --microbatches 4,9 --latency 0.25 --csv "$T/b.csv" --svg "$T/b.svg" >"$T/out" 2>&1 \
    || fail "bench schedules failed: $(cat "$T/out")"
"$B" bench schedules --stages 1,3 --microbatches 2,7 --csv "$T/b0.csv" >"$T/out" 2>&1 || fail "bench schedules failed: $(cat "$T/out")"
for pm in "2 4" "2 9" "4 4" "4 9"; do
    set -- $pm
    "$B" schedule --compare --stages "$1" --microbatches "$2" --latency 0.25 >"$T/cmp.$1.$2" 2>&1 || fail "--compare $1 $2"
done
python3 - "$T" <<'PY' || fail "bench schedules figures"
import csv, sys
T = sys.argv[1]
rows = list(csv.DictReader(open(f"{T}/b.csv")))
assert rows and set(rows[0]) == {"p", "m", "schedule", "v", "step", "bubble", "stage_bubble", "peak_stash"}, rows[:1]
cells = {(int(r["p"]), int(r["m"])) for r in rows}
assert cells == {(2, 4), (2, 9), (4, 4), (4, 9)}, cells
for (p, m) in sorted(cells):
    got = {r["schedule"]: r for r in rows if int(r["p"]) == p and int(r["m"]) == m}
    cmp = {}
    for line in open(f"{T}/cmp.{p}.{m}"):
        f = line.split()
        if len(f) >= 7 and f[1].isdigit() and f[3].endswith("%"):
            cmp[f[0]] = f
    assert set(cmp) == set(got) - {"search"}, (p, m, sorted(cmp), sorted(got))
    for name, f in cmp.items():
        r = got[name]
        assert abs(float(f[2]) - float(r["step"])) < 1e-4 * float(r["step"]), (name, p, m, f, r)
        assert abs(float(f[3][:-1]) - 100 * float(r["bubble"])) < 0.01 and abs(float(f[5][:-1]) - 100 * float(r["stage_bubble"])) < 0.01, (name, f, r)
    s = float(got["search"]["step"])
    for name, r in got.items():
        if name not in ("search", "dualpipe"):
            assert s <= float(r["step"]) + 1e-9, (p, m, name, r["step"], s)
# unit costs, free links: 1F1B's step 3(m+p-1), both bubbles (p-1)/(m+p-1), on each of the 4 grid points
n1f1b = 0
for r in csv.DictReader(open(f"{T}/b0.csv")):
    p, m = int(r["p"]), int(r["m"])
    if r["schedule"] == "1f1b":
        n1f1b += 1
        assert abs(float(r["step"]) - 3 * (m + p - 1)) < 1e-9, r
        assert abs(float(r["bubble"]) - (p - 1) / (m + p - 1)) < 1e-6 and abs(float(r["stage_bubble"]) - float(r["bubble"])) < 1e-6, r
assert n1f1b == 4, n1f1b
PY
python3 "$BRIGADE_SOURCE_DIR/tests/lib/svgcheck.py" "$T/b.svg" --title "simulated step time" --axis-label "step / fastest (x)" \
    --legend gpipe 1f1b zb-h1 zbv search || fail "bench schedules SVG"
expect_err_line bench "--stages entry 0 is 0" schedules --stages 0
expect_err_line bench "--costs expects F,B,W" schedules --costs 1,2
[ "$fails" = 0 ] && ok "bench schedules grid, CSV and SVG"
finish
