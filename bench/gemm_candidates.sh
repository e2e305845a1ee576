#!/usr/bin/env bash
# bench/gemm_candidates.sh: single-threaded sgemm of the BLAS candidates at the
# GPT's GEMM shapes (bench/gemm_candidates.c), the candidates run alternately,
# R rounds, medians per shape. Not in CI. Needs libopenblas0, libblis4-openmp
# and libdnnl2 (Debian). Usage: bench/gemm_candidates.sh [ROUNDS]
#   CANDIDATES  the libraries (default "openblas openblas-SkylakeX openblas-Haswell blis dnnl"):
#               openblas-CORE forces OpenBLAS's core (OPENBLAS_CORETYPE), dnnl-ISA caps oneDNN's
#               (ONEDNN_MAX_CPU_ISA), e.g. "openblas-Haswell dnnl-AVX2 openblas-Prescott dnnl-SSE41"
#               for what BRIGADE_CPU_ISA=avx2 and =default choose between
set -euo pipefail
R=${1:-5}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
gcc -O2 -o "$T/gc" "$(dirname "$0")/gemm_candidates.c" -ldl
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 BLIS_NUM_THREADS=1
read -r -a C <<<"${CANDIDATES:-openblas openblas-SkylakeX openblas-Haswell blis dnnl}"
for i in $(seq 1 "$R"); do
  for c in "${C[@]}"; do
    case $c in
      openblas-*) OPENBLAS_CORETYPE=${c#openblas-} "$T/gc" openblas 3 ;;
      dnnl-*) env -u OPENBLAS_CORETYPE ONEDNN_MAX_CPU_ISA=${c#dnnl-} "$T/gc" dnnl 3 ;;
      *) env -u OPENBLAS_CORETYPE "$T/gc" "$c" 3 ;;
    esac 2>>"$T/info" | awk -v c="$c" '{print c, $0}' >>"$T/all"
  done
done
sort -u "$T/info" | sed 's/^/# /'
grep -m1 "model name" /proc/cpuinfo | sed 's/^/# /'
printf "%-13s %2s %5s %5s %5s" shape op m n k; for c in "${C[@]}"; do printf " %9s" "${c/openblas-/ob-}"; done; echo
awk '!s[$2]++ {print $2}' "$T/all" | while read -r a; do
  line=$(grep -m1 " $a " "$T/all" | awk '{print $3, $4, $5, $6}')
  printf "%-13s %2s %5s %5s %5s" "$a" $line
  for c in "${C[@]}"; do
    grep "^$c $a " "$T/all" | awk '{print $7}' | sort -g | awk '{v[NR]=$1} END {printf " %9.1f", v[int((NR+1)/2)]}'
  done
  echo
done
