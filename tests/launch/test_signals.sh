# tests/launch/test_signals.sh: signals to the launcher stop the whole job,
# and a launcher killed outright takes its ranks with it (PR_SET_PDEATHSIG).
# The launcher runs as a background job of this non-interactive script, which
# starts it with SIGINT ignored: `kill -INT` must work all the same.
. "$(dirname "$0")/../lib/harness.sh"
N=3

# start_job ARGS...: launch in the background; wait for every rank's pid file
start_job() {
    rm -f "$T"/pid.* "$T"/gpid.*
    "$BRIGADE" launch "$@" 2>"$T/err" &
    LPID=$!
    wait_files pid $N 10 || fail "the ranks did not start within 10 s"
}
# stop_job: wait for the launcher; sets rc and ms (time since the signal)
wait_job() {
    local t=$1
    wait "$LPID"
    rc=$?
    ms=$(ms_since "$t")
    LPID=
}

for sig in INT TERM HUP QUIT; do
    case $sig in INT) want=130 ;; TERM) want=143 ;; HUP) want=129 ;; QUIT) want=131 ;; esac
    start_job -n $N -- "$HERE/rank.sh" sleep "$T" 30
    t0=$(now_us)
    kill -$sig "$LPID"
    wait_job "$t0"
    cat "$T/err"
    check "SIG$sig to the launcher: exit $want (got $rc)" [ $rc = $want ]
    check "SIG$sig: the job stops promptly ($ms ms)" [ "$ms" -lt 3000 ]
    check "SIG$sig: message" grep -qx "brigade launch: received SIG$sig; stopping $N ranks (SIGTERM, then SIGKILL after 5 s)" "$T/err"
    check "SIG$sig: no rank survives" all_dead pid 1
done

# under nohup (SIGHUP ignored at start) a hang-up is ignored, as nohup promises
rm -f "$T"/pid.*
bash -c 'trap "" HUP; exec "$@"' _ "$BRIGADE" launch -n $N -- "$HERE/rank.sh" sleep "$T" 30 2>"$T/err" &
LPID=$!
wait_files pid $N 10 || fail "the ranks did not start within 10 s"
kill -HUP "$LPID"
sleep 0.3
check "SIGHUP ignored at start: the launcher keeps running" alive "$LPID"
check "SIGHUP ignored at start: the ranks keep running" alive "$(cat "$T/pid.0")"
hup_ignored() { local m; m=$(sed -n 's/^SigIgn:[[:space:]]*//p' "/proc/$1/status"); [ -n "$m" ] && (((0x$m & 1) == 1)); }
check "SIGHUP ignored at start: the ranks inherit it ignored" hup_ignored "$(cat "$T/pid.1")"
t0=$(now_us)
kill -TERM "$LPID"
wait_job "$t0"
check "... and SIGTERM still stops it (rc $rc)" [ $rc = 143 ]
check "... with no rank left" all_dead pid 1

# ranks that ignore SIGTERM: a second Ctrl-C kills at once, without waiting out the grace
start_job -n $N --grace 20 -- "$HERE/rank.sh" ignore-term "$T"
t0=$(now_us)
kill -INT "$LPID"
sleep 0.3
kill -INT "$LPID"
wait_job "$t0"
cat "$T/err"
check "second SIGINT: exit 130 (got $rc)" [ $rc = 130 ]
check "second SIGINT: SIGKILL at once, not after the 20 s grace ($ms ms)" [ "$ms" -lt 3000 ]
check "second SIGINT: message" grep -qx "brigade launch: received SIGINT again; sending SIGKILL to $N ranks" "$T/err"
check "second SIGINT: no rank survives" all_dead pid 1

# what the ranks started is stopped with them
start_job -n $N -- "$HERE/rank.sh" grandchild "$T"
wait_files gpid $N 10 || fail "the grandchildren did not start"
t0=$(now_us)
kill -TERM "$LPID"
wait_job "$t0"
check "SIGTERM with grandchildren: exit 143 (got $rc)" [ $rc = 143 ]
check "SIGTERM reaches the ranks' children" all_dead gpid 2

# SIGKILL to the launcher: the ranks die with it (PR_SET_PDEATHSIG)
start_job -n $N -- "$HERE/rank.sh" sleep "$T" 30
kill -KILL "$LPID"
t0=$(now_us)
wait_job "$t0"
check "SIGKILLed launcher: status 137 (got $rc)" [ $rc = 137 ]
check "SIGKILLed launcher: no rank survives" all_dead pid 3

# Ctrl-Z: SIGTSTP stops the ranks with the launcher; SIGCONT resumes them
start_job -n $N -- "$HERE/rank.sh" sleep "$T" 30
kill -TSTP "$LPID"
stopped() {
    local f
    [ "$(pstate "$LPID")" = T ] || return 1
    for f in "$T"/pid.*; do [ "$(pstate "$(cat "$f")")" = T ] || return 1; done
}
running() {
    local f
    [ "$(pstate "$LPID")" != T ] || return 1
    for f in "$T"/pid.*; do [ "$(pstate "$(cat "$f")")" != T ] || return 1; done
}
poll_for() { # poll_for SECONDS FUNC
    local i
    for ((i = 0; i < $1 * 50; i++)); do "$2" && return 0; sleep 0.02; done
    return 1
}
check "SIGTSTP stops the launcher and every rank" poll_for 3 stopped
kill -CONT "$LPID"
check "SIGCONT resumes the launcher and every rank" poll_for 3 running
t0=$(now_us)
kill -TERM "$LPID"
wait_job "$t0"
check "after SIGCONT the job still stops on SIGTERM (rc $rc)" [ $rc = 143 ]
check "no rank survives" all_dead pid 1
finish
