# tests/launch/test_stopped.sh: a stopped (SIGSTOP) or hung rank never makes
# the launcher wait forever: once a rank has exited, the others must exit
# within the exit deadline or are killed and named; a stopped rank is named
# before the survivors that fail because of it.
. "$(dirname "$0")/../lib/harness.sh"

# rank 3 of 4 stops itself; the others exit 0: killed 1 s after the first exit, exit 124
t0=$(now_us)
timeout -s KILL 20 "$BRIGADE" launch -n 4 --exit-timeout 1 -- "$HERE/rank.sh" stop-at "$T" 3 2>"$T/err"
rc=$? t1=$(now_us)
cat "$T/err"
check "a stopped rank after the others exit 0: exit 124 (got $rc)" [ $rc = 124 ]
# from the first of the others' exits (the deadline counts from there; the
# start-up of 4 shells under load is not the launcher's)
first=$(cat "$T"/end.* 2>/dev/null | sort -n | head -1)
ms=$(((t1 - ${first:-$t0}) / 1000))
check "it returns about 1 s after the others exited ($ms ms after the first exit)" [ -n "$first" -a "$ms" -lt 4000 ]
check "the first line names the stopped rank" bash -c "head -n 1 '$T/err' | grep -qE '^brigade launch: rank 3 \(pid [0-9]+\) was stopped by SIGSTOP'"
check "the killed rank is named with the deadline" grep -qE '^brigade launch: rank 3 \(pid [0-9]+\) \(stopped by SIGSTOP\) did not exit within 1 s after rank [012] ended; killed$' "$T/err"
check "the stopped rank is gone" all_dead pid 2
rm -f "$T"/pid.* "$T"/end.*

# the deadline comes from BRIGADE_TIMEOUT when --exit-timeout is not given
t0=$(now_us)
BRIGADE_TIMEOUT=2 timeout -s KILL 20 "$BRIGADE" launch -n 2 -- "$HERE/rank.sh" stop-at "$T" 1 2>"$T/err"
rc=$? t1=$(now_us)
first=$(cat "$T"/end.* 2>/dev/null | sort -n | head -1)
ms=$(((t1 - ${first:-$t0}) / 1000))
check "BRIGADE_TIMEOUT=2: killed 2 s after rank 0 exited, exit 124 (rc $rc, $ms ms)" \
    [ $rc = 124 -a -n "$first" -a "$ms" -ge 1900 -a "$ms" -lt 5000 ]
check "the message says 2 s" grep -q 'did not exit within 2 s after rank 0 ended; killed' "$T/err"
rm -f "$T"/pid.*

# a rank that exits 0 early is still fine when the others finish within the deadline
timeout -s KILL 20 "$BRIGADE" launch -n 3 --exit-timeout 5 -- bash -c \
    'if [ $BRIGADE_RANK = 0 ]; then exit 0; fi; sleep 1' 2>"$T/err"
rc=$?
check "others finishing within the deadline: exit 0 (got $rc)" [ $rc = 0 -a ! -s "$T/err" ]

# stopped mid-run: rank 2 stops, rank 0 then fails; the first line names rank 2, not rank 0
t0=$(now_us)
rm -f "$T"/end.*
timeout -s KILL 20 "$BRIGADE" launch -n 4 --grace 2 -- "$HERE/rank.sh" stop-fail "$T" 2 0 2>"$T/err"
rc=$? t1=$(now_us)
first=$(cat "$T"/end.0 2>/dev/null)
ms=$(((t1 - ${first:-$t0}) / 1000))   # from rank 0's failure
cat "$T/err"
check "the survivor's failure is the exit code (got $rc)" [ $rc = 1 ]
check "the first line names the stopped rank 2" bash -c "head -n 1 '$T/err' | grep -qE '^brigade launch: rank 2 \(pid [0-9]+\) was stopped by SIGSTOP'"
check "the failure line says rank 2 is stopped" grep -qE '^brigade launch: rank 0 \(pid [0-9]+\) exited with status 1 while rank 2 \(pid [0-9]+\) is stopped \(SIGSTOP\); stopping the other 3 ranks$' "$T/err"
check "the stopped rank is stopped promptly (SIGTERM + SIGCONT), not after the grace ($ms ms after rank 0 failed)" \
    [ -n "$first" -a "$ms" -lt 1500 ]
check "every rank is gone" all_dead pid 2

# a failure while another rank's exit is pending too (the launcher is stopped
# while both exit): both are accounted for and the launcher ends. (The hang
# that looking for stopped ranks with waitpid(pid, WUNTRACED) caused, by
# reaping an exit and losing it, showed in tests/runtime/test_numa.sh under
# load: a rank killed by SIGPIPE while the other one exited.)
timeout -s KILL 15 "$BRIGADE" launch -n 2 -- bash -c \
    'if [ $BRIGADE_RANK = 1 ]; then sleep 0.5; exit 3; fi; sleep 0.7; exit 0' 2>"$T/err" &
LPID=$!
sleep 0.2
pkill -STOP -P $LPID -x brigade
sleep 1.2
pkill -CONT -P $LPID -x brigade
wait $LPID
rc=$?
LPID=
cat "$T/err"
check "two exits pending at once: the failing rank's status 3 (got $rc)" [ $rc = 3 ]
finish
