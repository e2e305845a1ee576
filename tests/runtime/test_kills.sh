#!/usr/bin/env bash
# tests/runtime/test_kills.sh: a handful of bench/kills.sh's trials in CI.
# Four trials of a pp = 2 x dp = 2 job, each killing a random rank at a
# random moment, the methods in turn (SIGKILL, SIGSTOP, the rank's store
# sockets closed with `ss -K`, SIGKILL), alternately without restarts (the
# launcher and the survivors must name the rank within the deadline) and
# with --max-restarts 3 (the weights must equal the uninterrupted run's,
# bitwise). No hang: every trial is bounded. The full hundred is a
# benchmark: docs/benchmarks.md.
. "$(dirname "$0")/../lib/harness.sh"
check "four kills (bench/kills.sh 4 ${KILLS_SEED:-16})" \
    env KILLS_CYCLE=1 KILLS_STEPS="${KILLS_STEPS:-1000}" bash "$SRC/bench/kills.sh" 4 "${KILLS_SEED:-16}"
finish
