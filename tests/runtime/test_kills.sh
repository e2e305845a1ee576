#!/usr/bin/env bash
# tests/runtime/test_kills.sh: a handful of bench/kills.sh's trials in CI.
# Four trials of a pp = 2 x dp = 2 job, each killing a random rank at a
# random moment, the methods in turn (SIGKILL, SIGSTOP, the rank's store
# sockets closed with `ss -K`, SIGKILL), alternately without restarts (the
# launcher and the survivors must name the rank within the deadline) and
# with --max-restarts 3 (the weights must equal the uninterrupted run's,
# bitwise). No hang: every trial is bounded. The full hundred is a
# benchmark: docs/benchmarks.md.
set -u
: "${BRIGADE:?path of the brigade binary}"
D=$(cd "$(dirname "$0")/../.." && pwd)
KILLS_CYCLE=1 KILLS_STEPS=${KILLS_STEPS:-1000} exec bash "$D/bench/kills.sh" 4 "${KILLS_SEED:-16}"
