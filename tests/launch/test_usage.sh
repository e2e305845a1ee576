# tests/launch/test_usage.sh: bad usage and commands that cannot run end in
# a clear message and a non-zero exit code; --help works.
. "$(dirname "$0")/../lib/harness.sh"


expect_re 2 '^brigade launch: missing -n N' launch
expect_re 2 '^brigade launch: missing -n N' launch -- true
expect_re 2 '^brigade launch: -n must be in \[1, 4096\], got 0$' launch -n 0 -- true
expect_re 2 '^brigade launch: -n must be in \[1, 4096\], got -2$' launch -n -2 -- true
expect_re 2 '^brigade launch: -n must be in \[1, 4096\], got 5000$' launch -n 5000 -- true
expect_re 2 '^brigade launch: -n expects an integer, got "abc"$' launch -n abc -- true
expect_re 2 '^brigade launch: -n needs a value$' launch -n
expect_re 2 '^brigade launch: no command to run' launch -n 2
expect_re 2 '^brigade launch: no command to run' launch -n 2 --
expect_re 2 '^brigade launch: the command to run is an empty string$' launch -n 2 -- ''
expect_re 2 '^brigade launch: unknown option "--bogus"' launch -n 2 --bogus -- true
expect_re 2 '^brigade launch: unknown option "-x"' launch -x -n 2 -- true
expect_re 2 '^brigade launch: --tag-output takes no value$' launch --tag-output=yes -n 2 -- true
expect_re 2 '^brigade launch: --master-port must be in \[1, 65535\], got 70000$' launch -n 2 --master-port 70000 -- true
expect_re 2 '^brigade launch: --master-addr needs' launch -n 2 --master-addr= -- true
expect_re 2 '^brigade launch: --timeout expects a number, got "soon"$' launch -n 2 --timeout soon -- true
expect_re 2 '^brigade launch: --timeout must be in' launch -n 2 --timeout 0 -- true
expect_re 2 '^brigade launch: --grace must be in' launch -n 2 --grace -1 -- true

# a command that cannot run: exit 127 (not found) or 126 (not executable), like a shell
expect_re 127 "^brigade launch: rank 0: cannot execute 'brigade-no-such-command': No such file or directory$" \
    launch -n 3 -- brigade-no-such-command
check "not found: one message only" [ "$(wc -l <"$T/err")" = 1 ]
expect_re 127 "^brigade launch: rank 0: cannot execute '$T/missing': No such file or directory$" launch -n 1 -- "$T/missing"
printf 'echo hi\n' >"$T/noexec.sh"
chmod 644 "$T/noexec.sh"
expect_re 126 "^brigade launch: rank 0: cannot execute '$T/noexec.sh': Permission denied$" launch -n 2 -- "$T/noexec.sh"
expect_re 126 "^brigade launch: rank 0: cannot execute '$T': Permission denied$" launch -n 2 -- "$T"

# --help: usage on stdout, exit 0; the command list names launch
timeout -s KILL 10 "$BRIGADE" launch --help >"$T/out" 2>"$T/err"
rc=$?
check "launch --help: exit 0 (got $rc)" [ $rc = 0 ]
check "launch --help: usage on stdout" grep -q '^usage: brigade launch -n N' "$T/out"
check "launch --help: nothing on stderr" [ ! -s "$T/err" ]
timeout -s KILL 10 "$BRIGADE" launch -n 2 -h -- true >"$T/out"
check "-h anywhere before the command prints usage" grep -q '^usage: brigade launch' "$T/out"
timeout -s KILL 10 "$BRIGADE" --help >"$T/out"
check "brigade --help lists launch" grep -qE '^  launch +' "$T/out"

# options after the command belong to the command
out=$(timeout -s KILL 10 "$BRIGADE" launch -n 1 -- echo -n --help)
check "flags after the command are the command's (got '$out')" [ "$out" = "--help" ]
finish
