"""bench/ep_overlap.py METRICS TRACE SCHEDULE RANKS PAIRED [--pairs]: one row of bench/ep_schedules.sh
from a run's metrics and trace (see there), or with --pairs only "FORMED EXPECTED" (tests/runtime/test_ep.sh):
the pairs the run formed in its last step (all ranks: the second lane's compute instructions) and those the
pairing rule forms on the trace's compute order (the program's in an unpaired run's trace)."""
import collections
import json
import statistics
import sys

COMPUTE_OPS = {"F", "B", "b", "W"}


def rule_pairs(seq):
    """bg_sched_pair_partner over one rank's compute instructions (op, microbatch) in program order: an
    instruction and the next one when exactly one is a forward and their microbatches differ; the pair's
    second is not paired again."""
    out, i = [], 0
    while i + 1 < len(seq):
        (a, ma), (b, mb) = seq[i], seq[i + 1]
        if ma != mb and (a == "F") != (b == "F"):
            out.append(a + "+" + b)
            i += 2
        else:
            i += 1
    return out


def minus(ivs, cuts):
    """the parts of intervals ivs outside every interval of cuts"""
    out = []
    for a, b in ivs:
        parts = [(a, b)]
        for x, y in cuts:
            parts = [p for lo, hi in parts for p in ((lo, min(hi, x)), (max(lo, y), hi)) if p[1] > p[0]]
        out += parts
    return out


def main():
    mpath, tpath, sched, n, paired = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    rows = [json.loads(l) for l in open(mpath) if '"rank"' in l]
    all_steps = sorted({r["step"] for r in rows})
    if not all_steps:
        sys.exit("bench/ep_overlap.py: %s has no per-rank metrics" % mpath)
    steps = all_steps[1:] or all_steps  # the first step warms up
    st, bub = [], []
    for s in steps:
        rs = [r for r in rows if r["step"] == s]
        T = max(r["step_ms"] for r in rs)
        st.append(T), bub.append(1 - sum((1 - r["bubble"]) * r["step_ms"] for r in rs) / (n * T))
    k = st.index(statistics.median_low(st))
    d = json.load(open(tpath))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    # per rank and lane (trace tid 0: lane 0, tid 2: lane 1): its compute instructions and its all-to-alls
    ops, a2as, order = {}, {}, {}
    last = steps[-1]
    formed = 0
    for e in ev:
        if e.get("ph") != "X" or e.get("tid") not in (0, 2):
            continue
        iv = (e["ts"], e["ts"] + e["dur"])
        a = e.get("args", {})
        op = a.get("op")
        if op == "ep_a2a" and a.get("step", 2) in steps:
            a2as.setdefault((e["pid"], e["tid"]), []).append(iv)
        elif op in COMPUTE_OPS:
            ops.setdefault((e["pid"], e["tid"]), []).append(iv)
            if a.get("step") == last:
                order.setdefault(e["pid"], []).append((e["ts"], op, a.get("microbatch")))
                formed += e["tid"] == 2
    kinds = collections.Counter()
    for pid, seq in order.items():
        kinds.update(rule_pairs([(op, mb) for _, op, mb in sorted(seq)]))
    expected = sum(kinds.values())
    if len(sys.argv) > 6 and sys.argv[6] == "--pairs":
        print(formed, expected)
        return
    a2a, hidden = 0.0, 0.0
    for (pid, tid), ivs in a2as.items():
        busy = minus(ops.get((pid, 2 - tid), []), a2as.get((pid, 2 - tid), []))  # the other lane computing
        for a, b in ivs:
            a2a += b - a
            hidden += sum(max(0, min(b, y) - max(a, x)) for x, y in busy)
    per = a2a / 1e3 / n / len(steps)
    # the program's order is the unpaired trace's; a paired trace interleaves the lanes
    kind = " ".join("%s:%d" % kv for kv in sorted(kinds.items())) if paired == "no" else ""
    print("%-10s %6s %9.1f %7.1f%% %13.2f %8.1f%% %8.1f%% %6d  %s" % (
        sched, paired, st[k], 100 * bub[k], per, 100 * per / st[k], 100 * hidden / a2a if a2a else 0,
        formed if paired == "yes" else expected, kind))


main()
