#!/usr/bin/env bash
# tests/checkpoint/test_resume_safety.sh: resume never strands a job, and
# stops say what they did.
# --resume says where it starts; an invalid newest checkpoint (corrupt,
# partial) is reported in one line and the previous complete one is used,
# or --resume-strict refuses; --resume-from picks one; all invalid: said,
# never silent (strict: fails); an unknown manifest version is refused.
# SIGINT/SIGTERM: the real step count, exit 130/143, no empty --save
# directory. Rank 0 (the store) dying during a save fails rank 1 promptly.
. "$(dirname "$0")/../lib/harness.sh"
D=$(cd "$(dirname "$0")/../.." && pwd)
G="--model gpt --layers 2 --d-model 16 --heads 2 --seq 16 --batch 4 --microbatches 2 --threads 1 --quiet --data $D/data/kjv.txt"
has() { grep -q -- "$2" "$1" && ok "$3" || { bad "$3: no \"$2\" in:"; cat "$1"; }; }
run() { timeout 120 "$B" train $G "$@"; }

# nothing to resume from: said
run --steps 2 --checkpoint-dir "$T/none" --resume >/dev/null 2>"$T/e0" || bad "resume without checkpoints"
has "$T/e0" "no checkpoint in $T/none: starting at step 0" "no checkpoint: says it starts at 0"

# checkpoints of a pp = 2 job at steps 2, 4, 6: the resume line names the layout
timeout 120 "$B" launch -n 2 -- "$B" train $G --pp 2 --steps 6 --checkpoint-every 2 --checkpoint-dir "$T/c" \
    >/dev/null 2>"$T/e1" || { bad "pp 2 run"; cat "$T/e1"; }
run --steps 8 --save "$T/ref8" >/dev/null 2>&1 || bad "reference run"
cp -r "$T/c" "$T/c_pristine"
run --steps 8 --checkpoint-dir "$T/c" --resume --save "$T/r8" >/dev/null 2>"$T/e2" || { bad "resume"; cat "$T/e2"; }
has "$T/e2" "resuming from $T/c/step-00000006 (written by pp=2 dp=1)" "resume names checkpoint and layout"
same "$T/ref8" "$T/r8" "resumed run equals an uninterrupted one"

# the newest corrupted: reported in one line, the previous one used
rm -rf "$T/c"; cp -r "$T/c_pristine" "$T/c"
printf 'garbage' | dd of="$T/c/step-00000006/rank-00001.safetensors" bs=1 seek=300 conv=notrunc 2>/dev/null
run --steps 8 --checkpoint-dir "$T/c" --resume --save "$T/r8b" >"$T/o3" 2>"$T/e3" || { bad "fallback run"; cat "$T/e3"; }
has "$T/e3" "skipped 1 invalid checkpoint newer than $T/c/step-00000004; the newest: .*rank-00001.safetensors is corrupted" "corrupt newest reported, naming the file"
has "$T/e3" "resuming from $T/c/step-00000004" "falls back to the previous complete checkpoint"
[ "$(grep -c 'invalid' "$T/e3")" = 1 ] && ok "one line about it" || { bad "lines:"; cat "$T/e3"; }
same "$T/ref8" "$T/r8b" "fallback run equals an uninterrupted one"
# ... --resume-strict refuses
rm -rf "$T/c"; cp -r "$T/c_pristine" "$T/c"
printf 'garbage' | dd of="$T/c/step-00000006/rank-00001.safetensors" bs=1 seek=300 conv=notrunc 2>/dev/null
if run --steps 8 --checkpoint-dir "$T/c" --resume --resume-strict >/dev/null 2>"$T/e4"; then bad "strict accepted a corrupt newest"
else has "$T/e4" "newest checkpoint is invalid.*rank-00001.safetensors is corrupted" "--resume-strict refuses, naming the file"; fi
[ -d "$T/c/step-00000006" ] && ok "the invalid checkpoint is left for a human" || bad "invalid checkpoint removed"

# partial newest: a rank file missing, a manifest missing
rm -rf "$T/c"; cp -r "$T/c_pristine" "$T/c"
rm "$T/c/step-00000006/rank-00000.safetensors" "$T/c/step-00000004/manifest.json"
run --steps 8 --checkpoint-dir "$T/c" --resume >/dev/null 2>"$T/e5" || { bad "partial run"; cat "$T/e5"; }
has "$T/e5" "skipped 2 invalid checkpoints newer than $T/c/step-00000002" "partial checkpoints skipped"
has "$T/e5" "resuming from $T/c/step-00000002" "resumes from the newest complete one"

# every checkpoint invalid: said (exit 0, from step 0); strict: fails
rm -rf "$T/c"; cp -r "$T/c_pristine" "$T/c"
for s in 2 4 6; do rm "$T/c/step-0000000$s/rank-00001.safetensors"; done
run --steps 3 --checkpoint-dir "$T/c" --resume >"$T/o6" 2>"$T/e6" || { bad "all invalid: run failed"; cat "$T/e6"; }
has "$T/e6" "warning: no valid checkpoint in $T/c (3 invalid; the newest: .*step-00000006.*): starting at step 0" "all invalid: said"
has "$T/o6" "3 steps" "all invalid: trained from step 0"
rm -rf "$T/c"; cp -r "$T/c_pristine" "$T/c"
for s in 2 4 6; do rm "$T/c/step-0000000$s/rank-00001.safetensors"; done
if run --steps 3 --checkpoint-dir "$T/c" --resume --resume-strict >/dev/null 2>"$T/e7"; then bad "strict: all invalid accepted"
else has "$T/e7" "invalid" "--resume-strict with every checkpoint invalid fails"; fi
# ... and with no checkpoint at all (a missing or an empty directory), as its help says
for d in "$T/missing" "$T/empty"; do
  [ "$d" = "$T/empty" ] && mkdir -p "$d"
  if run --steps 3 --checkpoint-dir "$d" --resume --resume-strict >"$T/o7b" 2>"$T/e7b"; then
    bad "strict: no checkpoint in $d accepted (trained from step 0)"
  else has "$T/e7b" "--resume-strict: no valid checkpoint in $d (no step-N directory)" "--resume-strict with $(basename "$d") fails"; fi
done

# --resume-from picks one (and must be valid)
rm -rf "$T/c"; cp -r "$T/c_pristine" "$T/c"
run --steps 8 --resume-from "$T/c/step-00000004" --save "$T/r8c" >/dev/null 2>"$T/e8" || { bad "--resume-from"; cat "$T/e8"; }
has "$T/e8" "resuming from $T/c/step-00000004 (written by pp=2 dp=1)" "--resume-from names its checkpoint"
same "$T/ref8" "$T/r8c" "--resume-from step 4 equals an uninterrupted run"
rm "$T/c/step-00000004/rank-00000.safetensors"
if run --steps 8 --resume-from "$T/c/step-00000004" >/dev/null 2>"$T/e9"; then bad "--resume-from an invalid checkpoint accepted"
else has "$T/e9" "cannot resume from $T/c/step-00000004: .*rank-00000.safetensors" "--resume-from an invalid one fails, naming the file"; fi

# a manifest of another format version (its checksum intact) is refused, not skipped
rm -rf "$T/c"; cp -r "$T/c_pristine" "$T/c"
# rewrite_manifest FILE KEY VALUE: set KEY to the JSON VALUE in a manifest, its checksum recomputed
rewrite_manifest() {
python3 - "$@" <<'PY' || bad "could not rewrite the manifest's $2"
import json, sys
def crc32c(b):
    c = 0xffffffff
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82f63b78 & -(c & 1))
    return c ^ 0xffffffff
p = sys.argv[1]; m = json.load(open(p))
dump = lambda m: json.dumps(m, indent=1, sort_keys=True, ensure_ascii=False).encode()
want = m.pop("manifest_crc32c")
if crc32c(dump(m)) != want:
    sys.exit("this script's manifest text differs from brigade's; cannot recompute the checksum")
m[sys.argv[2]] = json.loads(sys.argv[3])
m["manifest_crc32c"] = crc32c(dump(m))
open(p, "w").write(json.dumps(m, indent=1, sort_keys=True))
PY
}
rewrite_manifest "$T/c/step-00000006/manifest.json" version 7
if run --steps 8 --checkpoint-dir "$T/c" --resume >/dev/null 2>"$T/e10"; then bad "version 7 accepted"; cat "$T/e10"
else has "$T/e10" "checkpoint format version 7 .*is not supported: this brigade .* reads version 1" "unknown version refused"; fi
# an optimizer-state count that is none of 0, 1, 2 (its checksum intact) is refused, naming it
rm -rf "$T/c"; cp -r "$T/c_pristine" "$T/c"
rewrite_manifest "$T/c/step-00000006/manifest.json" optim 9
if run --steps 8 --resume-from "$T/c/step-00000006" >/dev/null 2>"$T/e10b"; then bad "optim 9 accepted"; cat "$T/e10b"
else has "$T/e10b" "manifest.json: optim is 9; expected 0 (no optimizer state), 1 (SGD's momentum) or 2" "optim 9 refused"; fi

# stops: SIGINT without --checkpoint-dir
# (not under timeout(1): a background job's SIGINT would be ignored by it; a watchdog instead)
"$B" train $G --steps 1000000 --save "$T/s1" >"$T/o11" 2>"$T/e11" &
p=$!
( for i in $(seq 600); do sleep 0.1; kill -0 $p 2>/dev/null || exit 0; done; kill -KILL $p ) >/dev/null 2>&1 &
# signalled once its handler is installed and it has run a while (a signal before the handler kills it)
wait_caught 2 60 $p || bad "SIGINT: no handler installed within 60 s"
sleep 1; kill -INT $p; wait $p; rc=$?
[ "$rc" = 130 ] && ok "SIGINT: exit 130" || bad "SIGINT: exit $rc"
n=$(sed -n 's/^interrupted at step \([0-9]*\), nothing saved$/\1/p' "$T/e11")
[ -n "$n" ] && ok "SIGINT: interrupted at step $n, nothing saved" || { bad "SIGINT message"; cat "$T/e11"; }
grep -q "trained gpt: .* $n steps (steps 0 -> $n of 1000000, stopped)" "$T/o11" && ok "summary: the real step count" || { bad "summary"; cat "$T/o11"; }
[ ! -e "$T/s1" ] && ok "no --save directory left behind" || bad "--save directory $(ls -la "$T/s1")"
# SIGTERM with --checkpoint-dir under the launcher: 143, checkpoint of the step reached
timeout 120 "$B" launch -n 2 -- "$B" train $G --pp 2 --steps 1000000 --checkpoint-dir "$T/c12" >"$T/o12" 2>"$T/e12" &
p=$!
# the launcher (timeout(1)'s child; it takes signals from its start) once both its ranks catch SIGTERM
for i in $(seq 600); do l=$(pgrep -P $p); [ -n "$l" ] && [ "$(pgrep -P "$l" | wc -l)" = 2 ] && break; sleep 0.1; done
wait_caught 15 60 $(pgrep -P "$l") || bad "SIGTERM: a rank has no handler within 60 s"
sleep 2; kill -TERM $l # the launcher itself (timeout(1) would signal its group too)
wait $p; rc=$?
[ "$rc" = 143 ] && ok "SIGTERM (launcher): exit 143" || { bad "SIGTERM: exit $rc"; cat "$T/e12"; }
k=$(ls "$T/c12" 2>/dev/null | grep '^step-' | sed 's/step-0*//' | sort -n | tail -1)
[ -n "$k" ] && grep -q "stopped after step $k on request" "$T/e12" && grep -q "$k steps (steps 0 -> $k of 1000000, stopped)" "$T/o12" \
  && ok "SIGTERM: checkpoint and summary of step $k" || { bad "SIGTERM: step $k"; cat "$T/o12" "$T/e12"; }

# rank 0 (the store) dies during a save: rank 1 fails at once, naming it (ranks started by hand: no launcher to stop them)
export BRIGADE_WORLD_SIZE=2 BRIGADE_MASTER_ADDR=127.0.0.1 BRIGADE_MASTER_PORT=$((20000 + RANDOM % 20000)) BRIGADE_JOB_TOKEN=t$RANDOM
A="--pp 2 --layers 4 --d-model 256 --heads 4 --seq 32 --batch 4 --microbatches 2 --steps 1000 --threads 1 --quiet --data $D/data/kjv.txt --checkpoint-dir $T/c13 --checkpoint-every 1"
BRIGADE_RANK=0 BRIGADE_LOCAL_RANK=0 timeout 120 "$B" train $A >/dev/null 2>&1 &
r0=$!
BRIGADE_RANK=1 BRIGADE_LOCAL_RANK=1 timeout 120 "$B" train $A >/dev/null 2>"$T/e13" &
r1=$!
# wait for a save in progress (the job may take a while to start on a loaded machine)
for i in $(seq 1 6000); do ls "$T/c13" 2>/dev/null | grep -q '\.tmp-' && break; sleep 0.01; done
ls "$T/c13" 2>/dev/null | grep -q '\.tmp-' || bad "no save started within 60 s (rank 0 did not start?)"
kill -9 $(pgrep -P $r0) $r0 2>/dev/null
t0=$(date +%s%N); wait $r1; rc=$?; t1=$(date +%s%N)
wait $r0 2>/dev/null
ms=$(( (t1 - t0) / 1000000 ))
[ "$rc" != 0 ] && [ "$ms" -lt 10000 ] && ok "rank 0 died during a save: rank 1 exited $rc after $ms ms" \
  || bad "rank 1 exited $rc after $ms ms"
has "$T/e13" "rank 0 died" "rank 1 names rank 0"
unset BRIGADE_WORLD_SIZE BRIGADE_MASTER_ADDR BRIGADE_MASTER_PORT BRIGADE_JOB_TOKEN
finish
