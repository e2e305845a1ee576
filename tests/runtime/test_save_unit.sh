#!/usr/bin/env bash
# tests/runtime/test_save_unit.sh: --save replaces its directory as a unit.
# A save that fails on one rank (a full disk, simulated by
# BRIGADE_FAULT_WRITE_BYTES in rank 0 only, while rank 1 writes its stage) leaves the previous save exactly
# as it was (brigade compare and generate read the old one, never stage 0 of
# the new run beside stage 1 of the old), and nothing of the failed save
# stays beside it; a save that succeeds replaces every file; a directory
# holding something else than weights is refused before training.
. "$(dirname "$0")/../lib/harness.sh"
G="--model gpt --layers 4 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --threads 1 --quiet --pp 2"

# run2 STEPS FAULT-BYTES-OF-RANK-0 DIR: a two-rank job saving to DIR (rank 0, the lowest to fail, says why)
run2() {
    timeout -s KILL 120 "$B" launch -n 2 -- bash -c \
        "if [ \$BRIGADE_RANK = 0 ] && [ -n '$2' ]; then export BRIGADE_FAULT_WRITE_BYTES='$2'; fi; \
         exec '$B' train $G --steps $1 --save '$3'" >"$T/err" 2>&1
}

run2 2 "" "$T/w" || { cat "$T/err"; die "the first save failed"; }
cp -r "$T/w" "$T/w.orig"
check "the first save has both stages" [ -f "$T/w/model-stage000.safetensors" -a -f "$T/w/model-stage001.safetensors" ]

# rank 0's disk fills after 1000 bytes of its stage file, rank 1 writes its own: the save fails
run2 4 1000 "$T/w"
rc=$?
check "a save that fails on rank 0 fails the job (exit $rc)" [ "$rc" != 0 ]
check "and says why: $(grep -m1 -o 'No space left on device' "$T/err")" grep -q "No space left on device" "$T/err"
check "the previous save is intact (same files, same bytes)" diff -r "$T/w" "$T/w.orig"
check "nothing of the failed save is left beside it: $(ls "$T")" bash -c "! ls -d '$T'/w.tmp-* 2>/dev/null"
v=$("$B" compare "$T/w" "$T/w.orig" 2>&1)
check "brigade compare reads the old weights whole: $v" bash -c "echo '$v' | grep -q 'bitwise identical' && [ \"\$(echo '$v' | grep -o '[0-9]* tensors compared: [0-9]*' | awk '{print (\$1 == \$4)}')\" = 1 ]"
check "brigade generate reads it" "$B" generate --checkpoint "$T/w" --prompt "In the" --tokens 4

# the same save without the fault replaces both stages
run2 4 "" "$T/w" || { cat "$T/err"; bad "the second save failed"; }
check "a save that succeeds replaces the weights" bash -c "! '$B' compare '$T/w' '$T/w.orig' >/dev/null 2>&1"
check "with the same two files: $(ls "$T/w" | tr '\n' ' ')" \
    [ "$(ls "$T/w" | tr '\n' ' ')" = "model-stage000.safetensors model-stage001.safetensors " ]
check "and no temporary directory" bash -c "! ls -d '$T'/w.tmp-* 2>/dev/null"

# a directory with something of the user's in it is not replaced
mkdir -p "$T/mine" && echo notes >"$T/mine/notes.txt"
"$B" train ${G/--pp 2/} --steps 1 --save "$T/mine" >"$T/out" 2>"$T/err"
rc=$?
check "--save into a directory holding other files fails (exit $rc)" [ "$rc" != 0 ]
check "naming the file: $(head -c 200 "$T/err")" grep -q "notes.txt, which is not a \*.safetensors file" "$T/err"
check "the file is kept" grep -q notes "$T/mine/notes.txt"
finish 13
