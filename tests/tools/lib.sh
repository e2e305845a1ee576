# tests/tools/lib.sh: helpers shared by the CLI test scripts (sourced): the
# binary, a scratch directory removed on exit, and ok/bad/finish counting.
set -u
B=${BRIGADE:?path of the brigade binary}
T=$(mktemp -d "${TMPDIR:-/tmp}/bg-cli.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# expect CODE LITERAL-MESSAGE ARGS...: `brigade ARGS` exits CODE, its stderr
# contains the message and says nothing twice
expect() {
    local code=$1 msg=$2 rc
    shift 2
    timeout -s KILL 60 "$B" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" != "$code" ] || ! grep -qF -- "$msg" "$T/err"; then
        bad "brigade $*: expected exit $code and '$msg', got $rc and: $(cat "$T/err")"
    elif [ -n "$(sort "$T/err" | uniq -d)" ]; then
        bad "brigade $*: a line repeats: $(cat "$T/err")"
    else
        ok "brigade $* -> $rc"
    fi
}
finish() {
    if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
    echo "all checks passed"
    exit 0
}
