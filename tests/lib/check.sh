# tests/lib/check.sh: ok / fail / check / finish for the shell tests whose
# helpers own their own scratch directory and cleanup (tests/launch/lib.sh,
# tests/netns/lib.sh). Sourced.
FAILS=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
# check "description" command args...: the command's status decides
check() {
    local desc=$1
    shift
    if "$@"; then ok "$desc"; else fail "$desc"; fi
}
finish() {
    if [ "$FAILS" -gt 0 ]; then
        echo "$FAILS check(s) failed" >&2
        exit 1
    fi
    echo "all checks passed"
    exit 0
}
