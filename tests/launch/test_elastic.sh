#!/usr/bin/env bash
# tests/launch/test_elastic.sh: brigade launch --hosts --rsh --elastic without
# root. Four "hosts" run on this machine through tests/launch/fakehost.sh (a
# remote shell whose host can be made unreachable). A --dp auto job on 4 hosts
# loses host h3 for good (its rank SIGKILLed, the host unreachable) after its
# first checkpoint: the launcher drops h3, restarts on 3 hosts, the job
# re-plans dp 4 -> 3 from its checkpoint and finishes with the weights of a
# run stopped by hand at that step and resumed on dp 3, bitwise. Bad input
# and a job that cannot go on end with a clear message and a non-zero exit,
# never a hang. (tests/netns/test_netns_elastic.sh: the same across network
# namespaces, as root.)
. "$(dirname "$0")/../lib/harness.sh"
F=$(cd "$(dirname "$0")" && pwd)/fakehost.sh
export FAKEHOST_DIR=$T/hosts BRIGADE_TIMEOUT=5
mkdir -p "$FAKEHOST_DIR"
H4=h0=127.0.0.1,h1=127.0.0.1,h2=127.0.0.1,h3=127.0.0.1
GPT=(--layers 2 --d-model 16 --heads 2 --seq 16 --batch 12 --microbatches 1 --threads 1 --quiet)
STEPS=1500
CK=(--checkpoint-dir "$T/ck" --checkpoint-every 50 --resume)
# first_checkpoint: wait (at most 20 s) for the job's first complete checkpoint
first_checkpoint() {
    local i
    for ((i = 0; i < 400; i++)); do
        [ -e "$T/ck/step-00000050/manifest.json" ] && return 0
        sleep 0.05
    done
    return 1
}

# ---- bad input: refused before anything starts (exit 2)
TRAIN=(-- "$B" train "${GPT[@]}" --steps 10 --dp auto "${CK[@]}")
expect 2 "--elastic 3:2: MIN is more than MAX" launch --hosts $H4 --rsh "$F" --elastic 3:2 --max-restarts 1 "${TRAIN[@]}"
expect 2 "--elastic 5:8: MIN is more than the 4 ranks of --hosts (4 hosts x 1)" launch --hosts $H4 --rsh "$F" \
    --elastic 5:8 --max-restarts 1 "${TRAIN[@]}"
expect 2 "--elastic \"0:2\": expected MIN:MAX" launch --hosts $H4 --rsh "$F" --elastic 0:2 --max-restarts 1 "${TRAIN[@]}"
expect 2 "--elastic needs --hosts" launch -n 4 --elastic 2:4 --max-restarts 1 "${TRAIN[@]}"
expect 2 "--elastic needs --rsh" launch --hosts $H4 --elastic 2:4 --max-restarts 1 "${TRAIN[@]}"
expect 2 "give --max-restarts N (N >= 1)" launch --hosts $H4 --rsh "$F" --elastic 2:4 "${TRAIN[@]}"
expect 2 "give it --checkpoint-dir DIR --checkpoint-every N --resume" launch --hosts $H4 --rsh "$F" --elastic 2:4 \
    --max-restarts 1 -- "$B" train "${GPT[@]}" --dp auto --save "$T/x"
expect 2 "give it --dp auto (or --pp auto)" launch --hosts $H4 --rsh "$F" --elastic 2:4 --max-restarts 1 -- \
    "$B" train "${GPT[@]}" --dp 4 "${CK[@]}"
expect 2 "-n 3, but --hosts gives 4 hosts x 1 rank" launch -n 3 --hosts $H4 "${TRAIN[@]}"
expect 2 "host h1 is listed twice" launch --hosts h0,h1,h1 "${TRAIN[@]}"
expect 2 "--rsh needs --hosts" launch -n 2 --rsh "$F" "${TRAIN[@]}"
[ -e "$T/ck" ] && bad "a refused launch wrote $T/ck" || ok "nothing ran"

# ---- --hosts without --elastic: blocks of --nproc-per-host, local ranks per host, the first host's address
cat >"$T/env.sh" <<'SH'
#!/bin/bash
echo "$BRIGADE_RANK $BRIGADE_LOCAL_RANK $BRIGADE_WORLD_SIZE $BRIGADE_MASTER_ADDR" >"$FAKEHOST_DIR/env.$BRIGADE_RANK"
SH
chmod +x "$T/env.sh"
timeout -s KILL 30 "$B" launch --hosts a=10.1.1.1,b --nproc-per-host 2 --rsh "$F" -- "$T/env.sh"
check "--hosts: 2 hosts x 2 ranks started" [ "$(cat "$FAKEHOST_DIR"/a.pids "$FAKEHOST_DIR"/b.pids | wc -l)" = 4 ]
same_text() { [ "$(cat "$FAKEHOST_DIR"/env.* | tr '\n' ';')" = "$1" ]; }
check "--hosts: rank, local rank, world, master address" same_text "0 0 4 10.1.1.1;1 1 4 10.1.1.1;2 0 4 10.1.1.1;3 1 4 10.1.1.1;"
rm -f "$FAKEHOST_DIR"/*

# ---- --elastic before the first start: a host down already is lost; MAX leaves the hosts after it spare
touch "$FAKEHOST_DIR/b.down"
timeout -s KILL 30 "$B" launch --hosts a=127.0.0.1,b,c,d --rsh "$F" --elastic 1:2 --max-restarts 1 -- "$T/env.sh" \
    2>"$T/spare.log"
check "--elastic: a host down at the start is lost" grep -q "elastic: host b is lost" "$T/spare.log"
check "--elastic: MAX 2 runs on the first 2 hosts left" grep -qF "elastic: 2 ranks on 2 hosts (a,c)" "$T/spare.log"
check "--elastic: rank 1 on host c, world 2" same_text "0 0 2 127.0.0.1;1 0 2 127.0.0.1;"
check "--elastic: only the probe on the spare" [ "$(wc -l <"$FAKEHOST_DIR/d.pids")" = 1 ]
rm -f "$FAKEHOST_DIR"/*

# ---- a host lost for good: 4 hosts -> 3, dp 4 -> 3, resumed from the newest checkpoint
lose_h3() {
    touch "$FAKEHOST_DIR/h3.down"
    kill -KILL "$(tail -n 1 "$FAKEHOST_DIR/h3.pids")" # its rank: the last pid (the first is the probe's, gone)
}
elastic_lose_host lose_h3 --hosts $H4 --rsh "$F" --elastic 2:4 --max-restarts 2 --timeout 180 -- \
    "$B" train "${GPT[@]}" --steps $STEPS --dp auto "${CK[@]}" --save "$T/el-out" --metrics "$T/m.jsonl"
check "the launcher names the lost host" grep -q "elastic: host h3 is lost (.*fakehost.sh h3 true.: exit status 255)" "$T/el.log"
check "the launcher says the new world" grep -qF "elastic: world 4 -> 3: 3 ranks on 3 hosts (h0,h1,h2), master 127.0.0.1" "$T/el.log"
elastic_resumed_like_by_hand "$T/el.log" "$T/el-out" $STEPS "${GPT[@]}"
check "the metrics show the layout before" grep -q '"rank": 0, "step": 1, .*"world": 4, "pp": 1, "dp": 4' "$T/m.jsonl"
check "the metrics show the layout after" grep -q '"rank": 0, "step": '$STEPS', .*"world": 3, "pp": 1, "dp": 3' "$T/m.jsonl"

# ---- fewer hosts than MIN: the launcher gives up at once, with the failed attempt's status
rm -rf "${FAKEHOST_DIR:?}"/* "$T/ck"
t0=$(now_us)
timeout -s KILL 100 "$B" launch --hosts $H4 --rsh "$F" --elastic 4:4 --max-restarts 3 --timeout 90 -- \
    "$B" train "${GPT[@]}" --steps 100000 --dp auto "${CK[@]}" >"$T/min.log" 2>&1 &
job=$!
first_checkpoint || bad "MIN: no checkpoint within 20 s"
touch "$FAKEHOST_DIR/h2.down"
kill -KILL "$(tail -n 1 "$FAKEHOST_DIR/h2.pids")"
wait $job
rc=$?
# the failed attempt's status: 137 for the killed rank, or 1 when a survivor's exit was seen first
check "fewer than MIN: exit non-zero (rc $rc)" [ $rc = 137 -o $rc = 1 ] || cat "$T/min.log"
check "fewer than MIN: said" grep -qF "elastic: 3 of 4 hosts left, 3 ranks: fewer than --elastic 4:4 allows; giving up (exit code $rc)" "$T/min.log"
check "fewer than MIN: one attempt only" [ "$(grep -c 'restart 1 of 3' "$T/min.log")" = 1 ]
check "fewer than MIN: not a hang ($(ms_since "$t0") ms)" [ "$(ms_since "$t0")" -lt 60000 ]

# ---- restarts exhausted: a job that fails on every world ends with its status after K restarts
rm -rf "${FAKEHOST_DIR:?}"/*
expect 3 "the job failed after 2 restarts (--max-restarts 2); exit code 3" launch --hosts $H4 --rsh "$F" \
    --elastic 1:4 --max-restarts 2 --timeout 50 -- sh -c 'sleep 0.2; exit 3'
finish
