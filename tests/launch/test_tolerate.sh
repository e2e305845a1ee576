# tests/launch/test_tolerate.sh: --tolerate-ranks (the workers of a
# parameter-server job): a tolerated rank's failure is reported in one line
# and the other ranks run to their end; the exit code is still the failed
# rank's; a rank outside the list still stops the job; bad lists are refused.
. "$(dirname "$0")/../lib/harness.sh"


expect_re 2 '^brigade launch: --tolerate-ranks "0..1": rank 0 serves the job' launch -n 3 --tolerate-ranks 0..1 -- true
expect_re 2 '^brigade launch: --tolerate-ranks "1..3": rank 3 is not one of the 3 ranks \(0..2\)$' \
    launch -n 3 --tolerate-ranks 1..3 -- true
expect_re 2 '^brigade launch: --tolerate-ranks "x": expected ranks' launch -n 3 --tolerate-ranks x -- true
expect_re 2 '^brigade launch: --tolerate-ranks "2..1": expected ranks A..B with A <= B$' launch -n 3 --tolerate-ranks 2..1 -- true

# rank 1 fails at once (exit 3); ranks 0 and 2 finish their work later and write a file
job='if [ "$BRIGADE_RANK" = 1 ]; then exit 3; fi; sleep 0.5; echo done > "$0.$BRIGADE_RANK"'
expect_re 3 'rank 1 \(pid [0-9]+\) exited with status 3; tolerated \(--tolerate-ranks 1,2\): the other 2 ranks go on' \
    launch -n 3 --tolerate-ranks 1,2 -- sh -c "$job" "$T/f"
check "rank 0 ran to its end" [ -f "$T/f.0" ]
check "rank 2 ran to its end" [ -f "$T/f.2" ]
check "the end says the job finished without it" grep -q "the job finished without 1 tolerated rank; exit code 3" "$T/err"
rm -f "$T"/f.*
# the same failure of a rank not in the list stops the job (the others never finish)
expect_re 3 'rank 1 \(pid [0-9]+\) exited with status 3; stopping the other 2 ranks' \
    launch -n 3 --tolerate-ranks 2 -- sh -c "$job" "$T/f"
check "rank 0 was stopped" [ ! -f "$T/f.0" ]
# a stopped server (rank 0) whose tolerated workers all fail: the launcher does
# not wait on it forever; once the last worker has ended it must exit within
# the exit deadline, and is killed and named
rm -f "$T"/pid.* "$T"/end.*
timeout -s KILL 30 "$BRIGADE" launch -n 3 --tolerate-ranks 1..2 --exit-timeout 1 -- \
    "$HERE/rank.sh" stop-others-fail "$T" 0 3 >"$T/out" 2>"$T/err"
rc=$? t1=$(now_us)
last=$(cat "$T"/end.* 2>/dev/null | sort -n | tail -1)
ms=$(((t1 - ${last:-0}) / 1000))
cat "$T/err"
check "a stopped server after its workers failed: exit 124 (got $rc)" [ $rc = 124 ]
check "the stopped server is killed and named" \
    grep -qE '^brigade launch: rank 0 \(pid [0-9]+\) \(stopped by SIGSTOP\) did not exit within 1 s after rank [12] ended; killed$' "$T/err"
check "about 1 s after the last worker ended ($ms ms)" [ -n "$last" -a "$ms" -lt 4000 ]
check "the server is gone" all_dead pid 2
rm -f "$T"/pid.* "$T"/end.*
# nothing fails: 0, and nothing said
timeout -s KILL 20 "$BRIGADE" launch -n 3 --tolerate-ranks 1..2 -- true >"$T/out" 2>"$T/err"
check "nothing fails: exit 0, quiet" [ $? = 0 ] && check "nothing fails: quiet" [ ! -s "$T/err" ]
finish
