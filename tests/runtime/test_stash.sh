#!/usr/bin/env bash
# tests/runtime/test_stash.sh: on every rank and for every schedule, the
# executor's peak number of stashed microbatches (forward to last backward
# piece, counted as it runs) equals the simulator's prediction for that
# schedule, p = 4, m = 8 (and m = 3 < p, but for dualpipev and dualpipe, which need m >= 2p);
# and its peak activation bytes (the
# allocator's counters) equal the prediction (the planner's replay of the
# rank's program times its slot buffers, as brigade plan predicts them), to
# the printed kB, for every schedule (DualPipe and DualPipeV too, whose
# stages run full and split backwards both), and with --precision bf16.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60
# the cases: schedule:microbatches:precision (bf16: the blocks keep their activations in bf16, other sizes)
cases=""
for m in 8 3; do
  for s in gpipe 1f1b interleaved zb-h1 zb-h2 zbv zb-interleaved $([ $m -ge 8 ] && echo dualpipev dualpipe); do
    cases="$cases $s:$m:fp32"
  done
done
cases="$cases 1f1b:8:bf16 zb-h1:8:bf16 dualpipev:8:bf16"
for c in $cases; do
  IFS=: read -r s m prec <<<"$c"
  {
    if ! timeout 120 "$B" launch -n 4 -- "$B" train --layers 6 --d-model 16 --heads 2 --seq 8 --batch $((2 * m)) \
         --microbatches $m --steps 2 --threads 1 --pp 4 --schedule $s --precision $prec >"$T/o" 2>"$T/e"; then
      echo "FAIL: $s m=$m $prec did not run"; grep -v WARN "$T/e" | tail -3; fails=$((fails + 1)); continue
    fi
    # the rank table of rank 0: rank pp dp params peak act act_sim stashed stash_sim bubble
    rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 10 && $10 ~ /%$/' "$T/e")
    got=$(echo "$rows" | awk '{print $1 ":" $8 ":" $9}')
    n=0; ok=1
    for g in $got; do
      IFS=: read -r r meas sim <<<"$g"; n=$((n + 1))
      [ "$meas" = "$sim" ] || { ok=0; echo "FAIL: $s m=$m rank $r stashed $meas, simulator $sim"; }
    done
    bytes=$(echo "$rows" | awk '{print $1 ":" $6 ":" $7}')
    for g in $bytes; do
      IFS=: read -r r meas sim <<<"$g"
      [ "$meas" = "$sim" ] || { ok=0; echo "FAIL: $s m=$m rank $r activations $meas MiB, predicted $sim MiB"; }
    done
    if [ "$n" = 4 ] && [ "$ok" = 1 ]; then pass=$((pass + 1)); echo "ok   $s m=$m $prec: $(echo $got | tr '\n' ' ') bytes $(echo $bytes | tr '\n' ' ')";
    else fails=$((fails + 1)); [ "$n" = 4 ] || echo "FAIL: $s m=$m $prec: $n rank lines"; fi
  }
done
finish
