# tests/lib/harness.sh: the one helper library of the shell tests, sourced
# by every tests/**/*.sh (and by bench/netns_overlap.sh for its hosts):
#
#   . "$(dirname "$0")/../lib/harness.sh"      (from tests/<module>/)
#
# It owns the verdict (the counters pass and fails, ok / bad / check /
# finish / die / skip), a scratch directory $T removed at exit together with
# every process the test left behind (its background jobs, $LPID, the pids
# recorded in $T/pid.* and $T/gpid.*, and whatever at_exit registered),
# the brigade binary ($B, also $BRIGADE), time helpers, the CLI
# expectations (expect, expect_re, expect_train), training runs compared
# with `brigade compare` (train_save, same, near), process probes (alive,
# pstate, catches, wait_caught, wait_files, all_dead, wait_exit) and network-namespace hosts
# (netns_init, netns_hosts, job_start...). It runs nothing when sourced
# beyond making $T and installing the EXIT trap; it sets `set -u` (every
# test runs with it) and leaves -e and pipefail to the test.
#
# Time: a test bounds a wait by a pace it measured itself (a multiple of it)
# or counts steps instead; fixed seconds only where a deadline is the feature
# under test (the launcher's --grace, BRIGADE_TIMEOUT), with room for load.
# CTest's TIMEOUT only stops a hung test.
set -u
HARNESS_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# the tree's root, and the sourcing test's own directory
SRC=${BRIGADE_SOURCE_DIR:-$(cd "$HARNESS_LIB/../.." && pwd)}
HERE=$(cd "$(dirname "$0")" && pwd)
# the brigade binary: CTest sets BRIGADE (bg_script_test); a test that needs
# no binary sets HARNESS_NO_BRIGADE=1 before sourcing
if [ -z "${HARNESS_NO_BRIGADE:-}" ]; then
    : "${BRIGADE:?BRIGADE must be the path of the brigade binary (CTest sets it)}"
fi
B=${BRIGADE:-}
export BRIGADE_TIMEOUT=${BRIGADE_TIMEOUT:-60}
T=$(mktemp -d "${TMPDIR:-/tmp}/bg-test.XXXXXX")
LPID=
HARNESS_AT_EXIT=()

# ---- the verdict
pass=0
fails=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fails=$((fails + 1)); echo "FAIL: $*"; }
fail() { bad "$@"; }
# check "description" COMMAND ARGS...: the command's status decides
check() {
    local desc=$1
    shift
    if "$@"; then ok "$desc"; else bad "$desc"; return 1; fi
}
# finish [MIN_PASSED]: the summary line; exit 1 on any failure (or fewer
# passed checks than MIN_PASSED: a test whose cases silently vanished fails)
finish() {
    echo "$pass passed, $fails failed"
    [ "$fails" -eq 0 ] || exit 1
    if [ $# -gt 0 ] && [ "$pass" -lt "$1" ]; then
        echo "FAIL: only $pass checks passed, expected at least $1"
        exit 1
    fi
    exit 0
}
# die WHAT: a failed check after which nothing else can be checked: the verdict now
die() { bad "$@"; finish; }
# skip REASON: the test cannot run here (CTest: SKIP_RETURN_CODE 77)
skip() { echo "SKIP: $*"; exit 77; }

# ---- cleanup at exit
# at_exit CMD...: run CMD at exit (last registered, first run)
at_exit() { HARNESS_AT_EXIT+=("$*"); }
harness_exit() {
    local i f j
    for ((i = ${#HARNESS_AT_EXIT[@]} - 1; i >= 0; i--)); do eval "${HARNESS_AT_EXIT[i]}"; done
    # processes recorded in $T/pid.* and $T/gpid.* (tests/launch/rank.sh),
    # only while they are still ours: a recycled pid belongs to someone else
    for f in "$T"/pid.* "$T"/gpid.*; do
        [ -f "$f" ] || continue
        grep -qaE "${HARNESS_PID_MATCH:-sleep|rank\.sh}" "/proc/$(cat "$f")/cmdline" 2>/dev/null &&
            kill -KILL "$(cat "$f")" 2>/dev/null
    done
    [ -n "$LPID" ] && kill -KILL "$LPID" 2>/dev/null
    # background jobs: SIGTERM (a launcher then stops its ranks), SIGKILL after 5 s
    j=$(jobs -p)
    if [ -n "$j" ]; then
        # shellcheck disable=SC2086
        kill $j 2>/dev/null
        for ((i = 0; i < 50; i++)); do
            # shellcheck disable=SC2086
            kill -0 $j 2>/dev/null || break
            sleep 0.1
        done
        # shellcheck disable=SC2086
        kill -KILL $j 2>/dev/null
        wait 2>/dev/null
    fi
    rm -rf "$T"
}
trap harness_exit EXIT

# ---- time
# microseconds since the epoch, and milliseconds since a start in microseconds
now_us() { echo "${EPOCHREALTIME/./}"; }
ms_since() { echo $((($(now_us) - $1) / 1000)); }
# wait_exit PID SECONDS: wait until PID (a child) exits, at most SECONDS
# (a decimal); 0 if it did, 1 if it is still running
wait_exit() {
    local pid=$1 limit_ms t0
    limit_ms=$(awk -v s="$2" 'BEGIN { printf "%d", s * 1000 }')
    t0=$(now_us)
    while kill -0 "$pid" 2>/dev/null; do
        [ "$(ms_since "$t0")" -ge "$limit_ms" ] && return 1
        sleep 0.1
    done
    return 0
}

# ---- processes
# is pid alive (a zombie counts as dead)?
alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}
# catches PID SIGNUM: 0 if PID has installed a handler for signal SIGNUM
# (its /proc status SigCgt mask has the bit)
catches() {
    local mask
    mask=$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
    [ -n "$mask" ] && (((0x$mask >> ($2 - 1)) & 1))
}
# wait_caught SIGNUM SECONDS PID...: wait until every PID catches SIGNUM (a
# signal sent earlier would kill a process that has not started yet); 0 if
# they do within SECONDS, 1 if not
wait_caught() {
    local sig=$1 limit_ms=$(($2 * 1000)) t0 p all
    shift 2
    t0=$(now_us)
    while :; do
        all=1
        for p in "$@"; do catches "$p" "$sig" || all=0; done
        [ "$all" = 1 ] && return 0
        [ "$(ms_since "$t0")" -ge "$limit_ms" ] && return 1
        sleep 0.05
    done
}
# process state letter (R, S, T, Z...) or empty
pstate() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1; }
# wait_files PREFIX COUNT SECONDS: wait until COUNT files $T/PREFIX.* exist and are non-empty
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

# ---- the CLI's answers
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
# expect_re CODE MESSAGE-REGEX ARGS...: `brigade ARGS` exits CODE within 20 s
# and its stderr matches the extended regex
expect_re() {
    local code=$1 msg=$2 rc
    shift 2
    timeout -s KILL 20 "$B" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    if [ $rc = "$code" ] && grep -qE -- "$msg" "$T/err"; then
        ok "brigade $* -> $rc"
    else
        bad "brigade $*: expected exit $code and /$msg/, got $rc and: $(cat "$T/err")"
    fi
}
# deadlock_json IN OUT: the schedule program IN with rank 0 waiting for a
# gradient before it sends its first activation (a waits-for cycle), as OUT
deadlock_json() {
    python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ops = d["ranks"][0]["ops"]
i = next(k for k, o in enumerate(ops) if o["kind"] == "send_act")
j = next(k for k, o in enumerate(ops) if o["kind"] == "recv_grad")
ops.insert(i, ops.pop(j))
json.dump(d, open(sys.argv[2], "w"))
PY
}
# expect_err_line SUBCOMMAND NEEDLE ARGS...: `brigade SUBCOMMAND ARGS` exits
# non-zero within 60 s with one line on stderr, holding NEEDLE
expect_err_line() {
    local sub=$1 needle=$2 rc
    shift 2
    timeout -s KILL 60 "$B" "$sub" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    if [ $rc -eq 0 ]; then fail "brigade $sub $* exited 0"
    elif ! grep -qF -- "$needle" "$T/err"; then fail "brigade $sub $*: stderr lacks \"$needle\": $(cat "$T/err")"
    elif [ "$(wc -l <"$T/err")" -ne 1 ]; then fail "brigade $sub $*: error is not one line: $(cat "$T/err")"
    else ok "brigade $sub $* -> $rc"; fi
}
# expect_train RC NEEDLE ARGS...: brigade train ARGS fails with exit code RC and one line on
# stderr holding NEEDLE, training nothing (nothing on stdout)
expect_train() {
    local rc=$1 needle=$2 got
    shift 2
    "$B" train "$@" >"$T/o" 2>"$T/e"
    got=$?
    if [ $got != "$rc" ]; then bad "train $* exited $got, want $rc: $(cat "$T/e")"
    elif ! grep -qF -- "$needle" "$T/e"; then bad "train $*: stderr lacks \"$needle\": $(cat "$T/e")"
    elif [ "$(wc -l <"$T/e")" != 1 ]; then bad "train $*: not one line: $(cat "$T/e")"
    elif [ -s "$T/o" ]; then bad "train $*: trained: $(cat "$T/o")"
    else ok "$needle"; fi
}

# ---- training runs and their weights
# train_save NAME N ARGS...: `brigade train ARGS --quiet --save $T/NAME` on N ranks
# (brigade launch -n N when N > 1), bounded by $TRAIN_TIMEOUT seconds (default
# 120), its output in $T/NAME.log. A failure, or a report of leaked
# allocations, is a failed check naming the run, with the log's last lines.
train_save() {
    local name=$1 n=$2
    shift 2
    local cmd=("$B" train "$@" --quiet --save "$T/$name")
    [ "$n" -gt 1 ] && cmd=("$B" launch -n "$n" -- "${cmd[@]}")
    if ! timeout "${TRAIN_TIMEOUT:-120}" "${cmd[@]}" >"$T/$name.log" 2>&1; then
        bad "$name: train on $n rank(s): $*"
        grep -v WARN "$T/$name.log" | tail -3
        return 1
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

# elastic_lose_host LOSE LAUNCH_ARGS...: the run of the tests of brigade
# launch --elastic: `brigade launch LAUNCH_ARGS` in the background (stdout and
# stderr to $T/el.log, bounded), whose job checkpoints under $T/ck; after its
# first checkpoint (within 30 s) the command LOSE takes a host away; the job
# must then finish (exit 0) on the hosts left.
elastic_lose_host() {
    local lose=$1 job rc i
    shift
    timeout -s KILL 200 "$B" launch "$@" >"$T/el.log" 2>&1 &
    job=$!
    for ((i = 0; i < 600; i++)); do
        ls "$T"/ck/step-*/manifest.json >/dev/null 2>&1 && break
        sleep 0.05
    done
    if ls "$T"/ck/step-*/manifest.json >/dev/null 2>&1; then
        $lose
    else
        bad "no checkpoint within 30 s"
    fi
    wait $job
    rc=$?
    check "the elastic job finishes on the hosts left (rc $rc)" [ $rc = 0 ] || cat "$T/el.log"
}
# elastic_resumed_like_by_hand LOG OUT STEPS GPT...: the checks shared by the
# tests of brigade launch --elastic (tests/launch, tests/netns): the job whose
# stderr is LOG went from dp 4 to dp 3 at a checkpoint (said by its resume
# line) and saved OUT, equal bitwise to a one-host run stopped by hand at that
# step on dp 4 and resumed on dp 3 to step STEPS.
elastic_resumed_like_by_hand() {
    local log=$1 out=$2 steps=$3 line s
    shift 3
    line=$(grep -m1 -o 'resuming from .*' "$log")
    echo "$line"
    s=$(echo "$line" | sed -n 's/.*step-0*\([0-9][0-9]*\) (written by pp=1 dp=4) at step [0-9]*: layout pp=1 dp=4 -> pp=1 dp=3$/\1/p')
    check "the job re-planned dp 4 -> 3 from a checkpoint, not step 0 ($line)" [ -n "$s" ] || return
    env -u UCX_TLS -u UCX_NET_DEVICES timeout -s KILL 60 "$B" launch -n 4 -- "$B" train "$@" --steps "$s" --dp 4 \
        --checkpoint-dir "$T/hand" --checkpoint-every "$s" >/dev/null 2>&1 || bad "by hand: dp 4 to step $s"
    env -u UCX_TLS -u UCX_NET_DEVICES timeout -s KILL 60 "$B" launch -n 3 -- "$B" train "$@" --steps "$steps" --dp 3 \
        --checkpoint-dir "$T/hand" --resume --save "$T/hand-out" >/dev/null 2>&1 || bad "by hand: dp 3 from step $s"
    check "weights bitwise equal to the run resumed by hand on dp 3" "$B" compare "$T/hand-out" "$out"
}

# ---- hosts made of network namespaces (tests/netns/, bench/netns_overlap.sh)
#
#   netns_init         skip (exit 77) unless root with a working `ip netns`;
#                      remove namespaces left by runs that were SIGKILLed;
#                      start a watchdog that sends the test SIGTERM after
#                      NETNS_LIMIT seconds (default 80: set it below CTest's
#                      TIMEOUT, which kills without cleanup); UCX over TCP on
#                      eth0 only (no shared memory: these are "hosts")
#   netns_hosts N      N hosts H[0..N-1] (namespace names), each with eth0 =
#                      ADDR[i] = 10.77.0.(i+1)/24, joined by veth pairs to a
#                      bridge in a switch namespace SW (port p<i> is host i's
#                      other end). The root namespace is never touched: every
#                      interface is created directly inside its namespace.
#   on HOST CMD...     run CMD in HOST's namespace
#   link_down I        cut host I's link (its switch port goes down)
#
# Names carry the pid and a random number (bgN<pid>r<rand>h<i>), so parallel
# runs never collide. Cleanup at exit (also on INT/TERM): SIGKILL every
# process left in our namespaces (ip netns pids lists only processes whose
# network namespace is ours: the ones this test started), then delete the
# namespaces, which removes their veth pairs and the bridge.
NS_PREFIX="bgN$$r$RANDOM"
NS_ALL=()
H=()
ADDR=()
SW=
netns_cleanup() {
    local ns p round
    for ns in "${NS_ALL[@]}"; do
        for round in 1 2 3; do
            p=$(ip netns pids "$ns" 2>/dev/null) || break
            [ -z "$p" ] && break
            # shellcheck disable=SC2086
            kill -KILL $p 2>/dev/null
            sleep 0.1
        done
        ip netns del "$ns" 2>/dev/null
    done
    NS_ALL=()
}
netns_init() {
    local ns pid p
    [ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run as root to test across hosts"
    command -v ip >/dev/null || skip "iproute2 (ip) not installed"
    ip netns add "${NS_PREFIX}probe" 2>/dev/null || skip "ip netns unavailable here (no CAP_SYS_ADMIN or no netns support)"
    ip netns del "${NS_PREFIX}probe"
    at_exit netns_cleanup
    trap 'exit 130' INT
    trap 'exit 143' TERM
    for ns in $(ip netns list | sed -n 's/^\(bgN[0-9]*r[0-9]*[a-z0-9]*\).*/\1/p'); do
        pid=${ns#bgN}
        pid=${pid%%r*}
        [ -d "/proc/$pid" ] && continue
        echo "removing namespace $ns left by a run that died (pid $pid)"
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    # the watchdog acts only while the test is still its parent (never a
    # recycled pid); its sleep holds no output pipe and dies with it (CTest
    # waits for the pipes' last writer); harness_exit ends it
    (
        me=$BASHPID
        sleep "${NETNS_LIMIT:-80}" </dev/null >/dev/null 2>&1 &
        sp=$!
        trap 'kill $sp 2>/dev/null; exit 0' TERM
        wait $sp
        [ "$(cut -d' ' -f4 "/proc/$me/stat")" = $$ ] &&
            echo "netns: test still running after ${NETNS_LIMIT:-80} s; stopping it" >&2 && kill -TERM $$
    ) &
    export UCX_TLS=tcp UCX_NET_DEVICES=eth0
    BRIGADE_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    export BRIGADE_JOB_TOKEN
}
newns() {
    ip netns add "$1" || { echo "cannot create namespace $1" >&2; exit 1; }
    NS_ALL+=("$1")
    ip -n "$1" link set lo up
}
netns_hosts() {
    local n=$1 i
    SW="${NS_PREFIX}sw"
    newns "$SW"
    ip -n "$SW" link add br0 type bridge || exit 1
    ip -n "$SW" link set br0 up
    for ((i = 0; i < n; i++)); do
        H[i]="${NS_PREFIX}h$i"
        ADDR[i]="10.77.0.$((i + 1))"
        newns "${H[i]}"
        ip link add name eth0 netns "${H[i]}" type veth peer name "p$i" netns "$SW" ||
            { echo "cannot create the veth pair of host $i" >&2; exit 1; }
        ip -n "$SW" link set "p$i" master br0 up
        ip -n "${H[i]}" addr add "${ADDR[i]}/24" dev eth0
        ip -n "${H[i]}" link set eth0 up
    done
    # no STP on the bridge: a port forwards once its link is up; wait for every carrier (bounded)
    for ((i = 0; i < 50; i++)); do
        [ "$(ip -n "$SW" -o link show up | grep -c 'p[0-9]*@.*LOWER_UP')" -ge "$n" ] && return 0
        sleep 0.1
    done
    echo "the links of $n hosts did not come up within 5 s" >&2
    exit 1
}
on() {
    local ns=$1
    shift
    ip netns exec "$ns" "$@"
}
link_down() { ip -n "$SW" link set "p$1" down; }
# a port for the store: the namespaces are fresh, nothing else listens in them
netns_port() { echo $((20000 + RANDOM % 10000)); }
# job_start TAG "LAYOUT" ARGS...: one `brigade train ARGS` rank per word of
# LAYOUT, rank r on host LAYOUT[r] (local ranks counted per host), with rank
# 0's store on host LAYOUT[0]'s address. Each rank is bounded by JOB_LIMIT
# seconds (SIGKILL); its output goes to $T/TAG.log.R, its exit status to
# $T/TAG.rc.R and its end time (us) to $T/TAG.end.R. job_wait waits for all.
JOB_PIDS=()
job_start() {
    local tag=$1 layout=($2) r h lr port
    shift 2
    local -A count=()
    port=$(netns_port)
    rm -f "$T/$tag".*
    for ((r = 0; r < ${#layout[@]}; r++)); do
        h=${layout[r]}
        lr=${count[$h]:-0}
        count[$h]=$((lr + 1))
        (
            on "${H[h]}" env BRIGADE_RANK=$r BRIGADE_WORLD_SIZE=${#layout[@]} BRIGADE_LOCAL_RANK=$lr \
                BRIGADE_MASTER_ADDR="${ADDR[${layout[0]}]}" BRIGADE_MASTER_PORT=$port \
                timeout -s KILL "${JOB_LIMIT:-60}" "$B" train "$@" >"$T/$tag.log.$r" 2>&1
            echo $? >"$T/$tag.rc.$r"
            now_us >"$T/$tag.end.$r"
        ) &
        JOB_PIDS+=($!)
    done
}
job_wait() {
    wait "${JOB_PIDS[@]}"
    JOB_PIDS=()
}
# job_ok TAG N: every one of N ranks exited 0 (else print their logs)
job_ok() {
    local r err=0
    for ((r = 0; r < $2; r++)); do
        [ "$(cat "$T/$1.rc.$r" 2>/dev/null)" = 0 ] || err=1
    done
    [ $err = 0 ] && return 0
    for ((r = 0; r < $2; r++)); do
        echo "--- $1 rank $r: exit $(cat "$T/$1.rc.$r" 2>/dev/null)"
        tail -n 20 "$T/$1.log.$r"
    done
    return 1
}
# kill_host I: SIGKILL every process in host I's namespace (all of them ours)
kill_host() {
    local p
    p=$(ip netns pids "${H[$1]}")
    # shellcheck disable=SC2086
    [ -n "$p" ] && kill -KILL $p
}
# wait_checkpoint DIR SECONDS: wait (bounded) until DIR holds a complete checkpoint
wait_checkpoint() {
    local i
    for ((i = 0; i < $2 * 20; i++)); do
        ls "$1"/step-*/manifest.json >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    return 1
}
# ref_run DIR ARGS...: the one-host reference, `brigade launch -n 4` with UCX's
# default transports (shared memory), saving to DIR; a check of its own
ref_run() {
    local dir=$1 rc
    shift
    env -u UCX_TLS -u UCX_NET_DEVICES timeout -s KILL 60 "$B" launch -n 4 --timeout 50 -- \
        "$B" train "$@" --save "$dir" >"$dir.log" 2>&1
    rc=$?
    check "one-host reference run (rc $rc)" [ $rc = 0 ]
    [ $rc = 0 ] || cat "$dir.log"
}
