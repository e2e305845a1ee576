#!/usr/bin/env bash
# bench/attention_isa.sh: brigade's fused causal attention (forward + backward,
# one thread) against PyTorch's scaled_dot_product_attention(is_causal=True),
# under every vector ISA this CPU executes, forced on both sides: brigade by
# BRIGADE_CPU_ISA, PyTorch by ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS.
# Not in CI (PyTorch is not a dependency). Prints a Markdown table for
# docs/benchmarks.md: per ISA and shape, the medians over ROUNDS rounds of each
# side's median of REPEAT runs, wall time and the process's CPU time (a shared
# machine's load inflates the first), and torch / brigade of CPU time (> 1:
# brigade is faster), each round running brigade then PyTorch back to back.
#
# usage: bench/attention_isa.sh [BRIGADE_BINARY]
#   env: PYTHON (an interpreter that imports torch; default python3), ROUNDS (5),
#        REPEAT (5), SHAPES ("4,256,12,64 2,128,4,64": B,T,NH,HS), ISAS (avx512 avx2 default)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=${1:-$here/../build/brigade}
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-5}
REPEAT=${REPEAT:-5}
SHAPES=${SHAPES:-"4,256,12,64 2,128,4,64"}
ISAS=${ISAS:-"avx512 avx2 default"}
have_torch=1
"$PY" -c "import torch" 2>/dev/null || { have_torch=0; echo "note: $PY cannot import torch: brigade only" >&2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cpu=$("$B" info 2>/dev/null | grep -m1 "^cpu:" | sed 's/^cpu: //' || true)
echo "CPU: $cpu; $(nproc) CPUs; $(date -u '+%Y-%m-%d %H:%M UTC'); $("$B" --version 2>/dev/null | head -1); load average $(cut -d' ' -f1-3 /proc/loadavg)"
[ $have_torch = 1 ] && echo "PyTorch $("$PY" -c 'import torch; print(torch.__version__)')"
echo
echo "| ISA | shape B,T,NH,HS | brigade ms (CPU) | PyTorch ms (CPU) | torch / brigade (CPU) | brigade ms (wall) | PyTorch ms (wall) |"
echo "|---|---|---|---|---|---|---|"
med() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
for isa in $ISAS; do
    info=$(BRIGADE_CPU_ISA=$isa "$B" info 2>/dev/null || true)
    if ! grep -q "^cpu kernels: $isa " <<<"$info"; then
        echo "| $isa | this CPU lacks it | | | | | |"
        continue
    fi
    case $isa in
    avx512) cap=avx512 mkl=AVX512 ;;
    avx2) cap=avx2 mkl=AVX2 ;;
    *) cap=default mkl=SSE4_2 ;;
    esac
    args=()
    for s in $SHAPES; do args+=(--attention "$s"); done
    : >"$tmp/b" && : >"$tmp/t"
    for r in $(seq "$ROUNDS"); do
        OMP_NUM_THREADS=1 BRIGADE_CPU_ISA=$isa "$B" bench kernels --threads 1 --repeat "$REPEAT" "${args[@]}" |
            grep "^  attention" >>"$tmp/b"
        if [ $have_torch = 1 ]; then
            OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=$cap MKL_ENABLE_INSTRUCTIONS=$mkl \
                "$PY" "$here/attention_torch.py" --repeat "$REPEAT" "${args[@]}" >>"$tmp/t"
        fi
    done
    for s in $SHAPES; do
        IFS=, read -r b t nh hs <<<"$s"
        key="B=$b T=$t NH=$nh hs=$hs"
        bw=$(grep -F "attention $key " "$tmp/b" | sed 's/.*fwd+bwd \([0-9.]*\) ms.*/\1/' | med)
        bc=$(grep -F "attention $key " "$tmp/b" | sed 's/.*CPU time \([0-9.]*\) ms.*/\1/' | med)
        tw=$(grep -F "attention $key:" "$tmp/t" | sed 's/.*fwd+bwd \([0-9.]*\) ms.*/\1/' | med)
        tc=$(grep -F "attention $key:" "$tmp/t" | sed 's/.*CPU time \([0-9.]*\) ms.*/\1/' | med)
        # the ratio per round (brigade and PyTorch ran back to back), then its median
        ratio=$(paste <(grep -F "attention $key " "$tmp/b" | sed 's/.*CPU time \([0-9.]*\) ms.*/\1/') \
                      <(grep -F "attention $key:" "$tmp/t" | sed 's/.*CPU time \([0-9.]*\) ms.*/\1/') |
                awk 'NF == 2 {printf "%.3f\n", $2 / $1}' | med)
        echo "| $isa | $s | $bc | $tc | $ratio | $bw | $tw |"
    done
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
