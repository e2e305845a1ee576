# tests/launch/test_output.sh: where the ranks' output goes: inherited as is,
# or tagged line by line with --tag-output (stdout kept on stdout, stderr on
# stderr); the ranks' stdin is /dev/null.
. "$(dirname "$0")/../lib/harness.sh"
L() { timeout -s KILL 20 "$BRIGADE" launch "$@"; }

# without --tag-output the ranks write to the launcher's stdout/stderr directly
L -n 3 -- bash -c 'echo "out $BRIGADE_RANK"; echo "err $BRIGADE_RANK" >&2' >"$T/out" 2>"$T/err"
rc=$?
check "untagged: exit 0 (got $rc)" [ $rc = 0 ]
check "untagged: stdout holds exactly the ranks' stdout" [ "$(sort "$T/out" | tr '\n' ,)" = "out 0,out 1,out 2," ]
check "untagged: stderr holds exactly the ranks' stderr" [ "$(sort "$T/err" | tr '\n' ,)" = "err 0,err 1,err 2," ]

# --tag-output: a prefix per line; partial last lines flushed at EOF with a newline
L -n 3 --tag-output -- bash -c 'r=$BRIGADE_RANK; echo "a$r"; echo "b$r" >&2; printf "c%s\nd%s" $r $r; printf "e%s" $r >&2' \
    >"$T/out" 2>"$T/err"
rc=$?
check "tagged: exit 0 (got $rc)" [ $rc = 0 ]
exp_out="[rank 0] a0,[rank 0] c0,[rank 0] d0,[rank 1] a1,[rank 1] c1,[rank 1] d1,[rank 2] a2,[rank 2] c2,[rank 2] d2,"
exp_err="[rank 0] b0,[rank 0] e0,[rank 1] b1,[rank 1] e1,[rank 2] b2,[rank 2] e2,"
got_out=$(sort "$T/out" | tr '\n' ,)
got_err=$(sort "$T/err" | tr '\n' ,)
check "tagged stdout: every line prefixed, nothing from stderr (got $got_out)" [ "$got_out" = "$exp_out" ]
check "tagged stderr: every line prefixed, nothing from stdout (got $got_err)" [ "$got_err" = "$exp_err" ]
check "tagged: a rank's lines keep their order" [ "$(grep -F '[rank 1]' "$T/out" | tr '\n' ,)" = "[rank 1] a1,[rank 1] c1,[rank 1] d1," ]
check "tagged: output ends with a newline" [ "$(tail -c 1 "$T/out" | od -An -c | tr -d ' ')" = '\n' ]

# volume: 4 ranks x 20000 lines, interleaved by the launcher but never mangled
L -n 4 --tag-output -- bash -c 'seq -f "line $BRIGADE_RANK %g" 1 20000' >"$T/out"
rc=$?
check "tagged volume: exit 0 (got $rc)" [ $rc = 0 ]
check "tagged volume: 80000 lines" [ "$(wc -l <"$T/out")" = 80000 ]
check "tagged volume: every line well formed" [ "$(grep -cxE '\[rank ([0-3])\] line \1 [0-9]+' "$T/out")" = 80000 ]
for r in 0 3; do
    check "tagged volume: rank $r's lines complete and in order" \
        cmp -s <(sed -n "s/^\[rank $r\] line $r //p" "$T/out") <(seq 1 20000)
done

# a line longer than the launcher's 64 KiB line buffer arrives in prefixed pieces:
# a full buffer goes out as a piece; the line's end goes out with what the buffer
# holds, so the last piece can reach 64 KiB + one 64 KiB read, and 150,000 bytes
# take at least 2 pieces (more when a slow pipe delivers smaller reads)
L -n 1 --tag-output -- bash -c 'head -c 150000 /dev/zero | tr "\0" x; echo; echo next' >"$T/out"
n=$(wc -l <"$T/out")
check "tagged long line: at least 2 pieces + 1 line (got $n)" [ "$n" -ge 3 ]
longest=$(head -n $((n - 1)) "$T/out" | awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }')
check "tagged long line: no piece over 64 KiB + 64 KiB (longest $longest with its prefix)" \
    [ "$longest" -le $((131072 + 9)) ]
check "tagged long line: every piece prefixed" [ "$(grep -c '^\[rank 0\] ' "$T/out")" = "$n" ]
check "tagged long line: the pieces make up the line" [ "$(head -n $((n - 1)) "$T/out" | sed 's/^\[rank 0\] //' | tr -d '\n' | wc -c)" = 150000 ]
check "tagged long line: the next line follows" [ "$(tail -n 1 "$T/out")" = "[rank 0] next" ]

# a failing rank's last words are not lost with --tag-output
L -n 2 --tag-output -- bash -c '[ $BRIGADE_RANK = 1 ] && { echo "dying" >&2; exit 5; }; exec sleep 30' 2>"$T/err"
rc=$?
check "tagged failure: exit 5 (got $rc)" [ $rc = 5 ]
check "tagged failure: the rank's stderr was forwarded" grep -qx '\[rank 1\] dying' "$T/err"

# stdin: /dev/null for every rank, whatever the launcher's stdin is
out=$(echo "should not be read" | L -n 2 -- cat)
rc=$?
check "ranks read EOF on stdin (rc $rc, got '$out')" [ $rc = 0 -a -z "$out" ]

out=$(L -n 1 -- bash -c 'readlink /proc/$$/fd/0')
check "a rank's stdin is /dev/null (got '$out')" [ "$out" = /dev/null ]
out=$(L -n 1 -- bash -c 'readlink /proc/$$/fd/0' <&-)
check "... also when the launcher's stdin is closed (got '$out')" [ "$out" = /dev/null ]

L -n 2 --tag-output -- bash -c 'echo x; echo "y $BRIGADE_RANK" >&2' >&- 2>"$T/err"
rc=$?
check "launcher started with stdout closed: exit 0 (got $rc)" [ $rc = 0 ]
check "... and the ranks' stderr still arrives" [ "$(sort "$T/err" | tr '\n' ,)" = "[rank 0] y 0,[rank 1] y 1," ]

# a closed stdout does not kill the launcher
L -n 2 --tag-output -- bash -c 'for i in $(seq 1 2000); do echo x; done' | head -n 1 >/dev/null
rc=${PIPESTATUS[0]}
check "tagged output into a closed pipe: launcher still exits 0 (got $rc)" [ $rc = 0 ]
finish
