#!/usr/bin/env bash
# fuzz/run.sh BINARY SEEDS SECONDS [DICT]: one bounded libFuzzer run, as the
# fuzz_* CTest tests run it. The checked-in seeds are read, never written:
# new inputs go to $BG_FUZZ_WORK/corpus, a crashing input to
# $BG_FUZZ_WORK/crash-*. Exit status: libFuzzer's (non-zero on a crash, a
# leak, a timeout of one input, running out of memory, or any ASan/UBSan
# report). First every seed is run once on its own, so that a regression
# input in the corpus fails the test even when the time is short.
set -euo pipefail
bin=$1 seeds=$2 secs=$3 dict=${4:-}
work=${BG_FUZZ_WORK:-$(mktemp -d)}
mkdir -p "$work/corpus"
opts=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 "-artifact_prefix=$work/")
[ -n "$dict" ] && [ -f "$dict" ] && opts+=("-dict=$dict")
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "== $(basename "$bin"): every seed of $seeds once"
"$bin" "${opts[@]}" "$seeds"/*
echo "== $(basename "$bin"): fuzzing for $secs s"
"$bin" "${opts[@]}" -max_total_time="$secs" "$work/corpus" "$seeds"
