#!/bin/bash
# tests/launch/rank.sh MODE DIR [ARGS]: a rank for the launcher tests. It
# behaves as MODE says, and records its pid in DIR/pid.$BRIGADE_RANK once it
# is set up (signal dispositions included), so a test that waits for the pid
# files can signal it without a race.
set -u
mode=$1 dir=$2
shift 2
r=$BRIGADE_RANK
ready() { echo $$ >"$dir/pid.$r.tmp" && mv "$dir/pid.$r.tmp" "$dir/pid.$r"; }
# all_ready: wait (10 s at most) until every rank is ready, so that the one
# that fails does so while the others are set up
all_ready() {
    local i n
    for ((i = 0; i < 500; i++)); do
        n=$(ls "$dir" | grep -c '^pid\.[0-9]*$')
        [ "$n" -ge "$BRIGADE_WORLD_SIZE" ] && return 0
        sleep 0.02
    done
}
case "$mode" in
env)    # dump the launcher's variables and the arguments
    ready
    {
        echo "rank=$BRIGADE_RANK"
        echo "world=$BRIGADE_WORLD_SIZE"
        echo "local=$BRIGADE_LOCAL_RANK"
        echo "addr=$BRIGADE_MASTER_ADDR"
        echo "port=$BRIGADE_MASTER_PORT"
        echo "token=$BRIGADE_JOB_TOKEN"
        echo "inherited=${BG_TEST_INHERITED:-unset}"
        printf 'args='
        printf '<%s>' "$@"
        echo
    } >"$dir/env.$r.tmp" && mv "$dir/env.$r.tmp" "$dir/env.$r" ;;
sleep)  # sleep; exec so that the recorded pid is the sleeping process
    ready
    exec sleep "$1" ;;
fail-at)    # fail-at RANK CODE: once all are ready, that rank exits CODE after 0.2 s, the others sleep 30 s
    ready
    if [ "$r" = "$1" ]; then all_ready; sleep 0.2; exit "$2"; fi
    exec sleep 30 ;;
kill-at)    # kill-at RANK SIG: once all are ready, that rank kills itself with SIG after 0.2 s
    ready
    if [ "$r" = "$1" ]; then all_ready; sleep 0.2; kill -"$2" $$; sleep 5; exit 99; fi
    exec sleep 30 ;;
stubborn)   # stubborn RANK: once all are ready, that rank exits 1 after 0.2 s; the others ignore SIGTERM
    trap '' TERM
    ready
    if [ "$r" = "$1" ]; then all_ready; sleep 0.2; exit 1; fi
    exec sleep 30 ;;
grandchild) # start a grandchild, record it, and wait
    sleep 30 &
    echo $! >"$dir/gpid.$r"
    ready
    wait ;;
stop-at)    # stop-at RANK: once all are ready, that rank stops itself (SIGSTOP); the others exit 0 after 0.3 s
    ready
    all_ready
    if [ "$r" = "$1" ]; then kill -STOP $$; exec sleep 30; fi
    sleep 0.3
    echo "${EPOCHREALTIME/./}" >"$dir/end.$r"   # when this rank exits (us)
    exit 0 ;;
stop-others-fail)  # stop-others-fail RANK CODE: once all are ready, RANK stops itself (SIGSTOP); the others
                   # exit CODE after 0.3 s (the workers of a parameter server that stopped)
    ready
    all_ready
    if [ "$r" = "$1" ]; then kill -STOP $$; exec sleep 30; fi
    sleep 0.3
    echo "${EPOCHREALTIME/./}" >"$dir/end.$r"
    exit "$2" ;;
stop-fail)  # stop-fail RANK FAILER: RANK stops itself after 0.2 s; FAILER exits 1 after 0.6 s (as a survivor
            # that timed out waiting for it would); the others sleep 30 s
    ready
    all_ready
    if [ "$r" = "$1" ]; then sleep 0.2; kill -STOP $$; exec sleep 30; fi
    if [ "$r" = "$2" ]; then sleep 0.6; echo "${EPOCHREALTIME/./}" >"$dir/end.$r"; exit 1; fi
    exec sleep 30 ;;
ignore-term)  # ignore SIGTERM and sleep
    trap '' TERM
    ready
    exec sleep 30 ;;
*)
    echo "rank.sh: unknown mode $mode" >&2
    exit 100 ;;
esac
