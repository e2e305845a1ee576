# tests/netns/test_netns_train.sh: a pp = 2 x dp = 2 GPT job across two
# hosts (2 ranks each) and across four hosts (1 rank each), network
# namespaces joined by veth pairs to a bridge, UCX over TCP on the veth
# (UCX_TLS=tcp, UCX_NET_DEVICES=eth0), the store on host 0's 10.77.0.1: the
# saved weights equal the one-host run's (brigade launch -n 4, shared memory)
# bitwise.
NETNS_LIMIT=80
. "$(dirname "$0")/../lib/harness.sh"
netns_init
ARGS=(--layers 2 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --steps 5 --threads 1
      --pp 2 --dp 2 --quiet)
export BRIGADE_TIMEOUT=10

netns_hosts 4

ref_run "$T/ref" "${ARGS[@]}"

for layout in "0 0 1 1" "0 1 2 3"; do
    name="hosts $(echo "$layout" | tr -d ' ')"
    tag=$(echo "$layout" | tr -d ' ')
    UCX_LOG_LEVEL=info job_start "$tag" "$layout" "${ARGS[@]}" --save "$T/$tag"
    job_wait
    check "$name: every rank exits 0" job_ok "$tag" 4
    check "$name: UCX used tcp on the veth" grep -q 'tag(tcp/eth0)' "$T/$tag.log.0"
    check "$name: weights bitwise equal to the one-host run" \
        "$BRIGADE" compare "$T/ref" "$T/$tag"
done
finish
