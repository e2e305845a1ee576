#!/usr/bin/env bash
# bench/compare_transport.sh: brigade's transport next to its references, in
# the same run, on the same machine:
#   p2p:       `brigade bench p2p` (2 ranks)  vs  ucx_perftest tag_lat / tag_bw
#   allreduce: `brigade bench allreduce`      vs  Open MPI's MPI_Allreduce
#              (bench/mpi_allreduce, with Open MPI's default pml and with pml ucx)
# Each side runs RUNS times, interleaved; the tables show medians and ratios.
#
# usage: bench/compare_transport.sh [BUILD_DIR]
#   env: RUNS (3), P2P_SIZES (bytes, comma list), AR_SIZES, RANKS ("2 4"), OUT (a folder for the raw JSON),
#        PIN (0: nothing bound, mpirun --bind-to none; 1: every side's rank r on CPU r, mpirun --bind-to core)
# Units: GB/s = 1e9 bytes/s everywhere (ucx_perftest's MB/s are MiB/s and are converted).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$here/../build}
BRIGADE=$BUILD/brigade
MPIBENCH=$BUILD/bench/mpi_allreduce
RUNS=${RUNS:-3}
P2P_SIZES=${P2P_SIZES:-8,4096,65536,1048576,4194304,16777216,67108864}
AR_SIZES=${AR_SIZES:-65536,1048576,4194304,16777216,67108864}
RANKS=${RANKS:-2 4}
OUT=${OUT:-$(mktemp -d /tmp/bg_compare.XXXXXX)}
mkdir -p "$OUT"

[ -x "$BRIGADE" ] || { echo "compare_transport: $BRIGADE not found (build brigade_cli first)" >&2; exit 2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

NCPU=$(nproc)
PIN=${PIN:-0}
# Placement is the same on both sides: PIN=0 binds nothing (mpirun --bind-to none),
# PIN=1 puts rank r on CPU r everywhere (taskset; mpirun --bind-to core) when the
# ranks fit on the CPUs. On a shared machine PIN=1 can hurt whichever side lands
# on a CPU another job is using; compare ratios from one run, not absolute figures.
pin() { # pin N CMD...
  local n=$1; shift
  if [ "$PIN" = 1 ] && (( n <= NCPU )); then
    printf '%s\n' "sh" "-c" 'exec taskset -c "$BRIGADE_RANK" "$0" "$@"' "$@"
  else
    printf '%s\n' "$@"
  fi
}

# launch N CMD...: brigade launch when it exists, else the bootstrap variables by hand
launch() {
  local n=$1; shift
  local cmd; mapfile -t cmd < <(pin "$n" "$@"); set -- "${cmd[@]}"
  if "$BRIGADE" launch --help >/dev/null 2>&1; then
    "$BRIGADE" launch -n "$n" --timeout 900 -- "$@"
  else
    local port tok pids=() rc=0
    port=$(free_port); tok=$RANDOM$RANDOM
    for ((r = 0; r < n; r++)); do
      BRIGADE_RANK=$r BRIGADE_LOCAL_RANK=$r BRIGADE_WORLD_SIZE=$n BRIGADE_MASTER_ADDR=127.0.0.1 \
        BRIGADE_MASTER_PORT=$port BRIGADE_JOB_TOKEN=$tok timeout 900 "$@" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    return $rc
  fi
}

# perftest TEST SIZE ITERS -> the "Final:" line's fields
perftest() {
  local port; port=$(free_port)
  local c0="" c1=""
  if [ "$PIN" = 1 ] && (( NCPU >= 2 )); then c0="taskset -c 0"; c1="taskset -c 1"; fi
  $c0 ucx_perftest -p "$port" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  local line
  line=$(timeout 300 $c1 ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s "$2" -n "$3" -w $(( $3 / 10 + 1 )) 2>/dev/null | grep Final || true)
  wait "$srv" 2>/dev/null || true
  echo "$line"
}

have_perftest=0; command -v ucx_perftest >/dev/null && have_perftest=1
have_mpi=0; [ -x "$MPIBENCH" ] && command -v mpirun >/dev/null && have_mpi=1
mpirun_for() { # mpirun_for R: the mpirun command line with the same placement as pin()
  if [ "$PIN" = 1 ] && (( $1 <= NCPU )); then
    echo "mpirun --allow-run-as-root --oversubscribe --bind-to core"
  else
    echo "mpirun --allow-run-as-root --oversubscribe --bind-to none"
  fi
}

echo "== p2p: $RUNS runs, sizes $P2P_SIZES (raw data in $OUT)"
for ((run = 1; run <= RUNS; run++)); do
  launch 2 "$BRIGADE" bench p2p --sizes "$P2P_SIZES" --reps 3 --json "$OUT/p2p_brigade_$run.json" >/dev/null
  if [ $have_perftest = 1 ]; then
    : > "$OUT/p2p_perftest_$run.txt"
    IFS=, read -ra sz <<< "$P2P_SIZES"
    for s in "${sz[@]}"; do
      n=$(( (1 << 30) / (s + 1) )); (( n > 100000 )) && n=100000; (( n < 20 )) && n=20
      nl=$(( n > 20000 ? 20000 : n ))
      lat=$(perftest tag_lat "$s" "$nl"); bw=$(perftest tag_bw "$s" "$n")
      echo "$s|$lat|$bw" >> "$OUT/p2p_perftest_$run.txt"
    done
  fi
done

if [ $have_mpi = 1 ]; then
  echo "== allreduce: $RUNS runs, ranks $RANKS, sizes $AR_SIZES"
  for R in $RANKS; do
    MPIRUN=$(mpirun_for "$R")
    for ((run = 1; run <= RUNS; run++)); do
      launch "$R" "$BRIGADE" bench allreduce --sizes "$AR_SIZES" --algo auto --reps 3 \
        --json "$OUT/ar_brigade_${R}_$run.json" >/dev/null
      $MPIRUN -np "$R" "$MPIBENCH" --sizes "$AR_SIZES" --reps 3 --json "$OUT/ar_mpi_${R}_$run.json" >/dev/null 2>&1 || true
      $MPIRUN -np "$R" --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any "$MPIBENCH" \
        --sizes "$AR_SIZES" --reps 3 --json "$OUT/ar_mpiucx_${R}_$run.json" >/dev/null 2>&1 || true
    done
  done
else
  echo "== allreduce: skipped (bench/mpi_allreduce not built or mpirun missing)"
fi

python3 - "$OUT" "$RUNS" <<'EOF'
import glob, json, os, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def load(pattern):
    rows = []
    for f in sorted(glob.glob(os.path.join(out, pattern))):
        try:
            rows += json.load(open(f))
        except Exception:
            pass
    return rows
med = lambda v: statistics.median(v) if v else float('nan')
# p2p
b = load("p2p_brigade_*.json")
pt = {}
for f in glob.glob(os.path.join(out, "p2p_perftest_*.txt")):
    for line in open(f):
        s, lat, bw = line.rstrip("\n").split("|")
        lf, bf = lat.split(), bw.split()
        d = pt.setdefault(int(s), {"lat": [], "bw": []})
        if len(lf) >= 5: d["lat"].append(float(lf[2]))                   # typical latency, us
        if len(bf) >= 6: d["bw"].append(float(bf[5]) * 1048576 / 1e9)     # overall MiB/s -> GB/s
print("\np2p (2 ranks; medians of %d runs)" % runs)
print("%10s %12s %12s %8s %12s %12s %8s" % ("bytes", "lat_us", "perftest", "ratio", "bw_GB/s", "perftest", "ratio"))
for s in sorted({r["bytes"] for r in b}):
    lat = med([r["latency_us"] for r in b if r["bytes"] == s]); bw = med([r["bandwidth_gbps"] for r in b if r["bytes"] == s])
    pl = med(pt.get(s, {}).get("lat", [])); pb = med(pt.get(s, {}).get("bw", []))
    print("%10d %12.2f %12.2f %8.2f %12.3f %12.3f %7.0f%%" % (s, lat, pl, lat / pl if pl == pl else float('nan'), bw, pb, 100 * bw / pb if pb == pb and pb else float('nan')))
# allreduce
rows = {}
for kind in ("brigade", "mpi", "mpiucx"):
    for r in load("ar_%s_*.json" % kind):
        rows.setdefault((r["ranks"], r["bytes"]), {}).setdefault(kind, []).append(r["busbw_gbps"])
if rows:
    print("\nallreduce bus bandwidth, GB/s (medians of %d runs); ratio = brigade / MPI" % runs)
    print("%6s %10s %10s %10s %8s %10s %8s" % ("ranks", "bytes", "brigade", "mpi(ob1)", "ratio", "mpi(ucx)", "ratio"))
    for (R, s) in sorted(rows):
        d = rows[(R, s)]
        bb, m1, m2 = med(d.get("brigade", [])), med(d.get("mpi", [])), med(d.get("mpiucx", []))
        print("%6d %10d %10.3f %10.3f %7.0f%% %10.3f %7.0f%%" % (R, s, bb, m1, 100 * bb / m1 if m1 == m1 and m1 else float('nan'), m2, 100 * bb / m2 if m2 == m2 and m2 else float('nan')))
EOF
