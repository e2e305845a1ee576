#!/usr/bin/env python3
"""tests/lib/svgcheck.py: parse an SVG brigade drew (xml.etree) and check it.

  svgcheck.py FILE [--title SUBSTR] [--unit UNIT] [--axis-label TEXT ...]
                   [--legend ENTRY ...] [--not-legend ENTRY ...] [--text TEXT ...]
                   [--same-axis OTHER.svg]

--title: the element of class "title" contains SUBSTR; --unit: an axis label
(class "axis-label") reads "... (UNIT)"; --axis-label: these axis labels exist;
--legend / --not-legend: entries (texts of class "legend-item" groups) that
must / must not be listed; the legend lists each entry once; --text: texts
present anywhere; --same-axis: OTHER has the same width, tick labels and tick
positions. Exits 1 with the first failed check."""
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"


def texts(el):
    return "".join(el.itertext()).strip()


def load(path):
    root = ET.parse(path).getroot()
    assert root.tag == NS + "svg", f"{path}: root is {root.tag}"
    by_class = {}
    for el in root.iter():
        c = el.get("class")
        if c:
            by_class.setdefault(c, []).append(el)
    return root, by_class


def ticks(by_class):
    return [(texts(t), round(float(t.get("x")), 1)) for t in by_class.get("tick", [])]


def main(argv):
    path, opts, key = argv[0], {}, None
    for a in argv[1:]:
        if a.startswith("--"):
            key = a[2:]
            opts.setdefault(key, [])
        else:
            opts[key].append(a)
    root, cl = load(path)
    def fail(msg):
        print(f"svgcheck {path}: {msg}", file=sys.stderr)
        sys.exit(1)
    alltext = [texts(t) for t in root.iter(NS + "text")]
    titles = [texts(t) for t in cl.get("title", [])]
    for t in opts.get("title", []):
        if not any(t in x for x in titles):
            fail(f"no title containing {t!r} (titles: {titles})")
    labels = [texts(t) for t in cl.get("axis-label", [])]
    for u in opts.get("unit", []):
        if not any(l.endswith(f"({u})") for l in labels):
            fail(f"no axis label in {u!r} (labels: {labels})")
    for l in opts.get("axis-label", []):
        if l not in labels:
            fail(f"no axis label {l!r} (labels: {labels})")
    legend = [texts(g) for g in cl.get("legend-item", [])]
    if len(set(legend)) != len(legend):
        fail(f"legend repeats an entry: {legend}")
    for e in opts.get("legend", []):
        if e not in legend:
            fail(f"legend lacks {e!r} (legend: {legend})")
    for e in opts.get("not-legend", []):
        if e in legend:
            fail(f"legend lists {e!r}, which is not drawn (legend: {legend})")
    for t in opts.get("text", []):
        if not any(t in x for x in alltext):
            fail(f"no text {t!r}")
    for other in opts.get("same-axis", []):
        r2, c2 = load(other)
        if root.get("width") != r2.get("width"):
            fail(f"width differs from {other}")
        if not ticks(cl) or ticks(cl) != ticks(c2):
            fail(f"ticks differ from {other}: {ticks(cl)} vs {ticks(c2)}")
        if labels != [texts(t) for t in c2.get("axis-label", [])]:
            fail(f"axis label differs from {other}")
    print(f"svgcheck {path}: ok (title {titles[:1]}, axis {labels}, legend {legend})")


if __name__ == "__main__":
    main(sys.argv[1:])
