#!/usr/bin/env python3
"""scripts/text_to_tokens.py: write a text file's bytes as a token file that
`brigade train --data` reads (docs/training.md), so the bundled corpus can go
through the token-file path: llm.c's format (a 256 x int32 header: magic
20240520, version 1, token count; then uint16 tokens), or headerless
uint16 / uint32 arrays (nanoGPT's train.bin). Tokens are the bytes (0..255),
so --vocab 256 holds them. It only converts; it must not tokenize.

usage: text_to_tokens.py [--format llmc|raw16|raw32] [--val-fraction F] IN OUT [VAL_OUT]
  --val-fraction F  write the last F of the bytes to VAL_OUT instead (held out)
"""
import argparse
import struct
import sys

MAGIC, VERSION = 20240520, 1


def write(path, data, fmt):
    with open(path, "wb") as f:
        if fmt == "llmc":
            header = [0] * 256
            header[0], header[1], header[2] = MAGIC, VERSION, len(data)
            f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%d%s" % (len(data), "I" if fmt == "raw32" else "H"), *data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=["llmc", "raw16", "raw32"], default="llmc")
    ap.add_argument("--val-fraction", type=float, default=0.0)
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("val_output", nargs="?")
    a = ap.parse_args()
    if not 0 <= a.val_fraction < 1 or (a.val_fraction > 0) != (a.val_output is not None):
        ap.error("--val-fraction F in (0, 1) goes with VAL_OUT")
    data = open(a.input, "rb").read()
    if not data:
        sys.exit(f"text_to_tokens: {a.input} is empty")
    cut = len(data) - int(len(data) * a.val_fraction)
    write(a.output, data[:cut], a.format)
    if a.val_output:
        write(a.val_output, data[cut:], a.format)
    print(f"{a.output}: {cut} tokens ({a.format})" + (f"; {a.val_output}: {len(data) - cut}" if a.val_output else ""))


if __name__ == "__main__":
    main()
