#!/usr/bin/env bash
# bench/kills.sh: a hundred kills. N trials (default 100) of a tiny
# pp = 2 x dp = 2 GPT job under `brigade launch`; each trial picks a random
# rank, a random moment of the run and a random method:
#   kill  SIGKILL
#   stop  SIGSTOP (the rank stays stopped until the launcher stops the job)
#   sock  close the rank's TCP connections to the rendezvous store (its
#         store client and its liveness channel) from outside, with
#         `ss -K` (SOCK_DESTROY: the kernel aborts the socket, the rank sees
#         ECONNABORTED and the store an RST; needs root and a kernel with
#         CONFIG_INET_DIAG_DESTROY; `ss -K` prints nothing to kill if not,
#         and the trial is counted as "no kill")
# Odd trials run without restarts ("plain"): the launcher must exit non-zero
# within the deadline, its first failure line or every survivor's own error
# must name the killed rank, and no survivor may exit 0. Even trials run with
# --max-restarts K ("restart"): the job must finish (exit 0) with weights
# bitwise equal to the uninterrupted run's (`brigade compare`).
# Every trial is bounded: a launcher still running DEADLINE s after the kill
# (plain) or HANG s after its start is a hang, and is killed.
#
# Usage: BRIGADE=build/brigade bench/kills.sh [TRIALS] [SEED]
# Environment: KILLS_STEPS (2000), KILLS_EVERY (checkpoint period, 50),
#   KILLS_RESTARTS (K, 3), KILLS_METHODS ("kill stop sock"), KILLS_MODES
#   ("plain restart": alternate; one word for only that mode),
#   BRIGADE_TIMEOUT (6), KILLS_KEEP (keep the scratch directory: 1)
# Exit status: 0 when no trial hung, mismatched or failed a check.
set -u
B=${BRIGADE:-build/brigade}
B=$(cd "$(dirname "$B")" && pwd)/$(basename "$B")
N=${1:-100}
SEED=${2:-$$}
STEPS=${KILLS_STEPS:-2000}
EVERY=${KILLS_EVERY:-50}
K=${KILLS_RESTARTS:-3}
read -r -a METHODS <<<"${KILLS_METHODS:-kill stop sock}"
read -r -a MODES <<<"${KILLS_MODES:-plain restart}"
export BRIGADE_TIMEOUT=${BRIGADE_TIMEOUT:-6}
GRACE=2
# plain: the stop, a heartbeat death (BRIGADE_TIMEOUT / 2), the grace period, slack
DEADLINE=$((BRIGADE_TIMEOUT + GRACE + 10))
T=$(mktemp -d "${TMPDIR:-/tmp}/bg-kills.XXXXXX")
lpid=
cleanup() {
    [ -n "$lpid" ] && kill -KILL "$lpid" 2>/dev/null # the ranks die with it (PDEATHSIG)
    wait 2>/dev/null
    [ "${KILLS_KEEP:-0}" = 1 ] && echo "scratch kept: $T" || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
RANDOM=$SEED
GPT=(--pp 2 --dp 2 --layers 2 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --threads 1 --quiet)

now_us() { echo "${EPOCHREALTIME/./}"; }
alive() { # a zombie counts as dead
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$st" ] && [ "$st" != Z ]
}
# stamp: prefix every line with the time it was read, in microseconds
stamp() { while IFS= read -r l; do printf '%s %s\n' "${EPOCHREALTIME/./}" "$l"; done; }
rank_pids() { # the launcher's children, "rank pid" per line
    local p r
    for p in $(pgrep -P "$lpid" 2>/dev/null); do
        r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^BRIGADE_RANK=//p')
        [ -n "$r" ] && echo "$r $p"
    done
}
close_sockets() { # close every TCP connection from pid $1 to the store port $2 (ss -K)
    local pid=$1 port=$2 lp n=0
    for lp in $(ss -tnpH state established "dport = :$port" 2>/dev/null | grep "pid=$pid," | awk '{print $3}' | sed 's/.*://'); do
        ss -K -tnH state established "sport = :$lp" "dport = :$port" 2>/dev/null | grep -q . && n=$((n + 1))
    done
    [ "$n" -gt 0 ]
}
median() { sort -n | awk '{a[NR] = $1} END { if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else print int((a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
maxof() { sort -n | tail -1; }

# the uninterrupted run (same checkpointing), its weights and its wall time
t0=$(now_us)
timeout -s KILL 300 "$B" launch -n 4 -- "$B" train "${GPT[@]}" --steps "$STEPS" --checkpoint-dir "$T/ref-ckpt" \
    --checkpoint-every "$EVERY" --resume --save "$T/ref" >"$T/ref.log" 2>&1 || {
    echo "FAIL: the uninterrupted run failed"
    tail -5 "$T/ref.log"
    exit 1
}
REF_MS=$((($(now_us) - t0) / 1000))
HANG=$((REF_MS * (K + 2) / 1000 + DEADLINE * (K + 1) + 30))
echo "kills: $N trials, seed $SEED, $STEPS steps, checkpoint every $EVERY, BRIGADE_TIMEOUT=$BRIGADE_TIMEOUT," \
    "methods ${METHODS[*]}, modes ${MODES[*]}; uninterrupted run ${REF_MS} ms"

trials=0 hangs=0 mismatches=0 failures=0 nokill=0 restarts=0
: >"$T/detect" ; : >"$T/exitms"
for i in $(seq 1 "$N"); do
    mode=${MODES[$(((i - 1) % ${#MODES[@]}))]}
    method=${METHODS[$((RANDOM % ${#METHODS[@]}))]}
    [ "${KILLS_CYCLE:-0}" = 1 ] && method=${METHODS[$(((i - 1) % ${#METHODS[@]}))]}
    victim=$((RANDOM % 4))
    at_ms=$((REF_MS * (5 + RANDOM % 86) / 100)) # 5% .. 90% of an uninterrupted run
    d=$T/t$i
    mkdir -p "$d"
    extra=()
    [ "$mode" = restart ] && extra=(--max-restarts "$K")
    "$B" launch -n 4 -v --tag-output --grace "$GRACE" "${extra[@]}" -- "$B" train "${GPT[@]}" --steps "$STEPS" \
        --checkpoint-dir "$d/ckpt" --checkpoint-every "$EVERY" --resume --save "$d/out" >"$d/out.log" 2> >(stamp >"$d/err") &
    lpid=$!
    tstart=$(now_us)
    # wait for the four ranks of the first attempt
    pids=""
    while [ "$(($(now_us) - tstart))" -lt 20000000 ] && alive "$lpid"; do
        pids=$(rank_pids)
        [ "$(echo "$pids" | grep -c .)" = 4 ] && break
        sleep 0.01
    done
    sleep "$(awk -v m="$at_ms" 'BEGIN { printf "%.3f", m / 1000 }')"
    vpid=$(echo "$pids" | awk -v r="$victim" '$1 == r { print $2 }')
    killed=0
    tkill=$(now_us)
    if [ -n "$vpid" ] && alive "$vpid"; then
        case $method in
        kill) kill -KILL "$vpid" 2>/dev/null && killed=1 ;;
        stop) kill -STOP "$vpid" 2>/dev/null && killed=1 ;;
        sock)
            port=$(tr '\0' '\n' <"/proc/$vpid/environ" 2>/dev/null | sed -n 's/^BRIGADE_MASTER_PORT=//p')
            [ -n "$port" ] && close_sockets "$vpid" "$port" && killed=1
            ;;
        esac
    fi
    # wait for the launcher, bounded
    hung=0
    while alive "$lpid"; do
        el=$((($(now_us) - tstart) / 1000000))
        ek=$((($(now_us) - tkill) / 1000000))
        if [ "$el" -ge "$HANG" ] || { [ "$mode" = plain ] && [ "$killed" = 1 ] && [ "$ek" -ge "$DEADLINE" ]; }; then
            hung=1
            kill -KILL "$lpid" 2>/dev/null
            for p in $(echo "$pids" | awk '{print $2}'); do kill -KILL "$p" 2>/dev/null; done
            break
        fi
        sleep 0.02
    done
    wait "$lpid" 2>/dev/null
    rc=$?
    lpid=
    tend=$(now_us)
    sleep 0.05 # the stamper's last lines
    trials=$((trials + 1))
    verdict=ok
    note=""
    if [ "$killed" = 0 ]; then
        nokill=$((nokill + 1))
        note="; no kill (rank $victim gone at ${at_ms} ms, or nothing to close)"
    fi
    # the launcher's first failure line: time to detect, whom it names
    first=$(grep -m1 -E ' brigade launch: rank [0-9]+ \(pid [0-9]+\)( \(stopped by [A-Z]+\))? (exited with status [1-9]|was killed|did not exit within)' "$d/err")
    det_ms=-
    if [ -n "$first" ] && [ "$killed" = 1 ]; then
        det_ms=$(((${first%% *} - tkill) / 1000))
        echo "$det_ms" >>"$T/detect"
    fi
    exit_ms=$(((tend - tkill) / 1000))
    [ "$killed" = 1 ] && [ "$mode" = plain ] && echo "$exit_ms" >>"$T/exitms"
    nres=$(grep -c ' brigade launch: restart [0-9]* of ' "$d/err")
    restarts=$((restarts + nres))
    if [ "$hung" = 1 ]; then
        hangs=$((hangs + 1))
        verdict=HANG
    elif [ "$mode" = restart ]; then
        if [ "$rc" != 0 ]; then
            verdict=FAIL
            note="$note; launcher exit $rc"
        elif ! v=$("$B" compare "$T/ref" "$d/out" 2>&1); then
            mismatches=$((mismatches + 1))
            verdict=MISMATCH
            note="$note; $v"
        fi
        [ "$killed" = 1 ] && [ "$nres" = 0 ] && note="$note; no restart"
    elif [ "$killed" = 1 ]; then
        # plain: a failure, named; no survivor exits 0 after the kill
        named=0 unnamed=""
        if [ "$rc" = 0 ]; then
            verdict=FAIL
            note="$note; launcher exit 0"
        fi
        echo "$first" | grep -qE "rank $victim \(pid|while rank $victim " && named=1
        for s in 0 1 2 3; do
            [ "$s" = "$victim" ] && continue
            sline=$(grep -m1 -E " brigade launch: rank $s \(pid [0-9]+\) (exited|was killed)" "$d/err")
            if echo "$sline" | grep -q 'exited with status 0$' && [ "${sline%% *}" -gt "$tkill" ]; then
                verdict=FAIL
                note="$note; survivor rank $s exited 0"
            fi
            # the survivor's own error names the victim, or it was stopped by the launcher first
            if ! grep -E "^[0-9]+ \[rank $s\] " "$d/err" | grep -qE "rank $victim (died|failed|\(stage)|rank $victim\b.*(heartbeat|closed|died)"; then
                echo "$sline" | grep -qE 'status 143|signal 15|signal 9' || unnamed="$unnamed $s"
            fi
        done
        if [ "$named" = 0 ] && [ -n "$unnamed" ]; then
            verdict=FAIL
            note="$note; rank $victim named neither by the launcher nor by survivor(s)$unnamed"
        fi
    fi
    [ "$verdict" = ok ] || failures=$((failures + 1))
    printf 'trial %3d %-7s %-4s rank %d at %5d ms: %-8s exit %3s detect %5s ms, all exited %5d ms, restarts %d%s\n' \
        "$i" "$mode" "$method" "$victim" "$at_ms" "$verdict" "$rc" "$det_ms" "$exit_ms" "$nres" "$note"
    if [ "$verdict" != ok ]; then
        grep -E ' brigade launch|\] brigade train' "$d/err" | head -12 | sed 's/^[0-9]* /    /'
        cp -r "$d" "$T/failed-t$i" 2>/dev/null
    fi
    [ "${KILLS_KEEP:-0}" = 1 ] || rm -rf "$d"
done
echo "summary: $trials trials ($nokill without a kill), $hangs hangs, $mismatches mismatches, $failures failed checks;" \
    "time to detect (kill -> launcher's failure line) median $(median <"$T/detect") ms, max $(maxof <"$T/detect") ms;" \
    "plain runs: kill -> launcher exit median $(median <"$T/exitms") ms, max $(maxof <"$T/exitms") ms; $restarts restarts"
[ "$failures" = 0 ]
