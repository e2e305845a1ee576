#!/usr/bin/env bash
# scripts/pictures.sh: regenerate every picture of docs/ (docs/img/*.svg) from
# the commands that draw them, on a small model (about a minute on 2 cores).
#   scripts/pictures.sh [BUILD_DIR]      (default: build)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
B=$(cd "$BUILD" && pwd)/brigade
IMG=$ROOT/docs/img
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$IMG"
say() { echo "pictures: $*"; }

# schedule timelines, p = 4, m = 8, unit costs (docs/schedules.md)
for k in gpipe 1f1b interleaved zb-h1 zb-h2 zbv zb-interleaved dualpipev dualpipe; do
  "$B" schedule --schedule "$k" --stages 4 --microbatches 8 --svg "$IMG/${k}_p4_m8.svg" >/dev/null
  say "$IMG/${k}_p4_m8.svg"
done
# 1F1B above ZB-H1 (each on its own step: 33 and 27 unit costs)
python3 - "$IMG/1f1b_p4_m8.svg" "$IMG/zb-h1_p4_m8.svg" "$IMG/1f1b_vs_zbh1_p4_m8.svg" <<'PY'
import re, sys
parts = [open(p).read().split("?>", 1)[1].strip() for p in sys.argv[1:3]]
w = max(int(re.search(r'width="(\d+)"', p).group(1)) for p in parts)
hs = [int(re.search(r'height="(\d+)"', p).group(1)) for p in parts]
out = ['<?xml version="1.0" encoding="UTF-8"?>',
       f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{sum(hs)}" viewBox="0 0 {w} {sum(hs)}">']
y = 0
for p, h in zip(parts, hs):
    # the patterns' ids must stay unique in one document
    p = p.replace('id="chunk', f'id="p{y}chunk').replace('url(#chunk', f'url(#p{y}chunk')
    out.append(p.replace("<svg ", f'<svg y="{y}" ', 1))
    y += h
out.append("</svg>")
open(sys.argv[3], "w").write("\n".join(out) + "\n")
PY
say "$IMG/1f1b_vs_zbh1_p4_m8.svg"

# a measured step and its simulation, 2 ranks, 1F1B, 16 microbatches (docs/executor.md)
# (the command of docs/executor.md: GPT 8 x 256, about 10 s)
"$B" launch -n 2 -- "$B" train --layers 8 --d-model 256 --heads 4 --seq 64 --batch 32 --microbatches 16 \
  --steps 6 --threads 1 --pp 2 --split 5,6 --trace "$T/t.json" --quiet >/dev/null 2>"$T/e" || { cat "$T/e"; exit 1; }
"$B" simulate --from-trace "$T/t.json" --svg "$IMG/simulated_1f1b_p2_m16.svg" \
  --svg-measured "$IMG/measured_1f1b_p2_m16.svg" | grep "simulated/measured"
say "$IMG/simulated_1f1b_p2_m16.svg $IMG/measured_1f1b_p2_m16.svg"

# a loss curve (README): 300 steps of a small GPT on 2 stages
"$B" launch -n 2 -- "$B" train --layers 2 --d-model 64 --heads 4 --seq 32 --batch 16 --microbatches 4 \
  --steps 300 --threads 1 --pp 2 --split 2,3 --metrics "$T/m.jsonl" --quiet >/dev/null 2>"$T/e" || { cat "$T/e"; exit 1; }
"$B" plot "$T/m.jsonl" --out "$IMG/loss.svg" --smooth 20 >/dev/null
say "$IMG/loss.svg"
