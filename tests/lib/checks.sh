# tests/lib/checks.sh: what the CLI test scripts share, sourced after they
# set B: a temporary directory $T removed at exit (background jobs ended
# first), and the ok / fail (alias bad) / check / finish of check.sh.
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
export BRIGADE_TIMEOUT=${BRIGADE_TIMEOUT:-60}
# shellcheck source=check.sh
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
bad() { fail "$@"; }
# expect_train RC NEEDLE ARGS...: brigade train ARGS fails with exit code RC and one line on
# stderr holding NEEDLE, training nothing (nothing on stdout)
expect_train() {
  local rc=$1 needle=$2; shift 2
  "$B" train "$@" >"$T/o" 2>"$T/e"
  local got=$?
  if [ $got != "$rc" ]; then bad "train $* exited $got, want $rc: $(cat "$T/e")"
  elif ! grep -qF -- "$needle" "$T/e"; then bad "train $*: stderr lacks \"$needle\": $(cat "$T/e")"
  elif [ "$(wc -l <"$T/e")" != 1 ]; then bad "train $*: not one line: $(cat "$T/e")"
  elif [ -s "$T/o" ]; then bad "train $*: trained: $(cat "$T/o")"
  else ok "$needle"; fi
}
# train_save NAME N ARGS...: `brigade train ARGS --quiet --save $T/NAME` on N ranks
# (brigade launch -n N when N > 1), bounded by $TRAIN_TIMEOUT seconds (default
# 120), its output in $T/NAME.log. A failure, or a report of leaked
# allocations, is a failed check naming the run, with the log's last lines.
train_save() {
  local name=$1 n=$2; shift 2
  local cmd=("$B" train "$@" --quiet --save "$T/$name")
  [ "$n" -gt 1 ] && cmd=("$B" launch -n "$n" -- "${cmd[@]}")
  if ! timeout "${TRAIN_TIMEOUT:-120}" "${cmd[@]}" >"$T/$name.log" 2>&1; then
    bad "$name: train on $n rank(s): $*"; grep -v WARN "$T/$name.log" | tail -3; return 1
  fi
  if grep -q "live allocations" "$T/$name.log"; then bad "$name: memory leaked"; return 1; fi
}
# same A B WHAT [COMPARE FLAGS...]: `brigade compare A B FLAGS` agrees (bitwise
# when no flags are given)
same() {
  local a=$1 b=$2 w=$3 v
  shift 3
  if v=$("$B" compare "$a" "$b" "$@"); then ok "$w: $v"; else bad "$w: $v"; fi
}
# near A B WHAT [COMPARE FLAGS...]: same, within the data-parallel tolerance
# unless flags say otherwise (AdamW's relative L2 1e-5 over all tensors)
near() {
  local a=$1 b=$2 w=$3
  shift 3
  [ $# = 0 ] && set -- --rel-l2 1e-5
  same "$a" "$b" "$w" "$@"
}
