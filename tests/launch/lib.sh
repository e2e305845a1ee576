# tests/launch/lib.sh: helpers shared by the `brigade launch` test scripts
# (sourced). Owns a scratch directory and kills every process recorded
# there on exit, so a failing test never leaves ranks behind.
set -u
: "${BRIGADE:?BRIGADE must be the path of the brigade binary}"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/bg-launch.XXXXXX")
LPID=

cleanup() {
    local f
    for f in "$T"/pid.* "$T"/gpid.*; do
        [ -f "$f" ] || continue
        # only our own leftovers: a recycled pid belongs to someone else
        grep -qaE 'sleep|rank\.sh' "/proc/$(cat "$f")/cmdline" 2>/dev/null && kill -KILL "$(cat "$f")" 2>/dev/null
    done
    [ -n "$LPID" ] && kill -KILL "$LPID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT

source "$HERE/../lib/check.sh"

# microseconds since the epoch, and milliseconds since a start in microseconds
now_us() { echo "${EPOCHREALTIME/./}"; }
ms_since() { echo $((($(now_us) - $1) / 1000)); }

# is pid alive (a zombie counts as dead)?
alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}
# process state letter (R, S, T, Z...) or empty
pstate() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1; }

# wait_files DIR-GLOB-PREFIX COUNT SECONDS: wait until COUNT files $T/PREFIX.* exist and are non-empty
wait_files() {
    local prefix=$1 count=$2 limit_ms=$(($3 * 1000)) t0 n f
    t0=$(now_us)
    while :; do
        n=0
        for f in "$T/$prefix".*; do [ -s "$f" ] && n=$((n + 1)); done
        [ "$n" -ge "$count" ] && return 0
        [ "$(ms_since "$t0")" -ge "$limit_ms" ] && return 1
        sleep 0.02
    done
}

# all_dead PREFIX SECONDS: every pid recorded in $T/PREFIX.* is gone within SECONDS
all_dead() {
    local prefix=$1 limit_ms=$(($2 * 1000)) t0 f any
    t0=$(now_us)
    while :; do
        any=0
        for f in "$T/$prefix".*; do
            [ -f "$f" ] && alive "$(cat "$f")" && any=1
        done
        [ "$any" = 0 ] && return 0
        [ "$(ms_since "$t0")" -ge "$limit_ms" ] && return 1
        sleep 0.02
    done
}
