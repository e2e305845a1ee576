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
