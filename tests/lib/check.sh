# tests/lib/check.sh: ok / fail / check / finish for the shell tests, with
# the counters pass and fails. Sourced (checks.sh adds a scratch directory;
# tests/launch/lib.sh and tests/netns/lib.sh own theirs).
pass=0
fails=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# check "description" command args...: the command's status decides
check() {
    local desc=$1
    shift
    if "$@"; then ok "$desc"; else fail "$desc"; return 1; fi
}
finish() {
    echo "$pass passed, $fails failed"
    [ "$fails" -eq 0 ] || exit 1
    exit 0
}
