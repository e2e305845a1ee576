# tests/launch/test_env.sh: what every rank sees (BRIGADE_* variables, the
# inherited environment, its arguments) and how the command is found.
. "$(dirname "$0")/../lib/harness.sh"

N=4
rm -f "$T"/env.*
BRIGADE_RANK=99 BRIGADE_JOB_TOKEN=stale BG_TEST_INHERITED='x y' \
    timeout -s KILL 20 "$BRIGADE" launch -n $N -- "$HERE/rank.sh" env "$T" "a b" 'c*d' '' '$HOME'
rc=$?
check "4 ranks exiting 0: launcher exits 0 (got $rc)" [ $rc = 0 ]
check "each rank wrote its file" [ "$(ls "$T"/env.* 2>/dev/null | wc -l)" = $N ]
ranks=$(cat "$T"/env.* | sed -n 's/^rank=//p' | sort -n | tr '\n' ' ')
check "ranks are 0..3, each once (got: $ranks)" [ "$ranks" = "0 1 2 3 " ]
for r in 0 1 2 3; do
    check "rank $r: file and BRIGADE_RANK agree" grep -qx "rank=$r" "$T/env.$r"
    check "rank $r: BRIGADE_LOCAL_RANK = rank" grep -qx "local=$r" "$T/env.$r"
done
check "every rank: BRIGADE_WORLD_SIZE=4" [ "$(grep -hx 'world=4' "$T"/env.* | wc -l)" = $N ]
check "every rank: BRIGADE_MASTER_ADDR=127.0.0.1" [ "$(grep -hx 'addr=127.0.0.1' "$T"/env.* | wc -l)" = $N ]
check "one port for all ranks" [ "$(grep -h '^port=' "$T"/env.* | sort -u | wc -l)" = 1 ]
port=$(sed -n 's/^port=//p' "$T/env.0")
check "port is a number in 1024..65535 (got $port)" [ "$port" -ge 1024 -a "$port" -le 65535 ]
check "one token for all ranks" [ "$(grep -h '^token=' "$T"/env.* | sort -u | wc -l)" = 1 ]
token1=$(sed -n 's/^token=//p' "$T/env.0")
check "token is 32 lowercase hex characters (got '$token1')" grep -qxE "[0-9a-f]{32}" <<<"$token1"
check "the rest of the environment is inherited" grep -qx 'inherited=x y' "$T/env.0"
check "arguments arrive intact" grep -qxF 'args=<a b><c*d><><$HOME>' "$T/env.3"

# a second launch: a fresh token (and, almost surely, a different free port is fine either way)
rm -f "$T"/env.*
timeout -s KILL 20 "$BRIGADE" launch -n 2 -- "$HERE/rank.sh" env "$T"
token2=$(sed -n 's/^token=//p' "$T/env.0")
check "a second launch gets a different token ($token1 vs $token2)" [ -n "$token2" -a "$token1" != "$token2" ]

# explicit address and port, the --name=value and -nN spellings
rm -f "$T"/env.*
timeout -s KILL 20 "$BRIGADE" launch -n3 --master-addr=10.1.2.3 --master-port 12345 -- "$HERE/rank.sh" env "$T"
rc=$?
check "-n3 --master-addr=A --master-port P: exit 0 (got $rc)" [ $rc = 0 ]
check "--master-addr reaches every rank" [ "$(grep -hx 'addr=10.1.2.3' "$T"/env.* | wc -l)" = 3 ]
check "--master-port reaches every rank" [ "$(grep -hx 'port=12345' "$T"/env.* | wc -l)" = 3 ]
rm -f "$T"/env.*
timeout -s KILL 20 "$BRIGADE" launch --nproc=2 "$HERE/rank.sh" env "$T"
check "--nproc=2 and a command without --" [ "$(grep -hx 'world=2' "$T"/env.* | wc -l)" = 2 ]

# the command is looked up on PATH, or taken as a path
out=$(cd "$HERE" && timeout -s KILL 20 "$BRIGADE" launch -n 2 -- ./rank.sh env "$T" && echo done)
check "a relative path runs" [ "$out" = done ]
out=$(PATH="$HERE:$PATH" timeout -s KILL 20 "$BRIGADE" launch -n 2 -- rank.sh env "$T" && echo done)
check "a command found on PATH runs" [ "$out" = done ]

# exit 0 only once every rank is done: the launcher waits for the slowest
t0=$(now_us)
timeout -s KILL 20 "$BRIGADE" launch -n 2 -- bash -c '[ $BRIGADE_RANK = 1 ] && sleep 0.5; exit 0'
rc=$? ms=$(ms_since "$t0")
check "a rank exiting 0 early does not end the job (rc $rc after $ms ms)" [ $rc = 0 -a "$ms" -ge 450 ]

# many ranks: 64 at once, each with its own rank
rm -f "$T"/env.*
t0=$(now_us)
timeout -s KILL 20 "$BRIGADE" launch -n 64 -- "$HERE/rank.sh" env "$T"
rc=$? ms=$(ms_since "$t0")
echo "64 ranks of rank.sh started and finished in $ms ms"
check "64 ranks: exit 0 (got $rc)" [ $rc = 0 ]
check "64 ranks: ranks 0..63, each once" cmp -s <(sed -n 's/^rank=//p' "$T"/env.* | sort -n) <(seq 0 63)

# -v: one line per rank start and end, and a summary
timeout -s KILL 20 "$BRIGADE" launch -v -n 2 -- true 2>"$T/err"
check "-v: a line per rank start" [ "$(grep -cE '^brigade launch: started rank [01] \(pid [0-9]+\)$' "$T/err")" = 2 ]
check "-v: a line per rank end" [ "$(grep -cE '^brigade launch: rank [01] \(pid [0-9]+\) exited with status 0$' "$T/err")" = 2 ]
check "-v: a summary" grep -qE '^brigade launch: done in [0-9.]+ s, exit code 0$' "$T/err"
finish
