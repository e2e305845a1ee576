#!/usr/bin/env bash
# tests/transport/test_transport_bench.sh: `brigade bench p2p` (2 ranks) and
# `brigade bench allreduce` (3 ranks) run under `brigade launch` with small
# sizes, and their JSON rows have the documented fields and sane values.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=30
check "bench p2p on 2 ranks" \
    timeout 120 "$B" launch -n 2 --timeout 100 -- "$B" bench p2p --sizes 0,1,4K,1M --reps 2 --json "$T/p2p.json"
check "bench allreduce on 3 ranks" \
    timeout 120 "$B" launch -n 3 --timeout 100 -- "$B" bench allreduce --sizes 4K,1M --reps 2 --json "$T/ar.json"
python3 - "$T" <<'PY' && ok "the JSON rows have the documented fields and sane values" || bad "JSON rows"
import json, sys
d = sys.argv[1]
p = json.load(open(d + "/p2p.json"))
assert [r["bytes"] for r in p] == [0, 1, 4096, 1048576], p
for r in p:
    assert set(r) == {"bytes", "latency_us", "bandwidth_gbps"}, r
    assert r["latency_us"] > 0 and r["bandwidth_gbps"] >= 0, r
a = json.load(open(d + "/ar.json"))
assert len(a) == 6, a   # 2 sizes x (auto, ring, recursive)
for r in a:
    assert set(r) == {"bytes", "ranks", "algorithm", "algbw_gbps", "busbw_gbps"}, r
    assert r["ranks"] == 3 and r["algbw_gbps"] > 0, r
    assert abs(r["busbw_gbps"] - r["algbw_gbps"] * 4 / 3) < 1e-3 * r["busbw_gbps"] + 1e-4, r
PY
finish
