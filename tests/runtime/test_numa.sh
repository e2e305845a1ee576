#!/usr/bin/env bash
# tests/runtime/test_numa.sh: BRIGADE_NUMA=on binds each rank to node
# local_rank % nodes (node 0 on a one-node machine), auto binds only on
# machines with several nodes, off does nothing, a bad value is refused.
. "$(dirname "$0")/../lib/harness.sh"
run() { BRIGADE_NUMA=$1 BRIGADE_LOG=info timeout 60 "$B" launch -n 2 -- "$B" train --layers 2 --d-model 16 --heads 2 \
          --seq 16 --batch 4 --microbatches 2 --steps 1 --pp 2 --quiet 2>&1; }
out=$(run on)
n=$(echo "$out" | grep -c "bound to NUMA node\|NUMA unavailable")
[ "$n" = 2 ] && ok "on: $(echo "$out" | grep -m1 numa)" || { bad "on: $n rank lines"; echo "$out"; }
nodes=$(echo "$out" | grep -o "NUMA node [0-9]* of [0-9]*" | head -1 | awk '{print $5}')
if [ "${nodes:-0}" = 1 ]; then
  echo "$out" | grep -q "local rank 1 bound to NUMA node 0 of 1" && ok "one node: rank 1 on node 0" || bad "rank 1 placement"
  run auto | grep -q "one NUMA node: nothing to bind" && ok "auto on one node: no binding" || bad "auto"
fi
run off | grep -qi "numa" && bad "off still logs NUMA" || ok "off"
run bogus | grep -q 'BRIGADE_NUMA="bogus": expected auto, on or off' && ok "bad value refused" || bad "bad value"
finish
