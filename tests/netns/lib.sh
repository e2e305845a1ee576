# tests/netns/lib.sh: hosts made of network namespaces, for the tests that run
# a job across "machines" (sourced).
#
#   netns_hosts N      N hosts H[0..N-1] (namespace names), each with eth0 =
#                      ADDR[i] = 10.77.0.(i+1)/24, joined by veth pairs to a
#                      bridge in a switch namespace SW (port p<i> is host i's
#                      other end). The root namespace is never touched: every
#                      interface is created directly inside its namespace.
#   on HOST CMD...     run CMD in HOST's namespace
#   link_down I        cut host I's link (its switch port goes down)
#
# Names carry the pid and a random number (bgN<pid>r<rand>h<i>), so parallel
# runs never collide. Cleanup (trap EXIT, also on INT/TERM): SIGKILL every
# process left in our namespaces (ip netns pids lists only processes whose
# network namespace is ours: the ones this test started), then delete the
# namespaces, which removes their veth pairs and the bridge.
# Skips (exit 77) when not root or when `ip netns` does not work here.
# Never hangs: a watchdog sends the test SIGTERM (exit 143, cleanup runs)
# after NETNS_LIMIT seconds (set it below the CTest TIMEOUT, which kills
# without cleanup), and namespaces left by a run that was SIGKILLed anyway
# (its pid gone) are removed by the next run.
set -u
: "${BRIGADE:?BRIGADE must be the path of the brigade binary}"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/bg-netns.XXXXXX")
NS_PREFIX="bgN$$r$RANDOM"
NS_ALL=()
H=()
ADDR=()
SW=
WATCHDOG=

skip() { echo "SKIP: $*"; rm -rf "$T"; exit 77; }
source "$HERE/../lib/check.sh"

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
    [ -n "$WATCHDOG" ] && kill "$WATCHDOG" 2>/dev/null
    rm -rf "$T"
}
trap netns_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run as root to test across hosts"
command -v ip >/dev/null || skip "iproute2 (ip) not installed"
ip netns add "${NS_PREFIX}probe" 2>/dev/null || skip "ip netns unavailable here (no CAP_SYS_ADMIN or no netns support)"
ip netns del "${NS_PREFIX}probe"
for ns in $(ip netns list | sed -n 's/^\(bgN[0-9]*r[0-9]*[a-z0-9]*\).*/\1/p'); do
    pid=${ns#bgN}
    pid=${pid%%r*}
    [ -d "/proc/$pid" ] && continue
    echo "removing namespace $ns left by a run that died (pid $pid)"
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
done
# (only while the test is still its parent: never a recycled pid)
# (its sleep holds no output pipe and dies with it: CTest waits for the pipes' last writer)
(
    me=$BASHPID
    sleep "${NETNS_LIMIT:-80}" </dev/null >/dev/null 2>&1 &
    sp=$!
    trap 'kill $sp 2>/dev/null; exit 0' TERM
    wait $sp
    [ "$(cut -d' ' -f4 "/proc/$me/stat")" = $$ ] &&
        echo "netns: test still running after ${NETNS_LIMIT:-80} s; stopping it" >&2 && kill -TERM $$
) &
WATCHDOG=$!

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
JOB_LIMIT=${JOB_LIMIT:-60}
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
                timeout -s KILL "$JOB_LIMIT" "$BRIGADE" train "$@" >"$T/$tag.log.$r" 2>&1
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
    local r bad=0
    for ((r = 0; r < $2; r++)); do
        [ "$(cat "$T/$1.rc.$r" 2>/dev/null)" = 0 ] || bad=1
    done
    [ $bad = 0 ] && return 0
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

# UCX over TCP on the veth interface only (no shared memory: these are "hosts")
export UCX_TLS=tcp UCX_NET_DEVICES=eth0 BRIGADE_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

# ref_run DIR ARGS...: the one-host reference, `brigade launch -n 4` with UCX's
# default transports (shared memory), saving to DIR; a check of its own
ref_run() {
    local dir=$1 rc
    shift
    env -u UCX_TLS -u UCX_NET_DEVICES timeout -s KILL 60 "$BRIGADE" launch -n 4 --timeout 50 -- \
        "$BRIGADE" train "$@" --save "$dir" >"$dir.log" 2>&1
    rc=$?
    check "one-host reference run (rc $rc)" [ $rc = 0 ]
    [ $rc = 0 ] || cat "$dir.log"
}

# now_us / ms_since: microseconds since the epoch; milliseconds since one
now_us() { echo "${EPOCHREALTIME/./}"; }
ms_since() { echo $((($(now_us) - $1) / 1000)); }
