# tests/lib/checks.sh: what the CLI test scripts share, sourced after they
# set B: a temporary directory $T removed at exit (background jobs ended
# first), the ok/bad counters and finish (the summary line and the status).
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
export BRIGADE_TIMEOUT=${BRIGADE_TIMEOUT:-60}
pass=0; fails=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fails=$((fails + 1)); echo "FAIL: $*"; }
finish() { echo "$pass passed, $fails failed"; [ "$fails" = 0 ]; }
