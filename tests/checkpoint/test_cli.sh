#!/usr/bin/env bash
# tests/checkpoint/test_cli.sh: `brigade plot` and `brigade generate` as a
# user meets them: a chart that parses as SVG and holds the right points,
# generation from a `train --save` directory, and bad input that fails with
# a message naming the file (and line), non-zero.
. "$(dirname "$0")/../lib/harness.sh"
# expect_fail CODE "pattern" args...: exit CODE and the pattern on stderr
expect_fail() {
    local code=$1 pat=$2; shift 2
    "$B" "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ $rc = "$code" ] && grep -q -- "$pat" "$T/err"; then ok "brigade $* -> $rc, '$pat'"; else
        bad "brigade $*: exit $rc (want $code), stderr: $(cat "$T/err")"; fi
}

# ---- plot: two ranks, a resumed run repeating steps 3-4, no tokens_per_s on one line
cat >"$T/m.jsonl" <<'J'
{"step": 1, "loss": 5.5, "tokens_per_s": 1000.0, "step_ms": 10, "rank": 0}
{"step": 1, "loss": 9.9, "tokens_per_s": 10.0, "step_ms": 10, "rank": 1}
{"step": 2, "loss": 5.0, "tokens_per_s": 1100.0, "step_ms": 10, "rank": 0}
{"step": 3, "loss": 7.0, "tokens_per_s": 1200.0, "step_ms": 10, "rank": 0}
{"step": 4, "loss": 7.0, "tokens_per_s": 1200.0, "step_ms": 10, "rank": 0}

{"step": 3, "loss": 4.5, "tokens_per_s": 1250.0, "step_ms": 10, "rank": 0}
{"step": 4, "loss": 4.0, "step_ms": 10, "rank": 0}
{"step": 5, "loss": 3.5, "tokens_per_s": 1300.0, "step_ms": 10, "rank": 0}
J
check "plot succeeds" "$B" plot "$T/m.jsonl" --out "$T/loss.svg" --title 'a <b> & "c"'
python3 - "$T/loss.svg" <<'PY' && ok "SVG parses; rank 0's points, last line of each step win" || bad "SVG content"
import sys, xml.dom.minidom as md
d = md.parse(sys.argv[1])
svg = d.documentElement
assert svg.tagName == "svg" and svg.getAttribute("xmlns") == "http://www.w3.org/2000/svg"
lines = d.getElementsByTagName("polyline")
assert len(lines) == 2, len(lines)
loss = [tuple(map(float, p.split(","))) for p in lines[0].getAttribute("points").split()]
tps = [tuple(map(float, p.split(","))) for p in lines[1].getAttribute("points").split()]
assert len(loss) == 5 and len(tps) == 4, (len(loss), len(tps))
xs = [p[0] for p in loss]
assert xs == sorted(xs) and len(set(xs)) == 5
ys = [p[1] for p in loss]            # SVG y grows downwards: the loss falls, y rises
assert all(b > a for a, b in zip(ys, ys[1:])), ys
title = d.getElementsByTagName("text")[0].firstChild.data
assert 'a <b> & "c"' in title, title
PY
check "plot --rank 1 picks rank 1's single line" "$B" plot "$T/m.jsonl" --out "$T/r1.svg" --rank 1
python3 -c "import xml.dom.minidom as m,sys; d=m.parse(sys.argv[1]); assert len(d.getElementsByTagName('polyline')[0].getAttribute('points').split())==1" "$T/r1.svg" \
    && ok "rank 1: one point" || bad "rank 1 points"
expect_fail 1 "cannot open $T/nope.jsonl" plot "$T/nope.jsonl" --out "$T/x.svg"
printf '{"step": 1, "loss": 2}\n{"step": 2, "loss": 1}\n{"step": 3, "loss": \n' >"$T/bad1.jsonl"
expect_fail 1 "bad1.jsonl:3: not a JSON object" plot "$T/bad1.jsonl" --out "$T/x.svg"
printf '{"step": 1, "loss": 2}\n{"step": 2, "los": 1}\n' >"$T/bad2.jsonl"
expect_fail 1 'bad2.jsonl:2: expected "loss"' plot "$T/bad2.jsonl" --out "$T/x.svg"
printf '{"step": "one", "loss": 2}\n' >"$T/bad3.jsonl"
expect_fail 1 'bad3.jsonl:1: expected "step"' plot "$T/bad3.jsonl" --out "$T/x.svg"
: >"$T/empty.jsonl"
expect_fail 1 "has no metrics lines" plot "$T/empty.jsonl" --out "$T/x.svg"
expect_fail 1 "no lines of rank 7" plot "$T/m.jsonl" --out "$T/x.svg" --rank 7
expect_fail 2 "missing --out" plot "$T/m.jsonl"
expect_fail 1 "cannot write $T/no/such/dir.svg" plot "$T/m.jsonl" --out "$T/no/such/dir.svg"
check "no SVG left by the failures" [ ! -e "$T/x.svg" ]

# ---- generate from a --save directory (single-process runs store the configuration)
"$B" train --layers 1 --d-model 16 --heads 2 --seq 16 --batch 4 --microbatches 2 --threads 1 --steps 3 \
    --save "$T/save" --quiet >/dev/null 2>&1 || bad "tiny training run"
"$B" generate --checkpoint "$T/save" --prompt "And God" --tokens 25 --seed 5 >"$T/g1" 2>"$T/err" || bad "generate: $(cat "$T/err")"
"$B" generate --checkpoint "$T/save" --prompt "And God" --tokens 25 --seed 5 >"$T/g2" 2>/dev/null
"$B" generate --checkpoint "$T/save" --prompt "And God" --tokens 25 --seed 6 >"$T/g3" 2>/dev/null
check "generate: prompt + 25 bytes + newline" [ "$(wc -c <"$T/g1")" = $((7 + 25 + 1)) ]
check "generate starts with the prompt" [ "$(head -c 7 "$T/g1")" = "And God" ]
check "same seed, same text" cmp -s "$T/g1" "$T/g2"
if cmp -s "$T/g1" "$T/g3"; then bad "another seed gave the same text"; else ok "another seed, another text"; fi
"$B" generate --checkpoint "$T/save" --prompt "x" --tokens 10 --temperature 0 --seed 1 >"$T/gr1" 2>/dev/null
"$B" generate --checkpoint "$T/save" --prompt "x" --tokens 10 --temperature 0 --seed 2 >"$T/gr2" 2>/dev/null
check "greedy ignores the seed" cmp -s "$T/gr1" "$T/gr2"
# a pipeline run (2 stages): its --save stage files and its checkpoint give the same greedy text
G2="--model gpt --layers 3 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --threads 1 --quiet"
timeout 120 "$B" launch -n 2 -- "$B" train $G2 --steps 4 --pp 2 --save "$T/pps" --checkpoint-dir "$T/ppc" \
    --checkpoint-every 2 >/dev/null 2>"$T/err" || bad "pp 2 run: $(cat "$T/err")"
"$B" generate --checkpoint "$T/pps" --prompt "In the" --tokens 20 --temperature 0 >"$T/p1" 2>"$T/err" || bad "generate from stage files: $(cat "$T/err")"
"$B" generate --checkpoint "$T/ppc" --prompt "In the" --tokens 20 --temperature 0 >"$T/p2" 2>"$T/err" || bad "generate from a checkpoint root: $(cat "$T/err")"
check "generate names the newest checkpoint" grep -q "ppc/step-00000004 (step 4)" "$T/err"
"$B" generate --checkpoint "$T/ppc/step-00000004" --prompt "In the" --tokens 20 --temperature 0 >"$T/p3" 2>/dev/null
check "stage files and checkpoint: same greedy text" cmp -s "$T/p1" "$T/p2"
check "a checkpoint directory itself works too" cmp -s "$T/p2" "$T/p3"
check "27 bytes of output" [ "$(wc -c <"$T/p1")" = 27 ]

expect_fail 2 "missing --checkpoint" generate --prompt hi
expect_fail 2 "missing --prompt" generate --checkpoint "$T/save"
expect_fail 2 "is not a directory" generate --checkpoint "$T/none" --prompt hi
mkdir "$T/emptydir"
expect_fail 1 "no complete checkpoint and no model description" generate --checkpoint "$T/emptydir" --prompt hi
expect_fail 2 "--temperature must be in" generate --checkpoint "$T/save" --prompt hi --temperature -1

finish
