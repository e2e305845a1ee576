#!/usr/bin/env bash
# scripts/demo.sh: the default training job, about 3 minutes on 2 vCPUs. A
# Llama-style model (4 blocks, d_model 128, 4 query heads sharing 2 key/value
# heads, RMSNorm, SwiGLU, rotary positions; 0.85M parameters) learns the
# bundled King James corpus through the token-file path (the text's bytes
# written as llm.c token files by scripts/text_to_tokens.py, the last 5% held
# out), on 2 pipeline stages x 2 data-parallel replicas (4 ranks under brigade
# launch, 1F1B), with warm-up + cosine learning rate, clipping by global norm
# and the held-out loss every 100 steps in the progress line. It writes the
# metrics, a loss plot (loss.svg) and the weights, and ends with a sample.
#
# Usage: scripts/demo.sh [BUILD_DIR] [--full] [extra brigade train flags]
#   --full   the longer run: 4000 steps (about 8 minutes on 2 vCPUs)
# Output: $BRIGADE_DEMO_DIR (default demo-out/).
set -euo pipefail
BUILD=${1:-build}
shift || true
STEPS=1500
if [ "${1:-}" = --full ]; then STEPS=4000; shift; fi
B="$BUILD/brigade"
[ -x "$B" ] || { echo "demo: $B not found: build first (see README.md)" >&2; exit 1; }
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${BRIGADE_DEMO_DIR:-demo-out}
mkdir -p "$OUT"
# the corpus as tokens (bytes): 95% to train on, the last 5% held out
if [ ! -s "$OUT/kjv.train.bin" ] || [ ! -s "$OUT/kjv.val.bin" ]; then
  python3 "$HERE/text_to_tokens.py" --format llmc --val-fraction 0.05 "$HERE/../data/kjv.txt" \
    "$OUT/kjv.train.bin" "$OUT/kjv.val.bin"
fi
rm -f "$OUT/metrics.jsonl"
echo "brigade demo: Llama on data/kjv.txt as token files, 2 pipeline stages x 2 replicas, 1F1B, $STEPS steps, 4 ranks on $(nproc) cores"
"$B" launch -n 4 -- "$B" train --model llama --layers 4 --d-model 128 --heads 4 --kv-heads 2 --seq 64 \
  --data "$OUT/kjv.train.bin" --val-data "$OUT/kjv.val.bin" --eval-every 100 --eval-batches 4 \
  --batch 32 --microbatches 4 --steps "$STEPS" --lr 4e-3 --warmup 50 --lr-schedule cosine --min-lr 4e-4 \
  --clip-grad 1.0 --threads 1 --pp 2 --dp 2 --split 3,4 --schedule 1f1b \
  --metrics "$OUT/metrics.jsonl" --save "$OUT/weights" "$@"
"$B" plot "$OUT/metrics.jsonl" --out "$OUT/loss.svg" --title "brigade demo: Llama, pp 2 x dp 2"
echo "loss plot: $OUT/loss.svg"
echo; echo "sample from the trained model:"
"$B" generate --checkpoint "$OUT/weights" --prompt "And God said" --tokens 300 --temperature 0.6 --seed 1
