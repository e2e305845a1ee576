# tests/launch/test_restart.sh: --max-restarts. After a rank fails the whole
# job is stopped and started again (new token and port, BRIGADE_RESTART_COUNT
# = 1, 2, ...) at most K times; the exit status is the last attempt's; a
# signal to the launcher never restarts; a command that cannot run is not
# retried.
. "$(dirname "$0")/../lib/harness.sh"

# job.sh MODE: each rank appends "count token port" to $T/log.RANK, then:
#   fail-until C R CODE: while BRIGADE_RESTART_COUNT < C, rank R exits CODE after 0.2 s and the others
#                        sleep 30 s (until stopped); from attempt C on, every rank exits 0
#   codes: rank 0 exits 3 + the restart count (every attempt fails)
#   sleep: record the pid and sleep 30 s
cat >"$T/job.sh" <<'SH'
#!/bin/bash
dir=$1 mode=$2
shift 2
r=$BRIGADE_RANK
echo "$BRIGADE_RESTART_COUNT $BRIGADE_JOB_TOKEN $BRIGADE_MASTER_PORT" >>"$dir/log.$r"
case $mode in
fail-until)
    [ "$BRIGADE_RESTART_COUNT" -ge "$1" ] && exit 0
    if [ "$r" = "$2" ]; then sleep 0.2; exit "$3"; fi
    exec sleep 30 ;;
codes)
    if [ "$r" = 0 ]; then sleep 0.2; exit $((3 + BRIGADE_RESTART_COUNT)); fi
    exec sleep 30 ;;
sleep)
    echo $$ >"$dir/pid.$r"
    exec sleep 30 ;;
esac
SH
chmod +x "$T/job.sh"
attempts() { wc -l <"$T/log.$1"; }
not() { ! "$@"; }

# rank 1 of 3 fails on attempts 0 and 1; attempt 2 succeeds
BRIGADE_RESTART_COUNT=9 timeout -s KILL 30 "$BRIGADE" launch -n 3 --max-restarts 2 -- "$T/job.sh" "$T" fail-until 2 1 3 2>"$T/err"
rc=$?
cat "$T/err"
check "succeeds on the second restart (rc $rc)" [ $rc = 0 ]
check "every rank ran 3 times" [ "$(attempts 0)" = 3 -a "$(attempts 1)" = 3 -a "$(attempts 2)" = 3 ]
check "BRIGADE_RESTART_COUNT is 0, 1, 2 (the inherited 9 is replaced)" [ "$(cut -d' ' -f1 "$T/log.0" | tr '\n' ' ')" = "0 1 2 " ]
check "a new job token each attempt" [ "$(cut -d' ' -f2 "$T/log.2" | sort -u | wc -l)" = 3 ]
check "the ranks of one attempt share its token" [ "$(sed -n 2p "$T/log.0" | cut -d' ' -f2)" = "$(sed -n 2p "$T/log.2" | cut -d' ' -f2)" ]
check "a new port each attempt" [ "$(cut -d' ' -f3 "$T/log.1" | sort -u | wc -l)" -ge 2 ]
check "stderr: restart 1 of 2" grep -qx 'brigade launch: restart 1 of 2: the job failed (exit code 3); starting 3 ranks again with BRIGADE_RESTART_COUNT=1' "$T/err"
check "stderr: restart 2 of 2" grep -q '^brigade launch: restart 2 of 2: ' "$T/err"
check "stderr names the failing rank" [ "$(grep -c '^brigade launch: rank 1 (pid [0-9]*) exited with status 3; stopping the other 2 ranks$' "$T/err")" = 2 ]
rm -f "$T"/log.*

# every attempt fails: the last attempt's status, after K restarts
timeout -s KILL 30 "$BRIGADE" launch -n 2 --max-restarts 2 -- "$T/job.sh" "$T" codes 2>"$T/err"
rc=$?
cat "$T/err"
check "exit status of the last attempt: 3 + 2 (got $rc)" [ $rc = 5 ]
check "3 attempts" [ "$(attempts 0)" = 3 -a "$(attempts 1)" = 3 ]
check "gives up with a message" grep -qx 'brigade launch: the job failed after 2 restarts (--max-restarts 2); exit code 5' "$T/err"
rm -f "$T"/log.*

# without --max-restarts: one attempt, as before
timeout -s KILL 30 "$BRIGADE" launch -n 2 -- "$T/job.sh" "$T" codes 2>"$T/err"
rc=$?
check "no --max-restarts: exit 3, one attempt (rc $rc)" [ $rc = 3 -a "$(attempts 0)" = 1 ]
check "no restart message" not grep -q restart "$T/err"
rm -f "$T"/log.*

# a command that cannot run is not retried
timeout -s KILL 30 "$BRIGADE" launch -n 2 --max-restarts 3 -- "$T/no-such-command" 2>"$T/err"
rc=$?
check "command not found: 127 (rc $rc)" [ $rc = 127 ]
check "command not found: no restart" not grep -q restart "$T/err"

# Ctrl-C (SIGINT) and SIGTERM to the launcher: the job ends, no restart
for sig in INT TERM; do
    case $sig in INT) want=130 ;; TERM) want=143 ;; esac
    rm -f "$T"/log.* "$T"/pid.*
    "$BRIGADE" launch -n 2 --max-restarts 5 -- "$T/job.sh" "$T" sleep 2>"$T/err" &
    LPID=$!
    wait_files pid 2 10 || fail "the ranks did not start within 10 s"
    kill -$sig "$LPID"
    wait "$LPID"
    rc=$?
    LPID=
    cat "$T/err"
    check "SIG$sig with --max-restarts 5: exit $want (got $rc)" [ $rc = $want ]
    check "SIG$sig: one attempt only" [ "$(attempts 0)" = 1 -a "$(attempts 1)" = 1 ]
    check "SIG$sig: no restart message" not grep -q restart "$T/err"
    check "SIG$sig: the ranks are gone" all_dead pid 3
done

# Ctrl-C while a failed attempt is being stopped: no restart either
rm -f "$T"/log.* "$T"/pid.*
cat >"$T/stubborn.sh" <<'SH'
#!/bin/bash
echo "$BRIGADE_RESTART_COUNT" >>"$1/log.$BRIGADE_RANK"
if [ "$BRIGADE_RANK" = 0 ]; then sleep 0.3; exit 3; fi
trap '' TERM
echo $$ >"$1/pid.$BRIGADE_RANK"
sleep 30 & wait; sleep 30
SH
chmod +x "$T/stubborn.sh"
"$BRIGADE" launch -n 2 --max-restarts 5 --grace 3 -- "$T/stubborn.sh" "$T" 2>"$T/err" &
LPID=$!
for i in $(seq 200); do grep -q 'stopping the other' "$T/err" 2>/dev/null && break; sleep 0.02; done
kill -INT "$LPID"
wait "$LPID"
rc=$?
LPID=
cat "$T/err"
check "Ctrl-C during the stop of a failed attempt: one attempt" [ "$(attempts 0)" = 1 -a "$(attempts 1)" = 1 ]
check "... no restart message" not grep -q restart "$T/err"
check "... and the launcher exits non-zero" [ $rc != 0 ]
check "... and the stubborn rank is gone" all_dead pid 3

# bad values
timeout -s KILL 10 "$BRIGADE" launch -n 2 --max-restarts -1 -- true 2>"$T/err"
rc=$?
check "--max-restarts -1: usage error (rc $rc)" [ $rc = 2 ]
check "--max-restarts -1: message" grep -q -- '--max-restarts must be in \[0, 1000000\], got -1' "$T/err"
"$BRIGADE" launch --help | grep -q -- '--max-restarts K' && ok "--help documents --max-restarts" || fail "--help lacks --max-restarts"
finish
