#!/usr/bin/env bash
# tests/schedule/test_torch_csv.sh: torch.distributed.pipelining's CSV
# schedule format (compute_only) both ways. References: a reader and a
# writer in Python written from torch's schedules.py (_Action's regex
# [stage][F|I|B|W|UNSHARD|RESHARD|SEND_F|RECV_F|SEND_B|RECV_B][microbatch],
# csv.writer rows, one per rank, None written as an empty cell): what
# brigade writes parses to each rank's compute order of brigade's own JSON
# program, what torch writes (with idle cells and communication actions)
# reads back to the same program, and a round trip changes no instruction.
. "$(dirname "$0")/../lib/harness.sh"

cat >"$T/torchcsv.py" <<'PY'
import csv, json, re, sys
ACT = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")
KIND = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}  # brigade JSON kinds

def compute_order(path):
    """each rank's compute ops of a brigade JSON program, as torch actions"""
    d = json.load(open(path))
    return [[f"{o['stage']}{KIND[o['kind']]}{o['microbatch']}" for o in r["ops"] if o["kind"] in KIND] for r in d["ranks"]]

def read(path):
    rows = []
    for row in csv.reader(open(path, newline="")):
        acts = []
        for cell in row:
            cell = cell.strip()
            if cell == "":
                continue
            m = ACT.match(cell)
            assert m and m.group(0) == cell, cell
            acts.append(cell)
        rows.append(acts)
    return rows

cmd = sys.argv[1]
if cmd == "check":    # brigade's CSV == the compute order of its JSON program
    got, want = read(sys.argv[2]), compute_order(sys.argv[3])
    assert got == want, (got, want)
elif cmd == "torchify":  # write as torch would: idle steps as empty cells, with its transfers
    order = compute_order(sys.argv[2])
    with open(sys.argv[3], "w", newline="") as f:
        w = csv.writer(f)
        for r, acts in enumerate(order):
            row = [None] * r
            for a in acts:
                row.append(a)
                if "F" in a:
                    st, mb = a.split("F")
                    row.append(f"{st}SEND_F{mb}")
            w.writerow(row)
PY
for sk in "zbv 4 8" "zb-h1 4 8" "interleaved 4 8" "1f1b 3 5" "zb-interleaved 2 6" "dualpipev 2 4" "gpipe 1 3"; do
    set -- $sk
    "$B" schedule --schedule "$1" --stages "$2" --microbatches "$3" --no-text --json "$T/$1.json" \
        --to-torch-csv "$T/$1.csv" >"$T/out" 2>&1 || fail "$1: --to-torch-csv failed: $(cat "$T/out")"
    python3 "$T/torchcsv.py" check "$T/$1.csv" "$T/$1.json" || fail "$1: the CSV is not the JSON program's compute order"
    # torch's file (idle cells, SEND_F actions) reads back to the same program, instruction for instruction
    python3 "$T/torchcsv.py" torchify "$T/$1.json" "$T/$1.torch.csv"
    "$B" schedule --from-torch-csv "$T/$1.torch.csv" --no-text --json "$T/$1.back.json" --to-torch-csv "$T/$1.2.csv" \
        >"$T/out" 2>&1 || fail "$1: --from-torch-csv failed: $(cat "$T/out")"
    python3 -c "
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a['ranks'] == b['ranks'] and a['stage_map'] == b['stage_map'] if 'stage_map' in a else a['ranks'] == b['ranks']
" "$T/$1.json" "$T/$1.back.json" || fail "$1: the program read from torch's CSV differs from the generated one"
    cmp -s "$T/$1.csv" "$T/$1.2.csv" || fail "$1: the CSV round trip changed the order"
    ok "$1 p=$2 m=$3: torch CSV both ways"
done

# what brigade cannot run, one line each
# backwards out of microbatch order run; their weight halves in order
printf '0F0,0F1,0B1,0B0\n1F0,1B0,1F1,1B1\n' >"$T/ooo.csv"
"$B" schedule --from-torch-csv "$T/ooo.csv" --text >"$T/out" 2>&1 && grep -q "^rank 0 | F0 F1 b1 B0 W1$" "$T/out" &&
  ok "a backward out of microbatch order: its input half where listed, its weight half after mb 0's" ||
  fail "out-of-order backward: $(cat "$T/out")"
printf '0F1,0F0,0B0,0B1\n1F0,1B0,1F1,1B1\n' >"$T/fooo.csv"
expect_err_line schedule "runs the forward of stage 0 for microbatch 1 where microbatch 0 is next" --from-torch-csv "$T/fooo.csv"
printf '0F0,0F1,0B1,0B1\n1F0,1B0,1F1,1B1\n' >"$T/twice.csv"
expect_err_line schedule "runs the backward of stage 0 for microbatch 1 twice" --from-torch-csv "$T/twice.csv"
printf '0F0,0X0\n' >"$T/bad.csv"
expect_err_line schedule 'cell 2 "0X0" is not an action' --from-torch-csv "$T/bad.csv"
printf '0F0,1F0,1B0,0B0\n' >"$T/one.csv"
"$B" schedule --from-torch-csv "$T/one.csv" --no-text >"$T/out" 2>&1 || fail "one rank, two stages: $(cat "$T/out")"
printf '0B0,0F0\n1F0,1B0\n' >"$T/dead.csv"
expect_err_line schedule "the order cannot run" --from-torch-csv "$T/dead.csv"
"$B" schedule --schedule dualpipe --stages 2 --microbatches 4 --to-torch-csv "$T/dp.csv" >"$T/out" 2>&1 \
    && fail "dualpipe written as torch CSV"
grep -q "torch's CSV format has one copy" "$T/out" || fail "dualpipe refusal: $(cat "$T/out")"
finish
