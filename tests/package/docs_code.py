#!/usr/bin/env python3
"""test_docs_code: compile every C example in the documentation.

Blocks:
  - README.md and docs/*.md: fenced blocks opened with ```c
  - include/brigade/*.h: @code ... @endcode in comments (the leading " * "
    of each line removed)

Convention:
  - a block containing `int main(` is a whole translation unit and is
    compiled as it is (it includes what it uses);
  - any other block is a fragment: it is compiled as the body of
    `int bg_doc_example(void) { <block> return 0; }` after
    `#include <brigade/brigade.h>`, <stdio.h>, <stdlib.h> and <string.h>.
    A fragment declares what it takes from the surrounding prose (a model,
    a communicator) at its top, so it compiles as it reads;
  - a block that is not meant to compile is skipped: in Markdown, an HTML
    comment `<!-- no-compile -->` (an explanation may follow the word) on
    the last non-blank line before the fence; in a header, `@code{.unparsed}`.
    Use it for pseudo-code and copies of declarations only.

Flags: -std=c11 -Wall -Wextra -Werror, with the unused-* warnings off (a
fragment may declare what it does not use), and -I<source>/include only,
so examples can use nothing but the public API. `#line` directives make
errors point at the document's own lines.

Prints each failure with the compiler's message, then how many blocks were
compiled and skipped; exits 1 if any failed or if none was found.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-variable",
         "-Wno-unused-but-set-variable", "-Wno-unused-function", "-Wno-unused-parameter"]
PRELUDE = """#include <brigade/brigade.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int bg_doc_example(void);
int bg_doc_example(void)
{
"""
NO_COMPILE = re.compile(r"^\s*<!--\s*no-compile\b.*-->\s*$")


def spans(path, lines, opening, closing):
    """(i, j, match) of each block: lines[i] matches `opening`, lines[j] is
    the first line after it that matches `closing`."""
    i = 0
    while i < len(lines):
        m = re.match(opening, lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(closing, lines[j]):
            j += 1
        if j == len(lines):
            raise SystemExit(f"{path}:{i + 1}: the code block is never closed")
        yield i, j, m
        i = j + 1


def markdown_blocks(path):
    """(first line number, code, skipped) of each ```c block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, j, m in spans(path, lines, r"^(\s*)```c\s*$", r"^\s*```\s*$"):
        indent = len(m.group(1))
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        body = "\n".join(line[indent:] if line[:indent].strip() == "" else line
                         for line in lines[i + 1:j])
        yield i + 2, body, bool(NO_COMPILE.match(prev))


def header_blocks(path):
    """(first line number, code, skipped) of each @code block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, j, m in spans(path, lines, r"^\s*\*?\s*[@\\]code(\{[^}]*\})?\s*$",
                         r"^\s*\*?\s*[@\\]endcode\s*$"):
        body = "\n".join(re.sub(r"^\s*\* ?", "", line) for line in lines[i + 1:j])
        yield i + 2, body, m.group(1) == "{.unparsed}"


def main():
    src = os.environ.get("BRIGADE_SOURCE_DIR") or os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    cc = os.environ.get("BG_CC", "cc")
    docs = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))
    headers = sorted(glob.glob(os.path.join(src, "include", "brigade", "*.h")))
    blocks = []
    for path in docs:
        blocks += [(path,) + b for b in markdown_blocks(path)]
    for path in headers:
        blocks += [(path,) + b for b in header_blocks(path)]

    compiled = skipped = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path, line, body, skip in blocks:
            rel = os.path.relpath(path, src)
            if skip:
                skipped += 1
                continue
            if re.search(r"\bint\s+main\s*\(", body):
                code = f'#line {line} "{rel}"\n{body}\n'
            else:
                code = f'{PRELUDE}#line {line} "{rel}"\n{body}\n    return 0;\n}}\n'
            c = os.path.join(tmp, "block.c")
            with open(c, "w", encoding="utf-8") as f:
                f.write(code)
            r = subprocess.run([cc] + FLAGS + ["-I", os.path.join(src, "include"), "-c", c,
                                               "-o", os.path.join(tmp, "block.o")],
                               capture_output=True, text=True, cwd=src)
            compiled += 1
            if r.returncode != 0:
                failed += 1
                print(f"FAIL: {rel}:{line}: the block does not compile\n{r.stderr}")
    print(f"docs code: {compiled} blocks compiled, {failed} failed, {skipped} skipped (no-compile)")
    if compiled == 0:
        print("no code blocks found: is the source directory right?")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
