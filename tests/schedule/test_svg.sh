#!/usr/bin/env bash
# tests/schedule/test_svg.sh: the pictures parse as SVG (xml.etree,
# tests/lib/svgcheck.py) and carry a title, an axis with units and ticks, and
# a legend of only what they draw: schedule timelines of every generator and
# `brigade plot` with its header title, smoothing and time axis.
. "$(dirname "$0")/../lib/harness.sh"
C="python3 $(dirname "$0")/../lib/svgcheck.py"
sched() { # NAME CHECKS...
  local k=$1; shift
  if "$B" schedule --schedule "$k" --stages 4 --microbatches 8 --svg "$T/$k.svg" >/dev/null 2>"$T/e" \
     && $C "$T/$k.svg" --title "$k: p=4 m=8" --unit "unit costs" --legend "forward (F)" idle "$@"; then ok "$k timeline"
  else bad "$k timeline"; cat "$T/e"; fi
}
sched gpipe --legend "full backward (B)" --not-legend "backward-input (b)" "backward-weight (W)" "chunk 1 (hatched)" "optimizer step (O)"
sched 1f1b --legend "full backward (B)" --not-legend "backward-input (b)" "chunk 1 (hatched)"
sched interleaved --legend "full backward (B)" "chunk 0 (plain)" "chunk 1 (hatched)" --not-legend "backward-weight (W)"
sched zb-h1 --legend "backward-input (b)" "backward-weight (W)" --not-legend "full backward (B)" "chunk 1 (hatched)"
sched zb-h2 --legend "backward-input (b)" "backward-weight (W)" --not-legend "full backward (B)"
sched zbv --legend "backward-input (b)" "backward-weight (W)" "chunk 1 (hatched)" --not-legend "full backward (B)"
# ticks: 0 and the step's end are labelled
python3 - "$T/1f1b.svg" <<'PY' && ok "1f1b ticks 0..33" || bad "ticks"
import sys, xml.etree.ElementTree as ET
t = [e.text for e in ET.parse(sys.argv[1]).iter("{http://www.w3.org/2000/svg}text") if e.get("class") == "tick"]
assert t[0] == "0" and "30" in t and len(t) >= 5, t
PY

# plot: the title names the run from the header line brigade train writes
cat >"$T/m.jsonl" <<'J'
{"run": {"model": "gpt", "layers": 4, "d_model": 128, "pp": 2, "dp": 2, "schedule": "zb-h1"}}
{"rank": 0, "step": 1, "loss": 5.5, "tokens_per_s": 1000, "step_ms": 100}
{"rank": 0, "step": 2, "loss": 5.0, "tokens_per_s": 1100, "step_ms": 90}
{"rank": 0, "step": 3, "loss": 4.8, "tokens_per_s": 1100, "step_ms": 90}
{"rank": 0, "step": 4, "loss": 4.1, "tokens_per_s": 1200, "step_ms": 80}
{"rank": 0, "step": 5, "loss": 3.9, "tokens_per_s": 1200, "step_ms": 80}
J
if "$B" plot "$T/m.jsonl" --out "$T/p.svg" >/dev/null 2>"$T/e" \
   && $C "$T/p.svg" --title "gpt 4 x 128, pp 2 x dp 2, zb-h1" --axis-label step loss tokens/s "training time (s)" \
        --not-legend "loss, mean of the last 3 steps (raw: faint)"; then ok "plot title and axes"; else bad "plot"; cat "$T/e"; fi
if "$B" plot "$T/m.jsonl" --out "$T/s.svg" --smooth 3 --x time --title mine >/dev/null 2>"$T/e" \
   && $C "$T/s.svg" --title mine --axis-label "training time (s)" loss --legend "loss, mean of the last 3 steps (raw: faint)"; then
  ok "plot --smooth 3 --x time"; else bad "plot --smooth --x time"; cat "$T/e"; fi
"$B" plot "$T/m.jsonl" --out "$T/x.svg" --x wall 2>"$T/e"; [ $? = 2 ] && grep -q "expects step or time" "$T/e" && ok "--x wall refused" || bad "--x wall: $(cat "$T/e")"
"$B" plot "$T/m.jsonl" --out "$T/x.svg" --smooth 0 2>/dev/null; [ $? = 2 ] && ok "--smooth 0 refused" || bad "--smooth 0 accepted"
printf '{"step": 1, "loss": 2}\n{"step": 2, "loss": 1}\n' >"$T/nt.jsonl"
"$B" plot "$T/nt.jsonl" --out "$T/x.svg" --x time 2>"$T/e"; [ $? = 1 ] && grep -q 'needs "step_ms"' "$T/e" && ok "--x time without step_ms" || bad "--x time: $(cat "$T/e")"
finish
