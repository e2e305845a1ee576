#!/usr/bin/env bash
# tests/tools/test_bench_kernels.sh: `brigade bench kernels --json`'s GPT
# training section. The GEMM shapes and other operations it recorded inside
# the step must be those of the model, counted independently here in closed
# form (2 blocks of d_model 256 and the 256-wide head, 256 rows per
# microbatch, 16 microbatches per step: a forward x W^T, an input gradient
# dy W and an accumulated weight gradient dy^T x for every linear layer; per
# microbatch and block one attention, one fused bias + GELU, two LayerNorms,
# ...), and their FLOPs and times must add up to the totals the bench
# reports. No speed is asserted (benchmarks are not timed tests): only that
# the figures exist, are positive and agree with each other.
. "$(dirname "$0")/../lib/harness.sh"

timeout 300 "$B" bench kernels --threads 1 --repeat 1 --sizes 64 --json "$T/kb.json" >"$T/out" 2>"$T/err" ||
    bad "bench kernels failed: $(cat "$T/err")"
grep -q "the step's GEMMs by shape" "$T/out" && ok "the per-shape table is printed" ||
    bad "no per-shape table in: $(cat "$T/out")"

python3 - "$T/kb.json" <<'EOF' && ok "recorded GEMM shapes match the model's, totals agree" || bad "bench JSON check failed"
import json, sys
g = json.load(open(sys.argv[1]))["gpt_training"]
d, rows, mb, layers, vocab = 256, 256, 16, 2, 256
want = {}
def add(key, calls):
    want[key] = want.get(key, 0) + calls
# (c_in, c_out, per block?) of each linear layer: qkv, attention projection, fc, MLP projection, head
for ci, co, per_block in [(d, 3 * d, 1), (d, d, 1), (d, 4 * d, 1), (4 * d, d, 1), (d, vocab, 0)]:
    n = (layers if per_block else 1) * mb
    add((False, True, rows, co, ci, 1, False), n)   # forward: x W^T
    add((False, False, rows, ci, co, 1, False), n)  # input gradient: dy W
    add((True, False, co, ci, rows, 1, True), n)    # weight gradient: dy^T x, accumulated
got = {}
for s in g["gemm_shapes"]:
    key = (s["trans_a"], s["trans_b"], s["m"], s["n"], s["k"], s["batch"], s["accumulate"])
    assert key not in got, f"shape listed twice: {key}"
    got[key] = s["calls_per_step"]
    assert s["alone_ms"] > 0 and s["in_step_ms"] > 0, f"non-positive time for {key}: {s}"
assert got == want, f"recorded shapes {got}\n  differ from the model's {want}"
flop = sum(2.0 * m * n * k * b * c for (ta, tb, m, n, k, b, acc), c in got.items())
for name in ("gemm_gflop", "gemm_in_step_gflop"):
    assert abs(g[name] * 1e9 - flop) <= 1e-9 * flop, f"{name} {g[name]} != {flop / 1e9} from the shapes"
alone = sum(s["alone_ms"] * s["calls_per_step"] for s in g["gemm_shapes"])
assert abs(alone - g["gemm_ms"]) <= 1e-6 * alone, f"gemm_ms {g['gemm_ms']} != {alone} from the shapes"
in_step = sum(s["in_step_ms"] for s in g["gemm_shapes"])
assert abs(in_step - g["gemm_in_step_ms"]) <= 1e-6 * in_step, f"gemm_in_step_ms {g['gemm_in_step_ms']} != {in_step}"
assert 0 < g["gemm_in_step_ms"] < g["step_ms"], f"GEMMs inside the step {g['gemm_in_step_ms']} ms of a {g['step_ms']} ms step"
assert g["gflop_per_step"] * 1e9 > flop, "the step's FLOPs must exceed its GEMMs' (attention, ...)"
for k in ("peak_gflops", "fraction_of_peak", "gflops"):
    assert g[k] > 0, f"{k} = {g[k]}"
# the other operations, timed inside the same step (--repeat 1: one step, so the
# timed parts cannot add up to more than it)
ops = g["ops_in_step"]
per_mb = {"attention_forward": layers, "attention_backward": layers, "bias_gelu_forward": layers,
          "gelu_bias_backward": layers, "layernorm_forward": 2 * layers + 1,
          "layernorm_backward_input": 2 * layers + 1, "crossentropy_forward": 1, "crossentropy_backward": 1,
          "embedding_forward": 1, "embedding_backward": 1}
for name, n in per_mb.items():
    assert name in ops, f"{name} not timed in the step: {sorted(ops)}"
    assert ops[name]["calls_per_step"] == n * mb, f"{name}: {ops[name]['calls_per_step']} calls, want {n * mb}"
for name in ("gelu_forward", "gelu_backward"):  # fused with the bias by default (BRIGADE_FUSE=on)
    assert name not in ops, f"{name} ran unfused: {ops[name]}"
assert ops["adamw"]["calls_per_step"] >= 1, "the optimizer step was not timed"
timed = g["gemm_in_step_ms"] + sum(o["ms"] for o in ops.values())
assert 0 < timed <= g["step_ms"], f"GEMMs and operations {timed} ms in a {g['step_ms']} ms step"
EOF

# --attention: the fused attention alone, at a shape given, under the ISA asked for
timeout 120 "$B" bench kernels --threads 1 --repeat 2 --attention 1,40,2,32 --json "$T/att.json" >"$T/att" 2>"$T/err" ||
    bad "bench kernels --attention failed: $(cat "$T/err")"
grep -q "^  attention B=1 T=40 NH=2 hs=32 (causal): fwd+bwd " "$T/att" && ok "--attention prints its shape" ||
    bad "no attention line in: $(cat "$T/att")"
python3 - "$T/att.json" <<'EOF' && ok "--attention JSON: one shape, positive times" || bad "--attention JSON check failed"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["isa"] in ("avx512", "avx2", "default"), j["isa"]
(a,) = j["ops"]
assert (a["op"], a["B"], a["T"], a["NH"], a["hs"]) == ("attention", 1, 40, 2, 32), a
assert 0 < a["backward_ms"] < a["ms"] and 0 < a["cpu_backward_ms"] < a["cpu_ms"], a
EOF
BRIGADE_CPU_ISA=default timeout 120 "$B" bench kernels --threads 1 --repeat 1 --attention 1,8,1,16 >"$T/att" 2>"$T/err" &&
    grep -q "kernels default, OpenBLAS core" "$T/att" && ok "BRIGADE_CPU_ISA=default runs the default kernels" ||
    bad "BRIGADE_CPU_ISA=default: $(cat "$T/att" "$T/err")"
if BRIGADE_CPU_ISA=sse9 timeout 60 "$B" bench kernels --attention 1,8,1,16 >"$T/att" 2>"$T/err"; then
    bad "BRIGADE_CPU_ISA=sse9 was accepted"
else
    grep -q 'BRIGADE_CPU_ISA="sse9"' "$T/err" && ok "an unknown BRIGADE_CPU_ISA fails naming it" ||
        bad "BRIGADE_CPU_ISA=sse9: $(cat "$T/err")"
fi

# a BLAS core wider than the ISA BRIGADE_CPU_ISA asks for is named in a warning; the ISA's own core is not
if "$B" info 2>/dev/null | grep -q "^cpu kernels: avx"; then
    OPENBLAS_CORETYPE=Haswell BRIGADE_CPU_ISA=default timeout 60 "$B" info >/dev/null 2>"$T/err"
    grep -q 'BRIGADE_CPU_ISA=default, but OpenBLAS runs its "Haswell" kernels (chosen by: OPENBLAS_CORETYPE)' "$T/err" &&
        ok "OPENBLAS_CORETYPE=Haswell under BRIGADE_CPU_ISA=default is warned about" ||
        bad "no warning for OPENBLAS_CORETYPE=Haswell under BRIGADE_CPU_ISA=default: $(cat "$T/err")"
    env -u OPENBLAS_CORETYPE -u BRIGADE_BLAS_CORE BRIGADE_CPU_ISA=default timeout 60 "$B" info >/dev/null 2>"$T/err"
    grep -q "but OpenBLAS runs its" "$T/err" && bad "BRIGADE_CPU_ISA=default alone warned: $(cat "$T/err")" ||
        ok "BRIGADE_CPU_ISA=default alone picks a core that is not wider"
fi

# --llama: the Llama kernels at one small shape, every op once, positive times; bad shapes refused
timeout 120 "$B" bench kernels --threads 1 --repeat 1 --llama 1,16,2,2,8,24 --json "$T/ll.json" >"$T/ll" 2>"$T/err" ||
    bad "bench kernels --llama failed: $(cat "$T/err")"
python3 - "$T/ll.json" <<'EOF' && ok "--llama JSON: the nine Llama ops, positive times" || bad "--llama JSON check failed"
import json, sys
ops = json.load(open(sys.argv[1]))["ops"]
names = ["rmsnorm_forward", "rmsnorm_backward_input", "rmsnorm_backward_weight", "swiglu_forward",
         "swiglu_backward", "rope", "gqa_expand", "gqa_reduce", "gqa_attention fwd+bwd"]
assert [o["op"] for o in ops] == names, [o["op"] for o in ops]
for o in ops:
    assert o["shape"] == [1, 16, 2, 2, 8, 24] and o["ms"] > 0 and o["cpu_ms"] >= 0, o
EOF
for bad_shape in 1,16,2,2,8 1,16,2,2,7,24 1,16,0,2,8,24; do
    if timeout 60 "$B" bench kernels --llama "$bad_shape" >"$T/ll" 2>"$T/err"; then
        bad "--llama $bad_shape was accepted"
    else
        grep -q -- "--llama: expected B,T,G,g,HS,H" "$T/err" && ok "--llama $bad_shape is refused, naming the flag" ||
            bad "--llama $bad_shape: $(cat "$T/err")"
    fi
done

finish
