#!/usr/bin/env bash
# tests/runtime/test_soak.sh: a short bench/soak.sh in CI. 4,000 steps of a
# pp = 2 x dp = 2 job checkpointing every 5 with --keep 3: after step 1,000
# each rank's C-library bytes in use (the metrics' heap_bytes) grow by at most
# 2 bytes per step in one half of the window at least (one malloc kept per
# checkpoint is >= 6.4 here, in both halves; measured with no leak: 0-0.2, and
# once 2.2 over the window from ~5 KB taken at one step of one rank), its RssAnon by at most 48 bytes per step in one half of the
# window at least (RSS moves in whole pages: CI once saw 55 pages taken at one
# step, 79.5 B/step fitted over the whole window, where a leak grows in both
# halves), its open descriptors and the allocator's peak not at all, and the checkpoint
# directory holds at most --keep complete checkpoints (plus the new one
# before the prune) and one .tmp-. (Rank 0's store kept three keys per
# checkpoint for the whole job: ~640 bytes per save. bench/soak.sh runs the long
# version: 50,000 steps, every 50, slopes 0-1.2 B/step.)
# The run is counted in steps, not seconds: on a loaded machine it only takes
# longer (the slopes are per step, the samples come every 0.2 s whatever the
# pace). A hung rank fails after BRIGADE_TIMEOUT (60 s) and takes the job
# down; CTest's TIMEOUT only stops a hung test.
. "$(dirname "$0")/../lib/harness.sh"
check "soak: 4,000 steps flat (bench/soak.sh 4000 0.2 1000)" \
    env SOAK_EVERY="${SOAK_EVERY:-5}" SOAK_MAX_B="${SOAK_MAX_B:-48}" SOAK_MAX_HEAP_B="${SOAK_MAX_HEAP_B:-2}" \
    bash "$SRC/bench/soak.sh" 4000 0.2 1000
finish
