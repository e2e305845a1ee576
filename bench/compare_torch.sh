#!/usr/bin/env bash
# bench/compare_torch.sh: brigade against PyTorch eager on the CPU, training the same GPT
# (bench/compare_torch.py builds brigade's GPT in PyTorch; both print their parameter count,
# which must be equal), tokens/s in the reference cases of docs/benchmarks.md, the two run alternately, medians of R
# repeats, and the ratio brigade / PyTorch. Not in CI.
#
# Usage: bench/compare_torch.sh [BUILD_DIR] [REPEATS] [STEPS]
#   TORCH_VENV  the virtual environment with torch (default ~/.cache/brigade/torch-venv);
#               created with `python3 -m venv` and `pip install torch` (from PyPI) if torch
#               does not import there. The wheel pulls its CUDA runtime wheels (several GiB)
#               even on a machine without a GPU; only its CPU path is used.
#   BRIGADE_EXTRA  flags added to every brigade run (e.g. "--precision bf16"; PyTorch stays fp32)
#   CASES       which cases to run (default: "one1 one2 pp dp small ppzb ppzbv"; ppzb and ppzbv: brigade
#               only, its zero-bubble schedules on the pipeline case)
# A narrower vector ISA, on both sides (docs/benchmarks.md's table): BRIGADE_CPU_ISA=avx2
# ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 (avx512 / AVX512, default / SSE4_2);
# the header lines print what each side runs (brigade's kernels, BLAS core and GEMM libraries,
# PyTorch's capability).
set -euo pipefail
BUILD=${1:-build}; R=${2:-3}; STEPS=${3:-8}
B="$BUILD/brigade"
HERE=$(cd "$(dirname "$0")" && pwd)
DATA="$HERE/../data/kjv.txt"
VENV=${TORCH_VENV:-$HOME/.cache/brigade/torch-venv}
CASES=${CASES:-one1 one2 pp dp small ppzb ppzbv}
[ -x "$B" ] || { echo "compare_torch.sh: $B not found (build brigade first, or pass BUILD_DIR)" >&2; exit 1; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "installing PyTorch from PyPI into $VENV (several GiB, minutes)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch numpy
fi
PY="$VENV/bin/python"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

BIG="--layers 8 --d-model 256 --heads 4 --seq 128 --batch 32"
SMALL="--layers 4 --d-model 128 --heads 4 --seq 64 --batch 16"
# case -> "model flags | brigade command tail | torch flags"
brig() {  # case
  local base="$B train --model gpt --steps $STEPS --data $DATA ${BRIGADE_EXTRA:-}"
  case $1 in
    one1)  $base $BIG --microbatches 16 --threads 1 ;;
    one2)  $base $BIG --microbatches 16 --threads 2 ;;
    pp)    $B launch -n 2 -- $base $BIG --microbatches 16 --threads 1 --pp 2 --split 5,6 --schedule 1f1b ;;
    # brigade only (PyTorch's pipelining runs 1F1B above): its zero-bubble schedules on the same 2 stages
    ppzb)  $B launch -n 2 -- $base $BIG --microbatches 16 --threads 1 --pp 2 --split 5,6 --schedule zb-h1 ;;
    ppzbv) $B launch -n 2 -- $base $BIG --microbatches 16 --threads 1 --pp 2 --schedule zbv ;;
    # --microbatches is per replica: 8 of 2 sequences each, as the single process's
    dp)    $B launch -n 2 -- $base $BIG --microbatches 8 --threads 1 --dp 2 ;;
    small) $base $SMALL --microbatches 8 --threads 1 ;;
  esac
}
torch_run() {  # case
  local base="$PY $HERE/compare_torch.py --steps $STEPS --data $DATA"
  case $1 in
    one1)  $base $BIG --microbatches 16 --threads 1 --mode one ;;
    one2)  $base $BIG --microbatches 16 --threads 2 --mode one ;;
    pp)    $base $BIG --microbatches 16 --threads 1 --mode pp ;;
    dp)    $base $BIG --microbatches 16 --threads 1 --mode dp ;;
    small) $base $SMALL --microbatches 8 --threads 1 --mode one ;;
  esac
}
label() {
  case $1 in
    one1) echo "one process, 1 thread" ;; one2) echo "one process, 2 threads" ;;
    pp) echo "pipeline, 2 stages, 1F1B" ;; dp) echo "data parallel, 2 replicas" ;;
    ppzb) echo "pipeline, 2 stages, ZB-H1" ;; ppzbv) echo "pipeline, 2 ranks, ZBV" ;;
    small) echo "small config, 1 thread" ;;
  esac
}
tps() { grep -o "[0-9.]* tokens/s" | tail -1 | awk '{print $1}'; }
# the single process's "N parameters", PyTorch's "parameters N", or the sum of a launched
# job's per-rank table over the ranks of replica 0
params() {
  awk '/[0-9]+ parameters/ {for (i = 1; i < NF; i++) if ($(i+1) ~ /^parameters/) {print $i; exit}}
       /^parameters [0-9]+/ {print $2; exit}
       $1 == "rank" && $4 == "params" {tab = 1; next}
       tab && $1 ~ /^[0-9]+$/ {if ($3 == 0) n += $4; next} tab {tab = 0}
       END {if (n) print n}'
}
. "$HERE/lib.sh"

echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), family $(grep -m1 'cpu family' /proc/cpuinfo | sed 's/.*: //') model $(grep -m1 '^model\s*:' /proc/cpuinfo | sed 's/.*: //'), $(nproc) CPUs, flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|avx2|fma|avx512f|avx512bw|avx512vl|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ')"
"$B" info | grep -E "^(blas|cpu|gemm):|version:|kernels:" | sed 's/^/# /'
echo "# $("$PY" -c 'import torch; print("torch", torch.__version__, "(" + torch.backends.cpu.get_cpu_capability() + ")")')"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $R repeats of $STEPS steps, alternating"
for c in $CASES; do
  for i in $(seq 1 "$R"); do
    brig "$c" >"$T/b.out" 2>&1 || { echo "brigade failed in case $c:" >&2; tail -5 "$T/b.out" >&2; exit 1; }
    tps <"$T/b.out" >>"$T/$c.b"
    case $c in ppzb*) continue ;; esac # brigade only
    torch_run "$c" >"$T/t.out" 2>&1 || { echo "PyTorch failed in case $c:" >&2; tail -5 "$T/t.out" >&2; exit 1; }
    pb=$(params <"$T/b.out"); pt=$(params <"$T/t.out")
    [ "$pb" = "$pt" ] || { echo "case $c: brigade has $pb parameters, PyTorch $pt" >&2; exit 1; }
    echo "$pb" >"$T/$c.params"
    tps <"$T/t.out" >>"$T/$c.t"
  done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
# ratio: of the medians; pairs: median of the ratios of runs made one after the other
# (robust when the machine's load changes during the run)
printf "%-28s %11s %10s %10s %6s %6s   %s\n" case parameters brigade PyTorch ratio pairs \
  "runs (brigade | PyTorch, tokens/s)"
for c in $CASES; do
  [ -s "$T/$c.t" ] || continue # brigade only: below
  b=$(med <"$T/$c.b"); t=$(med <"$T/$c.t")
  pr=$(paste "$T/$c.b" "$T/$c.t" | awk '{print $1 / $2}' | med)
  printf "%-28s %11s %10.0f %10.0f %6.2f %6.2f   %s| %s\n" "$(label "$c")" "$(cat "$T/$c.params")" "$b" "$t" \
    "$(awk -v a="$b" -v b="$t" 'BEGIN{print a/b}')" "$pr" "$(tr '\n' ' ' <"$T/$c.b")" "$(tr '\n' ' ' <"$T/$c.t")"
done
# brigade's own speedups over one process on 1 thread, medians of this run (the issue's targets: pipeline
# 1.7, data parallel 1.8); the zero-bubble cases are brigade's alone
if [ -s "$T/one1.b" ]; then
  one=$(med <"$T/one1.b")
  for c in $CASES; do
    case $c in pp | ppzb | ppzbv | dp) ;; *) continue ;; esac
    echo "brigade speedup, $(label "$c") / one process 1 thread: $(awk -v a="$(med <"$T/$c.b")" -v b="$one" 'BEGIN{printf "%.2f", a/b}')" \
         "($(med <"$T/$c.b") / $one tokens/s; runs: $(tr '\n' ' ' <"$T/$c.b"))"
  done
fi
