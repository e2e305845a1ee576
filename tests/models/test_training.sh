#!/usr/bin/env bash
# tests/models/test_training.sh: the training run's inputs. Token files made
# from the bundled corpus by scripts/text_to_tokens.py: llm.c, raw16 and raw32
# give the same weights; shards as a comma list and as a glob; a resumed run
# (3 + 3 steps) gives the weights of 6 steps bitwise, also under pp = 2; bad
# files fail naming the file. Learning-rate schedules: the metrics' "lr" of
# every step is the closed form computed here.
. "$(dirname "$0")/../lib/harness.sh"

CONV="$SRC/scripts/text_to_tokens.py"
KJV="$SRC/data/kjv.txt"
GPT="--model gpt --layers 3 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --threads 1"
python3 "$CONV" "$KJV" "$T/kjv.bin" >/dev/null || die "text_to_tokens.py llmc"
python3 "$CONV" --format raw16 "$KJV" "$T/kjv16.bin" >/dev/null || die "text_to_tokens.py raw16"
python3 "$CONV" --format raw32 "$KJV" "$T/kjv32.raw" >/dev/null || die "text_to_tokens.py raw32"
python3 - "$T/kjv.bin" "$KJV" <<'PY' || bad "llm.c header and tokens as written"
import struct, sys
b = open(sys.argv[1], "rb").read(); text = open(sys.argv[2], "rb").read()
h = struct.unpack("<256i", b[:1024])
assert h[:3] == (20240520, 1, len(text)) and not any(h[3:]), h[:4]
assert b[1024:1024 + 8] == b"".join(struct.pack("<H", c) for c in text[:4])
PY

# formats: the same tokens, the same weights
train_save llmc 1 $GPT --steps 6 --data "$T/kjv.bin"
train_save raw16 1 $GPT --steps 6 --data "$T/kjv16.bin" --data-format raw16
train_save raw32 1 $GPT --steps 6 --data "$T/kjv32.raw" --data-format raw32
same "$T/llmc" "$T/raw16" "llmc = raw16"
same "$T/llmc" "$T/raw32" "llmc = raw32"
# the token path is not the text path (shuffled windows, not random starts)
train_save text 1 $GPT --steps 6 --data "$KJV"
if "$B" compare "$T/llmc" "$T/text" >/dev/null; then bad "token files sampled like the text corpus"; else ok "token windows differ from the text path's starts"; fi

# resume: 3 + 3 steps = 6 steps, bitwise (one process and pp 2)
for n in 1 2; do
  extra=""; [ $n = 2 ] && extra="--pp 2"
  train_save "r$n-a" $n $GPT $extra --steps 3 --data "$T/kjv.bin" --checkpoint-dir "$T/ck$n"
  train_save "r$n-b" $n $GPT $extra --steps 6 --data "$T/kjv.bin" --checkpoint-dir "$T/ck$n" --resume
  grep -q "resuming from .*step-00000003" "$T/r$n-b.log" || bad "n=$n: did not resume: $(cat "$T/r$n-b.log")"
  [ $n = 1 ] && same "$T/llmc" "$T/r1-b" "resumed 3 + 3 = 6 steps"
  [ $n = 2 ] && same "$T/llmc" "$T/r2-b" "pp 2 resumed 3 + 3 = 6 steps of one process"
done

# the data position (sequences taken) is the manifest's data_position; a resume with another batch
# continues from it: 3 steps of 8, then 2 of 4 -> 32
man() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["data_position"])' "$1"; }
[ "$(man "$T/ck1/step-00000003/manifest.json")" = 24 ] && ok "manifest data_position 24 after 3 steps of 8" \
  || bad "data_position: $(man "$T/ck1/step-00000003/manifest.json")"
train_save r1-c 1 $GPT --steps 8 --batch 4 --microbatches 2 --data "$T/kjv.bin" --checkpoint-dir "$T/ck1" --resume-from "$T/ck1/step-00000006"
[ "$(man "$T/ck1/step-00000008/manifest.json")" = 56 ] && ok "resumed with batch 4: data_position 48 + 2 x 4" \
  || bad "data_position after a batch change: $(man "$T/ck1/step-00000008/manifest.json")"

# shards: a comma list and a glob of the same two files give the same weights
python3 - "$T/kjv16.bin" "$T/sh" <<'PY'
import sys
b = open(sys.argv[1], "rb").read(); h = len(b) // 4 * 2
open(sys.argv[2] + "-0.bin", "wb").write(b[:h]); open(sys.argv[2] + "-1.bin", "wb").write(b[h:])
PY
train_save comma 1 $GPT --steps 4 --data "$T/sh-0.bin,$T/sh-1.bin" --data-format raw16
train_save glob 1 $GPT --steps 4 --data "$T/sh-*.bin"
same "$T/comma" "$T/glob" "shards: comma list = glob"

# bad input: a clear error naming the file, exit 1
printf 'abc' >"$T/odd.bin"
: >"$T/empty.bin"
head -c 600 "$T/kjv.bin" >"$T/trunc.bin"
head -c $((1024 + 1000)) "$T/kjv.bin" >"$T/short.bin"
python3 - "$T" <<'PY'
import struct, sys
d = sys.argv[1]
open(d + "/magic.bin", "wb").write(struct.pack("<256i", *([12345, 1, 4] + [0] * 253)) + b"\0" * 8)
open(d + "/v2.bin", "wb").write(struct.pack("<256i", *([20240520, 2, 4] + [0] * 253)) + b"\0" * 8)
open(d + "/big.bin", "wb").write(struct.pack("<40H", *([65] * 37 + [300] + [65] * 2)))
PY
S="$GPT --steps 1"
expect_train 1 "odd.bin: 3 bytes is not a whole number of 2-byte tokens" $S --data "$T/odd.bin" --data-format raw16
expect_train 1 "empty.bin is empty" $S --data "$T/empty.bin" --data-format raw16
expect_train 1 "trunc.bin: 600 bytes, shorter than llm.c's header" $S --data "$T/trunc.bin" --data-format llmc
expect_train 1 "short.bin: the header (offset 8) says 1139033 tokens" $S --data "$T/short.bin"
expect_train 1 "magic.bin: magic 12345 at offset 0" $S --data "$T/magic.bin" --data-format llmc
expect_train 1 "v2.bin: llm.c version 2 at offset 4" $S --data "$T/v2.bin"
expect_train 1 "big.bin: token 300 at byte offset 74 (token 37) is >= --vocab 256" $S --data "$T/big.bin"
expect_train 1 "cannot open token file $T/nope.bin" $S --data "$T/kjv16.bin,$T/nope.bin"
expect_train 1 "no token file matches $T/none-*.bin" $S --data "$T/none-*.bin"
expect_train 2 "--data-format" $S --data "$T/kjv.bin" --data-format raw8

# learning-rate schedules: every step's rate in the metrics is the closed form
lr_case() { # KIND WARMUP DECAY MINLR WSD
  "$B" train $GPT --steps 12 --data "$T/kjv.bin" --lr 2e-3 --lr-schedule "$1" --warmup "$2" --decay-steps "$3" \
    --min-lr "$4" --wsd-decay "$5" --quiet --metrics "$T/lr.jsonl" >/dev/null 2>"$T/lr.err" || { bad "lr $*: $(cat "$T/lr.err")"; return; }
  if msg=$(python3 - "$T/lr.jsonl" "$@" 2>&1 <<'PY'
import json, math, struct, sys
path, kind, W, D, m, f = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
P = f32(2e-3)  # --lr is a float (bg_optim_config_t.lr); the schedule computes in double from it
def closed(s):
    if s < W: return P * (s + 1) / W
    q = min(1.0, (s - W) / (D - W))
    if kind == "constant": return P
    if kind == "cosine": return m + (P - m) * (1 + math.cos(math.pi * q)) / 2
    if kind == "linear": return P - (P - m) * q
    L = max(1, min(D - W, math.ceil(f * (D - W) - 1e-9))); E = D - L
    return P if s < E else P - (P - m) * min(1.0, (s - E + 1) / L)
rows = [json.loads(l) for l in open(path)][1:]
assert len(rows) == 12, len(rows)
for r in rows:
    s = r["step"] - 1
    # the step ran at the float of the closed form (metrics: 9 digits; a float ulp is 6e-8 relative)
    assert abs(r["lr"] - f32(closed(s))) <= 1e-8 * f32(closed(s)), (s, r["lr"], f32(closed(s)))
PY
  ); then ok "lr $*: every step's rate is the closed form"; else bad "lr $*: $msg"; fi
}
lr_case cosine 3 12 1e-4 0.2
lr_case linear 0 10 0 0.2
lr_case wsd 2 12 2e-4 0.3
lr_case constant 4 0 0 0.2
expect_train 2 "--decay-steps 3 must be greater than --warmup 3" $GPT --steps 3 --lr-schedule cosine --warmup 3

# run config file: flags from JSON, the command line overriding them; the effective flags written to
# the metrics header and CHECKPOINT_DIR/config.json repeat the run (same weights)
cat >"$T/run.json" <<JSON
{"model": "gpt", "layers": 3, "d-model": 16, "heads": 2, "seq": 16, "batch": 8, "microbatches": 4, "threads": 1,
 "steps": 9, "data": "$T/kjv.bin", "lr": 0.003, "lr-schedule": "cosine", "warmup": 2, "clip-grad": 0.5,
 "split": [6], "quiet": true, "recompute": false}
JSON
"$B" train --config "$T/run.json" --steps 4 --checkpoint-dir "$T/cfgck" --metrics "$T/cfg.jsonl" --save "$T/cfgA" \
  >"$T/cfgA.log" 2>&1 || bad "train --config: $(cat "$T/cfgA.log")"
train_save cfgflags 1 $GPT --steps 4 --data "$T/kjv.bin" --lr 0.003 --lr-schedule cosine --warmup 2 --clip-grad 0.5
same "$T/cfgflags" "$T/cfgA" "--config run.json --steps 4 = the same flags on the command line"
python3 - "$T/cfg.jsonl" "$T/cfgck/config.json" "$T/fromhdr.json" <<'PY' && ok "metrics header and config.json hold the effective flags" || bad "effective config"
import json, sys
hdr = json.loads(open(sys.argv[1]).readline())["config"]
ck = json.load(open(sys.argv[2]))
assert hdr == ck, (hdr, ck)
assert ck["steps"] == "4" and ck["lr"] == "0.003" and ck["clip-grad"] == "0.5" and ck["quiet"] is True, ck
assert "recompute" not in ck and "config" not in ck, ck
json.dump(hdr, open(sys.argv[3], "w"))
PY
for src in "$T/cfgck/config.json" "$T/fromhdr.json"; do
  "$B" train --config "$src" --checkpoint-dir "$T/cfgck2" --metrics "$T/cfg2.jsonl" --save "$T/cfgB" >"$T/cfgB.log" 2>&1 \
    || bad "train --config $src: $(cat "$T/cfgB.log")"
  same "$T/cfgA" "$T/cfgB" "a run from $(basename "$src") repeats the run"
done
echo '{"stepz": 3}' >"$T/badkey.json"
expect_train 2 '"stepz" is not a flag of brigade train' --config "$T/badkey.json"
echo '{"steps": 3' >"$T/badjson.json"
expect_train 1 "badjson.json: line" --config "$T/badjson.json"
echo '{"quiet": "yes"}' >"$T/badbool.json"
expect_train 2 '"quiet" takes true or false' --config "$T/badbool.json"
echo '{"steps": "many"}' >"$T/badval.json"
expect_train 2 '--steps expects an integer, got "many"' --config "$T/badval.json"

# Llama reads token files too (not as text), and --val-data takes a held-out token file: the demo's path
python3 "$CONV" --val-fraction 0.05 "$KJV" "$T/tr.bin" "$T/va.bin" >/dev/null || bad "text_to_tokens.py --val-fraction"
LL="--model llama --layers 2 --d-model 16 --heads 2 --kv-heads 1 --seq 16 --batch 8 --microbatches 4 --threads 1"
train_save ll-tok 1 $LL --steps 4 --data "$T/tr.bin" --val-data "$T/va.bin" --eval-every 2 --metrics "$T/ll.jsonl"
train_save ll-tok2 1 $LL --steps 4 --data "$T/tr.bin" --data-format llmc
same "$T/ll-tok" "$T/ll-tok2" "Llama on token files (auto = llmc), evaluation changing nothing"
train_save ll-txt 1 $LL --steps 4 --data "$KJV"
if "$B" compare "$T/ll-tok" "$T/ll-txt" >/dev/null; then bad "Llama read the token file as text"; else ok "Llama's token path is not the text path"; fi
python3 - "$T/ll.jsonl" <<'PY' && ok "held-out token file evaluated at steps 2 and 4" || bad "val_loss: $(cat "$T/ll.jsonl")"
import json, sys
v = [json.loads(l) for l in open(sys.argv[1]) if '"val_loss"' in l]
assert [r["step"] for r in v] == [2, 4] and all(0 < r["val_loss"] < 6 for r in v), v
PY

finish 34
