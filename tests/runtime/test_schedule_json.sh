#!/usr/bin/env bash
# tests/runtime/test_schedule_json.sh: brigade train --schedule-json runs any
# program the validator accepts. Random valid programs (random topological
# orders of a generated program's instructions, tests/runtime/random_program.py,
# judged by brigade's validator) train bitwise equal to one process, at pp = 2
# and 4, GPT and MLP. Bad programs (not valid, another p, m or layer count)
# end with one clear line before the rank starts.
. "$(dirname "$0")/../lib/harness.sh"
HERE=$(cd "$(dirname "$0")" && pwd)

GPT="--model gpt --layers 6 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --steps 3 --threads 1 --lr 3e-3"
MLP="--model mlp --layers 4 --d-model 24 --in-features 12 --classes 6 --batch 16 --microbatches 4 --steps 3 --threads 1 --lr 3e-3"
"$B" train $GPT --quiet --save "$T/gpt" >"$T/gpt.log" 2>&1 || { bad "gpt reference"; cat "$T/gpt.log"; }
"$B" train $MLP --quiet --save "$T/mlp" >"$T/mlp.log" 2>&1 || { bad "mlp reference"; cat "$T/mlp.log"; }

# rand REF "MODEL FLAGS" SCHEDULE PP CHUNKS SEED: a random order of SCHEDULE's program, trained at PP ranks
rand() {
  local ref=$1 model=$2 sched=$3 pp=$4 chunks=$5 seed=$6 n=$((pass + fails))
  local gen="$T/gen$n.json" prog="$T/prog$n.json" out="$T/out$n" ch=""
  [ "$chunks" != 0 ] && ch="--chunks $chunks"
  "$B" schedule --schedule "$sched" --stages "$pp" --microbatches 4 $ch --json "$gen" --no-text >/dev/null ||
    { bad "brigade schedule $sched"; return; }
  python3 "$HERE/random_program.py" "$gen" "$prog" "$seed" || { bad "random order of $sched"; return; }
  local v
  v=$("$B" schedule --from-json "$prog" --text 2>&1) || { bad "$sched seed $seed: the validator rejects the random order: $v"; return; }
  if [ "$("$B" schedule --from-json "$gen" --text | sed 1d | head -"$pp")" = "$(echo "$v" | sed 1d | head -"$pp")" ]; then
    bad "$sched seed $seed: the random order is the generated one"; return
  fi
  if ! timeout 120 "$B" launch -n "$pp" -- "$B" train $model --pp "$pp" --schedule-json "$prog" --quiet --save "$out" \
      >"$out.log" 2>&1; then
    bad "$sched pp $pp seed $seed: training failed"; grep -v WARN "$out.log" | tail -5; return
  fi
  local verdict
  if verdict=$("$B" compare "$T/$ref" "$out"); then ok "$ref $sched pp $pp seed $seed :: $verdict"
  else bad "$ref $sched pp $pp seed $seed :: $verdict"; fi
}
rand gpt "$GPT" zbv 2 0 1
rand gpt "$GPT" zbv 2 0 2
rand gpt "$GPT" zb-h1 4 0 3
rand gpt "$GPT" 1f1b 4 0 4
rand gpt "$GPT" interleaved 2 2 5
rand gpt "$GPT" zb-interleaved 2 3 6
rand mlp "$MLP" zbv 2 0 7
rand mlp "$MLP" zb-h2 2 0 8
rand gpt "$GPT" dualpipev 2 0 9
# two model copies: the reference is two data-parallel replicas of m/2 (test_dualpipe.sh says why)
timeout 120 "$B" launch -n 2 -- "$B" train ${GPT/--microbatches 4/--microbatches 2} --dp 2 --quiet --save "$T/gptdp" \
  >"$T/gptdp.log" 2>&1 || { bad "gpt dp 2 reference"; cat "$T/gptdp.log"; }
rand gptdp "$GPT" dualpipe 2 0 10

# Weight gradients out of microbatch order run in it: torch's LoopedBFS
# (backwards last microbatch first, written from torch's ScheduleLoopedBFS)
# read from its CSV, and a ZB-H1 program with two Ws swapped, both train
# bitwise equal to one process; the input halves stay where listed.
ooo() { # NAME PROGRAM: trained at pp 2, compared with one process
  local out="$T/$1"
  if ! timeout 120 "$B" launch -n 2 -- "$B" train $GPT --pp 2 --schedule-json "$2" --quiet --save "$out" >"$out.log" 2>&1; then
    bad "$1: training failed"; grep -v WARN "$out.log" | tail -5; return
  fi
  local verdict
  if verdict=$("$B" compare "$T/gpt" "$out"); then ok "$1 :: $verdict"; else bad "$1 :: $verdict"; fi
}
python3 - "$T/lbfs.csv" <<'PY'
import sys
p, v, m = 2, 2, 4
rows = []
for r in range(p):  # torch's ScheduleLoopedBFS._calculate_single_rank_operations
    stages = range(r, p * v, p)
    ops = [""] * r + [f"{s}F{mb}" for s in stages for mb in range(m)] + [""] * (2 * (p - 1 - r))
    ops += [f"{s}B{mb}" for s in reversed(stages) for mb in reversed(range(m))]
    rows.append(",".join(ops))
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY
"$B" schedule --from-torch-csv "$T/lbfs.csv" --json "$T/lbfs.json" --text >"$T/lbfs.out" 2>&1 ||
  bad "LoopedBFS from torch's CSV: $(cat "$T/lbfs.out")"
grep -q "^rank 0 | F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 b3.1 b2.1 b1.1 B0.1 W1.1 W2.1 W3.1 b3.0 b2.0 b1.0 B0.0 W1.0 W2.0 W3.0$" \
  "$T/lbfs.out" && ok "LoopedBFS: input halves where listed, weight halves in microbatch order" ||
  bad "LoopedBFS order: $(cat "$T/lbfs.out")"
ooo lbfs "$T/lbfs.json"
"$B" schedule --schedule zb-h1 --stages 2 --microbatches 4 --json "$T/zbh1_2.json" --no-text >/dev/null
python3 - "$T/zbh1_2.json" "$T/wswap.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def swap(ops):  # the first W whose successor's B comes before it: swap the two Ws
    pos = lambda kind, mb: next(k for k, o in enumerate(ops) if o["kind"] == kind and o["microbatch"] == mb)
    for mb in range(3):
        i, j = pos("backward_weight", mb), pos("backward_weight", mb + 1)
        if pos("backward_input", mb + 1) < i:
            ops[i], ops[j] = ops[j], ops[i]
            return True
if not any(swap(r["ops"]) for r in d["ranks"]):
    sys.exit("no two Ws to swap")
json.dump(d, open(sys.argv[2], "w"))
PY
"$B" schedule --from-json "$T/wswap.json" --no-text >"$T/wswap.out" 2>&1 && grep -q "^note: 1 weight gradients run after" "$T/wswap.out" &&
  ok "swapped Ws: brigade schedule says one moved" || bad "swapped Ws: $(cat "$T/wswap.out")"
ooo wswap "$T/wswap.json"

"$B" schedule --schedule zbv --stages 2 --microbatches 4 --json "$T/zbv2.json" --no-text >/dev/null
"$B" schedule --schedule zb-h1 --stages 4 --microbatches 4 --json "$T/zbh1.json" --no-text >/dev/null
"$B" schedule --schedule zbv --stages 4 --microbatches 4 --json "$T/zbv4.json" --no-text >/dev/null
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
d = json.load(open(t + "/zbv2.json"))
ops = d["ranks"][1]["ops"]          # rank 1: a W moved before the send_grad of its gradient
i = next(k for k, o in enumerate(ops) if o["kind"] == "send_grad")
j = next(k for k, o in enumerate(ops) if o["kind"] == "backward_weight" and o["microbatch"] == ops[i]["microbatch"]
         and o["stage"] == ops[i]["stage"])
ops.insert(i, ops.pop(j))
json.dump(d, open(t + "/late_send.json", "w"))
PY
deadlock_json "$T/zbv2.json" "$T/dead.json"
expect_train 1 "late_send.json does not validate: invalid schedule: rank 1 op" $GPT --pp 2 --schedule-json "$T/late_send.json"
expect_train 1 "frees the input gradient that send_grad" $GPT --pp 2 --schedule-json "$T/late_send.json"
expect_train 1 "dead.json does not validate: deadlock" $GPT --pp 2 --schedule-json "$T/dead.json"
expect_train 1 "zbh1.json is a program for p=4 pipeline ranks, but the job has 2 (--pp)" $GPT --pp 2 --schedule-json "$T/zbh1.json"
expect_train 1 "zbv2.json is a program for m=4 microbatches, but the job runs 8 (--microbatches)" $GPT --pp 2 --microbatches 8 --schedule-json "$T/zbv2.json"
expect_train 2 "zbv4.json is a program for 8 pipeline stages (p 4 x 2 chunks) but the model has only 7 layers" \
  --model gpt --layers 4 --d-model 16 --heads 2 --seq 16 --pp 4 --schedule-json "$T/zbv4.json"
expect_train 2 "--schedule-json takes the schedule and its chunks from" $GPT --pp 2 --schedule zbv --schedule-json "$T/zbv2.json"
expect_train 1 "cannot open $T/none.json" $GPT --pp 2 --schedule-json "$T/none.json"
# a program far larger than any of this job's shape (a valid one padded with
# 8 MB of spaces) is refused from its size, before it is parsed
python3 -c "import sys; d = open(sys.argv[1]).read(); open(sys.argv[2], 'w').write(d[:-1] + ' ' * (8 << 20) + d[-1:])" \
  "$T/zbv2.json" "$T/huge.json"
expect_train 1 "huge.json is $(stat -c %s "$T/huge.json") bytes, larger than any program for 2 pipeline ranks x 4 microbatches x up to 64 chunks can be" \
  $GPT --pp 2 --schedule-json "$T/huge.json"
# under the launcher the ranks stop with the validator's line before connecting (the launcher
# stops the others when the first exits)
if timeout 60 "$B" launch -n 2 -- "$B" train $GPT --pp 2 --schedule-json "$T/dead.json" >"$T/l.out" 2>"$T/l.err"; then
  bad "launch with a deadlocking program exited 0"
elif ! grep -q "dead.json does not validate: deadlock: cycle: rank 0 -> rank 1 -> rank 0" "$T/l.err" || [ -s "$T/l.out" ]; then
  bad "launch with a deadlocking program: $(cat "$T/l.out" "$T/l.err")"
else ok "launch -n 2 with a deadlocking program: refused with the wait cycle"; fi

finish
