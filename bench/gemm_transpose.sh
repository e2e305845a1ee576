#!/usr/bin/env bash
# bench/gemm_transpose.sh: the CPU backend's A B^T and A^T B GEMMs direct vs
# "transpose then A B" (BRIGADE_GEMM_TRANSPOSE=off vs on, alternating inside one
# process per ISA: build/bench/gemm_transpose), on one thread, under each ISA
# this CPU executes (BRIGADE_CPU_ISA: avx512, avx2, default), medians of ROUNDS.
# Usage: bench/gemm_transpose.sh [ROUNDS] [BUILD_DIR]    (ISAS="avx2" to choose)
set -euo pipefail
R=${1:-7}
B=${2:-build}
[ -x "$B/bench/gemm_transpose" ] || { echo "build $B/bench/gemm_transpose first (cmake --build $B --target gemm_transpose)" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
unset OPENBLAS_CORETYPE ONEDNN_MAX_CPU_ISA
grep -m1 "model name" /proc/cpuinfo | sed 's/^/# /'
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for isa in ${ISAS:-avx512 avx2 default}; do
  if ! BRIGADE_CPU_ISA=$isa BRIGADE_LOG=error "$B/bench/gemm_transpose" "$R"; then
    echo "# $isa: not run (above this CPU?)"
  fi
done
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
