#!/usr/bin/env bash
# tests/runtime/test_soak.sh: a short bench/soak.sh in CI. 4,000 steps of a
# pp = 2 x dp = 2 job checkpointing every 5 with --keep 3: after step 1,000
# each rank's RssAnon and VmRSS grow by at most 48 bytes per step (a short
# run sees the heap grow by whole pages: up to ~10 B/step of noise; the leak
# below is 67 B/step at this checkpoint rate, checked by reverting it), its open
# descriptors and the allocator's peak not at all, and the checkpoint
# directory holds at most --keep complete checkpoints (plus the new one
# before the prune) and one .tmp-. (Rank 0's store kept three keys per
# checkpoint for the whole job: ~640 bytes per save. bench/soak.sh runs the long
# version: 50,000 steps, every 50, slopes 0-1.2 B/step.)
set -u
: "${BRIGADE:?path of the brigade binary}"
D=$(cd "$(dirname "$0")/../.." && pwd)
SOAK_EVERY=${SOAK_EVERY:-5} SOAK_MAX_B=${SOAK_MAX_B:-48} exec bash "$D/bench/soak.sh" 4000 0.2 1000
