#!/usr/bin/env bash
# scripts/demo.sh: the default training job. A GPT (4 blocks, d_model 128,
# 0.9M parameters) trains on the bundled King James corpus with 2 pipeline
# stages x 2 data-parallel replicas (4 ranks under brigade launch), showing
# progress; it ends with the measured bubble, throughput and memory per rank.
# Usage: scripts/demo.sh [BUILD_DIR] [extra brigade train flags]
set -euo pipefail
BUILD=${1:-build}
shift || true
B="$BUILD/brigade"
[ -x "$B" ] || { echo "demo: $B not found: build first (see README.md)" >&2; exit 1; }
OUT=${BRIGADE_DEMO_DIR:-demo-out}
mkdir -p "$OUT"
echo "brigade demo: GPT on data/kjv.txt, 2 pipeline stages x 2 replicas, 1F1B, 4 ranks on $(nproc) cores"
"$B" launch -n 4 -- "$B" train --model gpt --layers 4 --d-model 128 --heads 4 --seq 64 \
  --batch 32 --microbatches 4 --steps 1000 --lr 4e-3 --threads 1 \
  --pp 2 --dp 2 --split 3,4 --schedule 1f1b \
  --metrics "$OUT/metrics.jsonl" --save "$OUT/weights" "$@"
if "$B" help 2>/dev/null | grep -q "^  generate"; then
  echo; echo "sample from the trained model:"
  "$B" generate --checkpoint "$OUT/weights" --prompt "And God said" --tokens 300 --temperature 0.6 --seed 1
fi
