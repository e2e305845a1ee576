#!/usr/bin/env bash
# bench/netns_overlap.sh BUILD_DIR [RATE] [RUNS]: overlap of pipeline transfers
# with compute across two hosts (network namespaces, netns_hosts of
# tests/lib/harness.sh; root).
# pp = 2 x dp = 1, GPT 4 x 128, seq 64, 8 microbatches, one rank per host, UCX
# over TCP on the veth, the links limited to RATE (tbf on each host's eth0;
# default 90mbit: the 8 x 64 KiB activations of a step then take about half of
# a stage's compute here). netem is not used: this machine's kernel lacks it.
# Each run prints measured step / compute-only critical path, where the
# critical path is `brigade simulate --from-trace` with free links (per-stage
# median F, B times from the same trace); target <= 1.10. RUNS runs with the
# limit, then RUNS without (default 3).
set -u
BUILD=${1:?usage: bench/netns_overlap.sh BUILD_DIR [RATE] [RUNS]}
RATE=${2:-90mbit}
RUNS=${3:-3}
export BRIGADE=$(cd "$BUILD" && pwd)/brigade
NETNS_LIMIT=600
source "$(dirname "$0")/../tests/lib/harness.sh"
netns_init
export BRIGADE_TIMEOUT=120 JOB_LIMIT=300
netns_hosts 2
ARGS=(--layers 4 --d-model 128 --heads 4 --seq 64 --batch 16 --microbatches 8 --steps 12 --threads 1
      --pp 2 --dp 1 --quiet)
for limit in "$RATE" none; do
    for i in 0 1; do
        tc -n "${H[i]}" qdisc del dev eth0 root 2>/dev/null
        [ "$limit" = none ] || tc -n "${H[i]}" qdisc add dev eth0 root tbf rate "$limit" burst 64kb latency 200ms
    done
    for ((run = 1; run <= RUNS; run++)); do
        job_start bench "0 1" "${ARGS[@]}" --trace "$T/t.json"
        job_wait
        job_ok bench 2 || exit 1
        line=$("$BRIGADE" simulate --from-trace "$T/t.json" | grep '^simulated step')
        echo "link $limit run $run: $line" |
            awk '{r = $0; sub(/.*= /, "", r); printf "%s  => step / compute-only path = %.2f\n", $0, 1 / r}'
    done
done
