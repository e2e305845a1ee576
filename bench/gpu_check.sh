#!/usr/bin/env bash
# bench/gpu_check.sh: the one prepared run that checks the CUDA backend on a
# machine with a GPU (written for one H200; budget 6 minutes, each step has
# its own timeout). NOT yet run: the sessions that wrote the backend had no
# GPU (docs/kernels.md). Steps:
#   1. build (Release, CUDA on, warnings allowed: another compiler's warning
#      must not end the check) in build-gpu/
#   2. the conformance test: every op on the cuda backend against the CPU
#      (fp32 tolerances; GEMM again with tf32 and bf16 tensor cores, attention
#      again on tensor cores), then
#      again under compute-sanitizer's memcheck where it is installed
#   3. cuBLAS GEMM TFLOP/s, fp32 / TF32 / bf16 (bench/cublas_gemm)
#   4. one GPT block (d_model 2048, 16 heads, seq 2048, microbatch 4) forward +
#      backward through `brigade profile --backend cuda`, with GEMMs in fp32
#      and in bf16 tensor cores (BRIGADE_CUDA_GEMM) on fp32 storage (attention
#      on tensor cores, then again on CUDA cores: BRIGADE_CUDA_ATTN), and with
#      --precision bf16 (bf16 activations in the block, bf16 GEMMs), as MFU
#      against the bf16 dense peak below
#   5. the 8-block GPT trained 50 steps on cuda and on cpu, losses side by side
#   6. transfers on the copy stream (runtime/staging.c with the CUDA stream
#      slots): two processes on the one GPU, pp = 2 (1F1B, tied embeddings)
#      against one process on cuda, bitwise (the equivalence the CPU tests
#      hold), the same with --precision bf16, and dp = 2 within relative L2 1e-5
#      (checks the events' ordering on a device; says nothing of overlap),
#      on the staged path (BRIGADE_STAGING=always) even where a CUDA-aware UCX
#      is linked; skipped, saying so, when the GPU's compute mode is exclusive
#   7. the group collectives on device buffers (runtime/devcoll.h), two
#      processes on the one GPU through the staging provider: tp = 2, tp = 2
#      with --sequence-parallel, and dp = 2 with --zero 2, each within relative
#      L2 1e-5 of one process (as test_tp and test_zero hold on the CPU), the
#      provider read from the log; and expert parallelism (4 experts, top 2,
#      every second block): ep 2 x dp 2, its all-to-alls staged through host
#      memory, within relative L2 1e-5 of one process holding every expert
#      with the same sequences per microbatch (as test_ep holds on the CPU)
#   8. --offload optimizer on the device (docs/offload.md, "Device backends":
#      the gradients and parameters copied to pinned host memory, the CPU's
#      AdamW on the host-held state, the parameters copied back), two
#      processes on the one GPU at dp = 2 --zero 2 against the same run
#      without offload (step 7's zero2) within relative L2 1e-5, with the
#      count of host-held updates from the log; and --offload
#      optimizer,params at dp = 2 --zero 3 (the parameter shard in page-locked
#      host memory, each gather uploading it on the copy stream, the step
#      updating it in place) against --zero 3 without offload (also checked
#      against one process) within relative L2 1e-5, with the count of
#      in-place updates from the log
#   9. the NCCL provider (BRIGADE_COLL=nccl): tp = 2 and --zero 2 within
#      relative L2 1e-5 of one process where the machine has two GPUs or more
#      (NCCL refuses two ranks on one GPU: skipped, saying so, on one)
#  10. a checkpoint of host-held optimizer state (docs/offload.md,
#      "Checkpoints"): dp = 2 --zero 2 --offload optimizer saved at step 5
#      and resumed to step 10, against step 8's run that never stopped
#      (offzero2) within relative L2 1e-5
# A check whose log holds a CUDA error the backend reported fails, whatever
# its exit status.
# Prints a table; also writes it to $OUT/gpu_check.md when OUT is set (the
# device tool's output folder), else to build-gpu/gpu_check.md.
#
#   bash bench/gpu_check.sh            from the repository root
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PEAK_BF16_TFLOPS=${PEAK_BF16_TFLOPS:-989} # H200 SXM, dense bf16 (NVIDIA's datasheet; 1979 is with sparsity)
J=$(nproc)
BUILD=build-gpu
REPORT=${OUT:-$BUILD}/gpu_check.md
start=$(date +%s)
fails=0
say() { echo "$*" | tee -a "$REPORT.tmp"; }
step() { echo "== $* ($(($(date +%s) - start)) s)"; }
mkdir -p "$BUILD" "$(dirname "$REPORT")"
: >"$REPORT.tmp"

step "GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader 2>&1 | head -2 || true
mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -1)
# a log with an error the CUDA backend reported (its sticky error fails the step; a tool that only logs it must fail too)
cuda_err() { grep -q "cuda backend.*failed" "$1"; }

step "build"
if ! timeout 200 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >"$BUILD.cmake.log" 2>&1 ||
    ! timeout 200 cmake --build "$BUILD" -j"$J" >"$BUILD.build.log" 2>&1; then
    tail -30 "$BUILD.cmake.log" "$BUILD.build.log" 2>/dev/null
    echo "gpu_check: the build failed"
    exit 1
fi
grep -q 'CUDA backend ON' "$BUILD.cmake.log" || { echo "gpu_check: CUDA backend not configured"; exit 1; }
B=$BUILD/brigade
"$B" info | sed -n 1,3p

say "| check | result |"
say "|---|---|"

step "conformance"
timeout 120 "$BUILD/tests/kernels/test_conformance" cuda >"$BUILD/conformance.log" 2>&1
rc=$?
tail -5 "$BUILD/conformance.log"
if [ $rc -eq 0 ]; then say "| conformance (every op, cuda vs cpu) | pass |"; else
    grep FAIL "$BUILD/conformance.log" | head -20
    say "| conformance (every op, cuda vs cpu) | FAIL (rc $rc, $BUILD/conformance.log) |"
    fails=$((fails + 1))
fi
if command -v compute-sanitizer >/dev/null 2>&1; then
    step "conformance under compute-sanitizer (memcheck)"
    timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/tests/kernels/test_conformance" cuda \
        >"$BUILD/memcheck.log" 2>&1
    rc=$?
    tail -3 "$BUILD/memcheck.log"
    case $rc in
    0) say "| conformance under memcheck | pass |" ;;
    124) say "| conformance under memcheck | incomplete (100 s timeout; $BUILD/memcheck.log) |" ;;
    *) say "| conformance under memcheck | FAIL (rc $rc, $BUILD/memcheck.log) |"; fails=$((fails + 1)) ;;
    esac
else
    say "| conformance under memcheck | skipped: no compute-sanitizer on PATH |"
fi

step "cuBLAS GEMM"
if timeout 60 "$BUILD/bench/cublas_gemm" 4096 8192 >"$BUILD/cublas.log" 2>&1; then
    cat "$BUILD/cublas.log"
    awk 'NR > 2 { printf "| cuBLAS GEMM n=%s %s | %s TFLOP/s |\n", $1, $2, $4 }' "$BUILD/cublas.log" >>"$REPORT.tmp"
else
    cat "$BUILD/cublas.log"
    say "| cuBLAS GEMM | FAIL |"
    fails=$((fails + 1))
fi

step "GPT block d_model 2048 seq 2048"
# fp32 and bf16 GEMMs on fp32 storage (attention on tensor cores with bf16
# GEMMs, BRIGADE_CUDA_ATTN=auto; bf16-simt: on CUDA cores), then --precision
# bf16 (bf16 activations in the blocks, bf16 GEMMs)
for math in fp32 bf16 bf16-simt bf16-storage; do
    j=$BUILD/block_$math.json
    gm=${math%-storage}; gm=${gm%-simt}; prec=fp32; [ "$math" = bf16-storage ] && prec=bf16
    attn=auto; [ "$math" = bf16-simt ] && attn=simt
    if BRIGADE_CUDA_ATTN=$attn BRIGADE_CUDA_GEMM=$gm timeout 90 "$B" profile --backend cuda --layers 1 --d-model 2048 --heads 16 \
        --seq 2048 --vocab 256 --microbatch-size 4 --precision "$prec" --json "$j" >"$BUILD/block_$math.log" 2>&1 &&
        ! cuda_err "$BUILD/block_$math.log"; then
        python3 - "$j" "$math" "$PEAK_BF16_TFLOPS" <<'EOF' | tee -a "$REPORT.tmp"
import json, sys
d = json.load(open(sys.argv[1]))
blk = [l for l in d["layers"] if l["name"].startswith("blocks.")][0]
fl = blk["fwd_flops"] + blk["bwd_flops"]
s = blk["fwd_s"] + blk["bwd_s"]
tf = fl / s / 1e12
st = "bf16 activations" if sys.argv[2].endswith("storage") else "fp32 storage"
st += ", attention on CUDA cores" if sys.argv[2].endswith("simt") else ""
print(f"| GPT block fwd+bwd, GEMM {sys.argv[2].split('-')[0]} ({st}) | {s*1e3:.1f} ms, {tf:.1f} TFLOP/s, "
      f"MFU {100*tf/float(sys.argv[3]):.1f}% of {sys.argv[3]} bf16 |")
EOF
    else
        tail -5 "$BUILD/block_$math.log"
        say "| GPT block, GEMM $math | FAIL ($BUILD/block_$math.log) |"
        fails=$((fails + 1))
    fi
done

step "8-block GPT, 50 steps, cuda and cpu"
model=(--layers 8 --d-model 128 --heads 4 --seq 64 --batch 8 --microbatches 2 --steps 50 --quiet)
for be in cuda cpu; do
    { timeout 150 "$B" train --backend "$be" "${model[@]}" --metrics "$BUILD/train_$be.jsonl" >"$BUILD/train_$be.log" 2>&1 &&
        ! cuda_err "$BUILD/train_$be.log"; } ||
        { tail -5 "$BUILD/train_$be.log"; say "| training on $be | FAIL ($BUILD/train_$be.log) |"; fails=$((fails + 1)); }
done
if [ -s "$BUILD/train_cuda.jsonl" ] && [ -s "$BUILD/train_cpu.jsonl" ]; then
    python3 - "$BUILD/train_cuda.jsonl" "$BUILD/train_cpu.jsonl" <<'EOF' | tee -a "$REPORT.tmp"
import json, sys
def steps(f):
    return [r for r in (json.loads(l) for l in open(f) if l.strip()) if "loss" in r]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
print(f"| 8-block GPT 50 steps, loss cuda / cpu | {a[0]['loss']:.4f} -> {a[-1]['loss']:.4f} / "
      f"{b[0]['loss']:.4f} -> {b[-1]['loss']:.4f}, largest relative difference {worst:.2e} |")
print()
print("| step | loss cuda | loss cpu |")
print("|---|---|---|")
for x, y in zip(a, b):
    if x["step"] % 5 == 0 or x["step"] == 1:
        print(f"| {x['step']} | {x['loss']:.4f} | {y['loss']:.4f} |")
EOF
fi

step "transfers on the copy stream and group collectives: pp = 2, dp = 2, tp = 2, zero 2, zero 2 and 3 offloaded, ep 2 (two processes on one GPU), NCCL"
case $mode in *Exclusive*)
    say "| staged transfers (two processes on one GPU) | skipped: compute mode $mode admits one process |"
    mv "$REPORT.tmp" "$REPORT"; step "done: $fails failure(s); table in $REPORT"; [ $fails -eq 0 ]; exit ;;
esac
export BRIGADE_STAGING=always # the staged path, also where a CUDA-aware UCX would take device buffers directly
small=(--layers 4 --d-model 64 --heads 4 --seq 32 --batch 8 --microbatches 4 --steps 10 --threads 1 --quiet)
moe=(--experts 4 --top-k 2 --moe-every 2 --capacity-factor 1.0) # ep2's model; its reference: staged_onemoe
ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
nccl=(); [ "$ngpu" -ge 2 ] && nccl=("nccl_tp2 2 l2:1e-5 nccl --tp 2" "nccl_zero2 2 l2:1e-5 nccl --dp 2 --zero 2")
# name  ranks  tolerance (bitwise | l2:X)  BRIGADE_COLL  args
for c in "one 1 - auto " "pp2tie 2 bitwise auto --pp 2 --schedule 1f1b --tie-embeddings" "dp2 2 l2:1e-5 auto --dp 2" \
         "pp2bf16 2 bitwise auto --pp 2 --schedule 1f1b --precision bf16" "tp2 2 l2:1e-5 auto --tp 2" \
         "tp2sp 2 l2:1e-5 auto --tp 2 --sequence-parallel" "zero2 2 l2:1e-5 auto --dp 2 --zero 2" \
         "offzero2 2 l2:1e-5 auto --dp 2 --zero 2 --offload optimizer" "zero3 2 l2:1e-5 auto --dp 2 --zero 3" \
         "offzero3 2 l2:1e-5 auto --dp 2 --zero 3 --offload optimizer,params" \
         "ep2 2 l2:1e-5 auto ${moe[*]} --dp 2 --ep 2 --microbatches 2" "${nccl[@]}"; do
    read -r name n tol coll args <<<"$c"
    ref=$BUILD/staged_one
    [ "$name" = pp2tie ] && ref=$BUILD/staged_onetie
    [ "$name" = pp2bf16 ] && ref=$BUILD/staged_onebf16
    [ "$name" = offzero2 ] && ref=$BUILD/staged_zero2 # the same run without offload
    [ "$name" = offzero3 ] && ref=$BUILD/staged_zero3
    [ "$name" = ep2 ] && ref=$BUILD/staged_onemoe
    if [ "$name" = one ]; then # the references: one process, with and without tied embeddings
        if ! { timeout 60 "$B" train --backend cuda "${small[@]}" --save "$BUILD/staged_one" >"$BUILD/staged_one.log" 2>&1 &&
            timeout 60 "$B" train --backend cuda "${small[@]}" --tie-embeddings --save "$BUILD/staged_onetie" \
                >"$BUILD/staged_onetie.log" 2>&1 &&
            timeout 60 "$B" train --backend cuda "${small[@]}" --precision bf16 --save "$BUILD/staged_onebf16" \
                >"$BUILD/staged_onebf16.log" 2>&1 &&
            timeout 60 "$B" train --backend cuda "${small[@]}" "${moe[@]}" --save "$BUILD/staged_onemoe" \
                >"$BUILD/staged_onemoe.log" 2>&1; }; then
            say "| staged reference (one process on cuda) | FAIL ($BUILD/staged_one*.log) |"; fails=$((fails + 1)); break
        fi
        continue
    fi
    # shellcheck disable=SC2086
    if BRIGADE_COLL=$coll BRIGADE_LOG=info BRIGADE_TIMEOUT=60 timeout 120 "$B" launch -n "$n" -- "$B" train \
        --backend cuda "${small[@]}" $args --save "$BUILD/staged_$name" >"$BUILD/staged_$name.log" 2>&1 &&
        ! cuda_err "$BUILD/staged_$name.log"; then
        late=$(grep -o "[0-9]* of them later than queued" "$BUILD/staged_$name.log" | awk '{s += $1} END {print s + 0}')
        if [ "$tol" = bitwise ]; then v=$("$B" compare "$ref" "$BUILD/staged_$name"); else
            v=$("$B" compare "$ref" "$BUILD/staged_$name" --rel-l2 "${tol#l2:}"); fi
        rc=$?
        prov=$(grep -m1 -o "group (2 members): [a-z]*" "$BUILD/staged_$name.log" | sed 's/.*: //')
        host=$(sed -nE 's/.*host-held step: ([0-9]+) updates.*/\1/p' "$BUILD/staged_$name.log" | awk '{s += $1} END {print s + 0}')
        inpl=$(sed -nE 's/.*host-held step: [0-9]+ updates on the host, ([0-9]+) of them in place.*/\1/p' "$BUILD/staged_$name.log" | awk '{s += $1} END {print s + 0}')
        case $name in off*) [ "$host" = 0 ] && rc=1 v="$v; the host-held step did not run" ;; esac
        [ "$name" = offzero3 ] && [ "$inpl" = 0 ] && rc=1 v="$v; no update ran in place on the host-held shard"
        say "| staged $name on cuda vs $(case $name in off*) echo "${name#off} without offload" ;; *) echo "one process" ;; esac) ($tol) | $([ $rc = 0 ] && echo ok || echo FAIL): $v; $late requests waited for their copies${prov:+; collectives: $prov}$([ "$host" != 0 ] && echo "; $host updates on the host, $inpl in place") |"
        [ $rc = 0 ] || fails=$((fails + 1))
    else
        tail -5 "$BUILD/staged_$name.log"
        say "| staged $name on cuda | FAIL ($BUILD/staged_$name.log) |"
        fails=$((fails + 1))
    fi
done

# 10. a checkpoint of the host-held state, saved at step 5 and resumed to 10 (the same layout as offzero2)
half=(--layers 4 --d-model 64 --heads 4 --seq 32 --batch 8 --microbatches 4 --steps 5 --threads 1 --quiet)
rm -rf "$BUILD/ckoff"
if BRIGADE_TIMEOUT=60 timeout 120 "$B" launch -n 2 -- "$B" train --backend cuda "${half[@]}" --dp 2 --zero 2 \
        --offload optimizer --checkpoint-dir "$BUILD/ckoff" >"$BUILD/ckoff_save.log" 2>&1 &&
    ! cuda_err "$BUILD/ckoff_save.log" &&
    BRIGADE_TIMEOUT=60 timeout 120 "$B" launch -n 2 -- "$B" train --backend cuda "${small[@]}" --dp 2 --zero 2 \
        --offload optimizer --checkpoint-dir "$BUILD/ckoff" --resume --save "$BUILD/staged_ckoff" >"$BUILD/ckoff.log" 2>&1 &&
    ! cuda_err "$BUILD/ckoff.log" && grep -q "resuming from .*step-00000005" "$BUILD/ckoff.log"; then
    v=$("$B" compare "$BUILD/staged_offzero2" "$BUILD/staged_ckoff" --rel-l2 1e-5)
    rc=$?
    say "| checkpoint of --offload optimizer (dp 2 --zero 2) saved at 5, resumed to 10, vs never stopped (l2:1e-5) | $([ $rc = 0 ] && echo ok || echo FAIL): $v |"
    [ $rc = 0 ] || fails=$((fails + 1))
else
    tail -5 "$BUILD/ckoff_save.log" "$BUILD/ckoff.log"
    say "| checkpoint of --offload optimizer (dp 2 --zero 2) | FAIL ($BUILD/ckoff_save.log, $BUILD/ckoff.log) |"
    fails=$((fails + 1))
fi

[ "$ngpu" -ge 2 ] || say "| NCCL provider (BRIGADE_COLL=nccl) | skipped: $ngpu GPU (NCCL needs one per rank); $("$B" info | grep -m1 '^  nccl' | sed 's/^ *//') |"

mv "$REPORT.tmp" "$REPORT"
step "done: $fails failure(s); table in $REPORT"
[ $fails -eq 0 ]
