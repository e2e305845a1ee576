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
# A second table does the same for the Llama-style kernels (`brigade bench kernels
# --llama`, bench/attention_torch.py --llama): per block, forward + backward CPU time
# (rmsnorm: forward, input and weight gradients; swiglu: forward, backward; rope: forward;
# gqa_attention: the backend's fused grouped-query attention forward and backward where it
# has them, else the grouped layout's expansion, the fused attention and the reduction;
# PyTorch: F.rms_norm, F.silu(a) * b, a rotate-half RoPE, and the faster of SDPA with
# enable_gqa and SDPA on expanded K/V, through autograd).
#
# usage: bench/attention_isa.sh [BRIGADE_BINARY]
#   env: PYTHON (an interpreter that imports torch; default python3), ROUNDS (5),
#        REPEAT (5), SHAPES ("4,256,12,64 2,128,4,64": B,T,NH,HS), ISAS (avx512 avx2 default),
#        LLAMA ("4,256,4,3,64,2048": B,T,G,g,HS,H, G key/value heads of g query heads,
#        SwiGLU of H units; empty: no second table)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=${1:-$here/../build/brigade}
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-5}
REPEAT=${REPEAT:-5}
SHAPES=${SHAPES:-"4,256,12,64 2,128,4,64"}
ISAS=${ISAS:-"avx512 avx2 default"}
LLAMA=${LLAMA-"4,256,4,3,64,2048"}
llama_rows=""
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
    for s in $LLAMA; do args+=(--llama "$s"); done
    : >"$tmp/b" && : >"$tmp/t"
    for r in $(seq "$ROUNDS"); do
        OMP_NUM_THREADS=1 BRIGADE_CPU_ISA=$isa "$B" bench kernels --threads 1 --repeat "$REPEAT" "${args[@]}" |
            grep -E "^  (attention|llama)" >>"$tmp/b"
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
    for s in $LLAMA; do
        IFS=, read -r b t G g hs H <<<"$s"
        key="B=$b T=$t G=$G g=$g hs=$hs H=$H:"
        # per round and block: the CPU time of its kernels summed (brigade) or its line (PyTorch)
        grep -F "llama " "$tmp/b" | grep -F "$key" | awk '{
            match($0, /CPU time +[0-9.]+/); c = substr($0, RSTART, RLENGTH); sub(/CPU time +/, "", c)
            n = $2; if (n == "rmsnorm_forward") r++
            if (n ~ /^gqa_(expand|reduce)$/) next
            sub(/_(forward|backward_input|backward_weight|backward)$/, "", n); s[r " " n] += c
        } END {for (k in s) print k, s[k]}' >"$tmp/lb"
        grep -F "torch llama " "$tmp/t" | grep -F "$key" | awk '{
            match($0, /CPU time +[0-9.]+/); c = substr($0, RSTART, RLENGTH); sub(/CPU time +/, "", c)
            if ($3 == "rmsnorm") r++; print r, $3, c
        }' >"$tmp/lt"
        for blk in rmsnorm swiglu rope gqa_attention; do
            bc=$(awk -v k="$blk" '$2 == k {print $3}' "$tmp/lb" | med)
            tc=$(awk -v k="$blk" '$2 == k {print $3}' "$tmp/lt" | med)
            ratio=$(awk -v k="$blk" 'NR == FNR {if ($2 == k) b[$1] = $3; next} $2 == k && b[$1] > 0 {printf "%.3f\n", $3 / b[$1]}' \
                "$tmp/lb" "$tmp/lt" | med)
            llama_rows+="| $isa | $blk | $s | $bc | $tc | $ratio |"$'\n'
        done
    done
done
if [ -n "$LLAMA" ]; then
    echo
    echo "| ISA | Llama block (fwd+bwd; rope fwd) | shape B,T,G,g,HS,H | brigade ms (CPU) | PyTorch ms (CPU) | torch / brigade (CPU) |"
    echo "|---|---|---|---|---|---|"
    printf "%s" "$llama_rows"
fi
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
