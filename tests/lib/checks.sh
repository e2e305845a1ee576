# tests/lib/checks.sh: what the CLI test scripts share, sourced after they
# set B: a temporary directory $T removed at exit (background jobs ended
# first), and the ok / fail (alias bad) / check / finish of check.sh.
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
export BRIGADE_TIMEOUT=${BRIGADE_TIMEOUT:-60}
# shellcheck source=check.sh
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
bad() { fail "$@"; }
