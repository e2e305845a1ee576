# tests/tools/lib.sh: helpers shared by the CLI test scripts (sourced): the
# binary, a scratch directory removed on exit, and ok/bad/finish counting.
set -u
B=${BRIGADE:?path of the brigade binary}
T=$(mktemp -d "${TMPDIR:-/tmp}/bg-cli.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
finish() {
    if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
    echo "all checks passed"
    exit 0
}
