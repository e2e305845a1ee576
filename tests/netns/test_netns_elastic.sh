# tests/netns/test_netns_elastic.sh: brigade launch --elastic across four
# hosts made of network namespaces (--rsh "ip netns exec", UCX over TCP on
# the veths). A --dp auto job loses host 0, the one serving the store, for
# good after its first checkpoint: its processes are SIGKILLed and its
# namespace deleted (`ip netns exec` fails there). The launcher must drop it,
# move the store to host 1's address and restart on hosts 1-3; the job
# re-plans dp 4 -> 3 from the checkpoint and finishes with the weights of a
# run stopped by hand at that step and resumed on dp 3, bitwise.
# (tests/launch/test_elastic.sh: the same without root, through a fake remote shell.)
NETNS_LIMIT=140
. "$(dirname "$0")/../lib/harness.sh"
netns_init
STEPS=1500
GPT=(--layers 2 --d-model 16 --heads 2 --seq 16 --batch 12 --microbatches 1 --threads 1 --quiet)
export BRIGADE_TIMEOUT=5

netns_hosts 4
hosts=
for i in 0 1 2 3; do hosts+="${hosts:+,}${H[i]}=${ADDR[i]}"; done

lose_host0() {
    kill_host 0
    ip netns del "${H[0]}"
}
elastic_lose_host lose_host0 --hosts "$hosts" --rsh "ip netns exec" --elastic 2:4 --max-restarts 2 --timeout 110 -- \
    "$B" train "${GPT[@]}" --steps $STEPS --dp auto --checkpoint-dir "$T/ck" --checkpoint-every 50 --resume \
    --save "$T/el-out"
check "the launcher names the lost host" grep -q "elastic: host ${H[0]} is lost (.ip netns exec ${H[0]} true.: exit status" "$T/el.log"
check "the store moves to host 1" grep -qF "elastic: world 4 -> 3: 3 ranks on 3 hosts (${H[1]},${H[2]},${H[3]}), master ${ADDR[1]}" "$T/el.log"
# by hand on one host (shared memory gives the bits of TCP: test_netns_train)
elastic_resumed_like_by_hand "$T/el.log" "$T/el-out" $STEPS "${GPT[@]}"
finish
