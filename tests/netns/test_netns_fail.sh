# tests/netns/test_netns_fail.sh: a pp = 2 x dp = 2 job on two hosts (ranks
# 0-1 on host 0, which serves the store; ranks 2-3 on host 1) loses host 1
# mid-run, once by its link going down (`ip link set ... down` on its switch
# port: no FIN, no RST, packets just vanish) and once by all its processes
# being SIGKILLed. The survivors on host 0 must exit non-zero within
# BRIGADE_TIMEOUT (10 s) naming a lost rank (2 or 3), and the ranks of a cut
# host must not hang either. Then the job is run again on both hosts with
# --resume from the shared --checkpoint-dir and must finish with the weights
# of the uninterrupted one-host run, bitwise.
NETNS_LIMIT=140
. "$(dirname "$0")/../lib/harness.sh"
netns_init
STEPS=800
ARGS=(--layers 2 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --steps $STEPS --threads 1
      --pp 2 --dp 2 --quiet)
export BRIGADE_TIMEOUT=10
LIMIT_MS=$((BRIGADE_TIMEOUT * 1000))

netns_hosts 2

ref_run "$T/ref" "${ARGS[@]}"

for how in link kill; do
    ck=$T/ck-$how
    job_start "$how" "0 0 1 1" "${ARGS[@]}" --checkpoint-dir "$ck" --checkpoint-every 50 --save "$T/out-$how"
    if ! wait_checkpoint "$ck" 20; then
        fail "$how: no checkpoint within 20 s"
        job_wait
        continue
    fi
    case $how in
    link) link_down 1 ;;
    kill) kill_host 1 ;;
    esac
    t0=$(now_us)
    job_wait
    for r in 0 1; do
        rc=$(cat "$T/$how.rc.$r")
        ms=$((($(cat "$T/$how.end.$r") - t0) / 1000))
        check "$how: survivor rank $r exits non-zero (rc $rc)" [ "$rc" != 0 ]
        if ! check "$how: survivor rank $r exits within BRIGADE_TIMEOUT ($ms ms)" [ "$ms" -le "$LIMIT_MS" ]; then
            echo "--- the last lines rank $r wrote:"; tail -n 15 "$T/$how.log.$r"; echo "---"
        fi
        check "$how: survivor rank $r names a lost rank" grep -qE 'rank [23] ' "$T/$how.log.$r"
        grep -m1 -E 'rank [23] ' "$T/$how.log.$r"
    done
    if [ $how = link ]; then
        for r in 2 3; do
            rc=$(cat "$T/$how.rc.$r")
            ms=$((($(cat "$T/$how.end.$r") - t0) / 1000))
            check "link: cut-off rank $r exits non-zero within BRIGADE_TIMEOUT (rc $rc, $ms ms)" \
                [ "$rc" != 0 -a "$rc" != 137 -a "$ms" -le "$LIMIT_MS" ]
        done
        ip -n "$SW" link set p1 up
    fi
    check "$how: the interrupted run wrote no --save" eval '! compgen -G "$T/out-$how/*.safetensors" >/dev/null'
    job_start "$how-resume" "0 0 1 1" "${ARGS[@]}" --checkpoint-dir "$ck" --checkpoint-every 50 --resume \
        --save "$T/out-$how"
    job_wait
    check "$how: the resumed run finishes" job_ok "$how-resume" 4
    grep -m1 -i 'resum' "$T/$how-resume.log.0"
    check "$how: resumed from a checkpoint, not step 0" grep -qE 'resuming from .*step-0*[1-9]' "$T/$how-resume.log.0"
    check "$how: weights bitwise equal to the uninterrupted run" "$BRIGADE" compare "$T/ref" "$T/out-$how"
done
finish
