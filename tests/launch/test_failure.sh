# tests/launch/test_failure.sh: a failing rank stops the job, and the
# launcher exits with that rank's status, naming it.
. "$(dirname "$0")/../lib/harness.sh"

# launch_job ERR ARGS...: `brigade launch ARGS`, killed after 25 s, its stderr
# to the file ERR (-: left as it is); sets rc to its exit status and ms to the
# milliseconds it took
launch_job() {
    local err=$1 t0
    shift
    t0=$(now_us)
    if [ "$err" = - ]; then
        timeout -s KILL 25 "$BRIGADE" launch "$@"
    else
        timeout -s KILL 25 "$BRIGADE" launch "$@" 2>"$err"
    fi
    rc=$? ms=$(ms_since "$t0")
}

# rank 2 of 4 exits 3 after 0.2 s; the others would sleep 30 s
launch_job "$T/err" -n 4 -- "$HERE/rank.sh" fail-at "$T" 2 3
cat "$T/err"
check "rank 2 exits 3: launcher exits 3 (got $rc)" [ $rc = 3 ]
check "the launch returns well before the 30 s sleep ($ms ms)" [ "$ms" -lt 5000 ]
check "stderr names rank 2 and its status" grep -qE '^brigade launch: rank 2 \(pid [0-9]+\) exited with status 3; stopping the other 3 ranks$' "$T/err"
check "the pid named is rank 2's" grep -q "(pid $(cat "$T/pid.2"))" "$T/err"
check "the sleeping ranks are gone" all_dead pid 2
rm -f "$T"/pid.*

# rank 1 of 3 dies by SIGKILL: 128+9
launch_job "$T/err" -n 3 -- "$HERE/rank.sh" kill-at "$T" 1 KILL
cat "$T/err"
check "rank killed by SIGKILL: launcher exits 137 (got $rc)" [ $rc = 137 ]
check "stderr says rank 1 was killed by signal 9" grep -qE '^brigade launch: rank 1 \(pid [0-9]+\) was killed by signal 9 \(Killed\); stopping the other 2 ranks$' "$T/err"
check "the other ranks are gone" all_dead pid 2
rm -f "$T"/pid.*

# a rank dying by SIGSEGV: 139
launch_job "$T/err" -n 2 -- "$HERE/rank.sh" kill-at "$T" 0 SEGV
check "rank killed by SIGSEGV: launcher exits 139 (got $rc)" [ $rc = 139 ]
check "stderr says signal 11" grep -q 'rank 0 (pid [0-9]*) was killed by signal 11 (Segmentation fault' "$T/err"
rm -f "$T"/pid.*

# the others ignore SIGTERM: SIGKILL after --grace 1
launch_job "$T/err" -n 3 --grace 1 -- "$HERE/rank.sh" stubborn "$T" 2
cat "$T/err"
check "stubborn ranks: launcher exits with rank 2's status 1 (got $rc)" [ $rc = 1 ]
check "SIGKILL comes after the 1 s grace, not before, not much later ($ms ms)" [ "$ms" -ge 1100 -a "$ms" -lt 4000 ]
check "stderr says which ranks needed SIGKILL" [ "$(grep -cE '^brigade launch: rank [01] \(pid [0-9]+\) still running 1 s after SIGTERM; sending SIGKILL$' "$T/err")" = 2 ]
check "the stubborn ranks are gone" all_dead pid 2
rm -f "$T"/pid.*

# --grace 0: SIGKILL at once
launch_job /dev/null -n 2 --grace 0 -- "$HERE/rank.sh" stubborn "$T" 1
check "--grace 0 kills at once (rc $rc, $ms ms)" [ $rc = 1 -a "$ms" -lt 1500 ]
rm -f "$T"/pid.*

# what a rank started itself is stopped too (each rank leads its own process group)
timeout -s KILL 25 "$BRIGADE" launch -n 3 -- bash -c \
    'if [ $BRIGADE_RANK = 0 ]; then sleep 0.3; exit 4; fi; exec "$0" grandchild "$1"' "$HERE/rank.sh" "$T" 2>/dev/null
rc=$?
check "exit 4 propagates through bash -c (got $rc)" [ $rc = 4 ]
check "the grandchildren were recorded" [ -s "$T/gpid.1" -a -s "$T/gpid.2" ]
check "the ranks' own children are stopped with them" all_dead gpid 2
rm -f "$T"/pid.* "$T"/gpid.*

# --timeout: the whole job is stopped, exit 124
launch_job "$T/err" -n 2 --timeout 1 -- "$HERE/rank.sh" sleep "$T" 30
cat "$T/err"
check "--timeout 1: exit 124 (got $rc)" [ $rc = 124 ]
check "--timeout 1: stopped after about 1 s ($ms ms)" [ "$ms" -ge 950 -a "$ms" -lt 4000 ]
check "--timeout message" grep -qx 'brigade launch: timeout: the job is still running after 1 s (--timeout); stopping 2 ranks' "$T/err"
check "the ranks are gone after --timeout" all_dead pid 2
rm -f "$T"/pid.*
launch_job - -n 2 --timeout 10 -- true
check "--timeout does not delay a job that ends (rc $rc, $ms ms)" [ $rc = 0 -a "$ms" -lt 2000 ]
finish
