#!/usr/bin/env python3
"""gen_api.py: write the API reference (Markdown) from include/brigade/*.h.

Usage: scripts/gen_api.py [--source DIR] [--output FILE | -]
  --source  the source tree (default: this script's parent folder's parent)
  --output  where to write (default "-": stdout)
The build runs it (the `docs` target, docs/CMakeLists.txt) into
BUILD/docs/api.md; the reference is never committed. Prints the public
functions that have no doc comment to stderr (a warning, never a failure).
test_api_docs checks the build's copy against the headers and the library.

Python's standard library only. The parser reads our headers, which follow
one style (docs in /** */ before a declaration or /**< */ after it on the
same line); it is not a C parser:
  - the first /** ... @file ... */ comment is the header's description;
  - a top-level plain comment made of `----` rulers, or the line after an
    empty ruler comment, is a section title;
  - a /** */ comment documents the declaration below it and the ones that
    follow it directly (no blank line, comment or declaration with its own
    comment between): one comment for `bg_sim_busy` and `bg_sim_idle`;
  - a /**< */ comment documents the declaration or field it ends (its text may
    continue on the next lines until */);
  - public: every declaration and #define of the header except names that
    start with bg__/BG__, include guards and the __cplusplus blocks;
  - an enum whose body uses an X-macro list (BG_STATUS_MAP(...)) lists the
    list's entries; the column names come from "X(a, b, c)" in the list's
    comment.
Output is a function of the headers only: the same headers give the same bytes.
"""
import argparse
import glob
import os
import re
import sys
import textwrap

# Headers in reading order (the dependency order of the library); any other
# header comes after these, by name, and the umbrella header last.
ORDER = ["status.h", "core.h", "backend.h", "layer.h", "model.h", "executor.h", "train.h",
         "schedule.h", "transport.h", "checkpoint.h", "partitioner.h"]
UMBRELLA = "brigade.h"

NO_COMPILE_DECL = "<!-- no-compile: declarations copied from the header -->"
NO_COMPILE_EXAMPLE = "<!-- no-compile: a copy; test_docs_code compiles it from the header -->"


# --------------------------------------------------------------------------- lexing

class Chunk:
    """One top-level piece of a header: a comment, a preprocessor line or a
    declaration (up to its ';'), with its first and last line (1-based)."""

    def __init__(self, kind, text, line, end_line):
        self.kind = kind          # "doc", "post", "comment", "pp", "decl"
        self.text = text
        self.line = line
        self.end_line = end_line


def lex(src):
    """Split a header into chunks. Comments inside a declaration stay in its
    text; so do preprocessor lines inside braces."""
    chunks = []
    i, n, line = 0, len(src), 1

    def count(a, b):
        return src.count("\n", a, b)

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                raise ValueError(f"line {line}: unterminated comment")
            text = src[i:j + 2]
            kind = "post" if text.startswith("/**<") else "doc" if text.startswith("/**") else "comment"
            end = line + count(i, j + 2)
            chunks.append(Chunk(kind, text, line, end))
            line, i = end, j + 2
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif c == "#":
            j = i
            while True:
                k = src.find("\n", j)
                if k < 0:
                    k = n
                if src[j:k].rstrip().endswith("\\") and k < n:
                    j = k + 1
                    continue
                break
            end = line + count(i, k)
            chunks.append(Chunk("pp", src[i:k], line, end))
            line, i = end, k
        else:
            j, depth, saw_paren = i, 0, False
            while j < n:
                d = src[j]
                if src.startswith("/*", j):
                    j = src.find("*/", j + 2) + 2
                    continue
                if d in "({[":
                    depth += 1
                    saw_paren = saw_paren or (d == "(" and depth == 1)
                elif d in ")}]":
                    depth -= 1
                    # a function body: `static inline T f(...) { ... }` ends at its brace
                    if d == "}" and depth == 0 and saw_paren and not re.match(
                            r"\s*(typedef\s+)?(struct|enum|union)\b", src[i:j]):
                        j += 1
                        break
                elif d == ";" and depth == 0:
                    j += 1
                    break
                j += 1
            end = line + count(i, j)
            chunks.append(Chunk("decl", src[i:j], line, end))
            line, i = end, j
    return chunks


def comment_lines(text):
    """The lines of a /** */ or /**< */ comment without the comment marks and
    the leading ` * ` of each line, dedented."""
    body = re.sub(r"^/\*\*?<?", "", text)
    body = re.sub(r"\*/$", "", body)
    lines = body.split("\n")
    out = [lines[0].strip()]
    for ln in lines[1:]:
        m = re.match(r"^\s*\*(?!/)( ?)(.*)$", ln)
        out.append(m.group(2).rstrip() if m else ln.strip())
    while out and not out[-1].strip():
        out.pop()
    while out and not out[0].strip():
        out.pop(0)
    first, rest = (out[0], out[1:]) if out else ("", [])
    rest = textwrap.dedent("\n".join(rest)).split("\n") if rest else []
    return [first] + rest if out else []


def one_line(text):
    """A /**< */ comment (or any comment) as one line of text."""
    return " ".join(ln.strip() for ln in comment_lines(text) if ln.strip())


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def code_text(text):
    """A declaration as the header writes it: its doc comments and trailing
    spaces removed (top-level declarations start in column 0, so the lines
    keep their indentation)."""
    text = re.sub(r"[ \t]*/\*\*<?.*?\*/", "", text, flags=re.S)
    return "\n".join(ln.rstrip() for ln in text.strip().split("\n") if ln.strip())


# --------------------------------------------------------------------------- items

class Item:
    """A public declaration."""

    def __init__(self, kind, name, code, line, end_line):
        self.kind = kind          # "function", "typedef", "struct", "enum", "macro", "variable"
        self.name = name
        self.code = code          # as the header writes it (comments removed)
        self.line = line
        self.end_line = end_line
        self.doc = []             # lines of its /** */ comment
        self.post = ""            # its /**< */ comment
        self.fields = []          # struct: ("section", text) or ("field", decl, doc)
        self.values = None        # enum: (columns, rows)
        self.raw = ""


def anchor(name):
    return re.sub(r"[^A-Za-z0-9_]+", "-", name).strip("-")


def decl_name(text):
    """(kind, name) of a top-level declaration, or None when it declares nothing public."""
    t = " ".join(strip_comments(text).split())
    if t.startswith("typedef"):
        m = re.match(r"typedef\s+(struct|enum|union)\b[^{;]*\{", t)
        if m:
            n = re.search(r"\}\s*(\w+)\s*;\s*$", t)
            return (m.group(1) if m.group(1) != "union" else "struct"), n.group(1)
        m = re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\(", t)
        if m:
            return "typedef", m.group(1)
        m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*;\s*$", t)
        return "typedef", m.group(1)
    m = re.match(r"(struct|enum|union)\s+(\w+)\s*\{", t)
    if m:
        return ("enum" if m.group(1) == "enum" else "struct"), f"{m.group(1)} {m.group(2)}"
    m = re.match(r"[^(]*?\b(\w+)\s*\(", t)
    if m and not t.startswith("extern \"C\""):
        return "function", m.group(1)
    m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*(=[^;]*)?;\s*$", t)
    if m:
        return "variable", m.group(1)
    return None


def parse_struct(item, text):
    """Fields of a struct body: ("section", text) for a plain comment on its
    own line, ("field", declaration, doc) for each member."""
    body = text[text.index("{") + 1:text.rindex("}")]
    members, pending, cur, depth, i = [], [], "", 0, 0
    while i < len(body):
        if body.startswith("/*", i):
            j = body.find("*/", i + 2) + 2
            com = body[i:j]
            if com.startswith("/**<"):
                if members and members[-1][0] == "field":
                    members[-1][2] = (members[-1][2] + " " + one_line(com)).strip()
            elif com.startswith("/**"):
                pending.append(one_line(com))
            elif cur.strip():
                cur += com            # a shape comment inside a declaration
            else:
                sec = section_title(com)
                if sec:
                    members.append(["section", sec, ""])
            i = j
            continue
        c = body[i]
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        if c == ";" and depth == 0:
            members.append(["field", " ".join(cur.split()), " ".join(pending)])
            pending, cur = [], ""
        else:
            cur += c
        i += 1
    item.fields = [tuple(m) for m in members]


def parse_enum(item, text, macros):
    """Rows of an enum body: (constant, doc) for each enumerator, or the
    entries of an X-macro list used in it."""
    body = text[text.index("{") + 1:text.rindex("}")]
    expanders = {}
    for m in re.finditer(r"^\s*#\s*define\s+(\w+)\(([^)]*)\)\s*(.*)$", body, re.M):
        expanders[m.group(1)] = ([p.strip() for p in m.group(2).split(",")], m.group(3))
    body = re.sub(r"^\s*#.*$", "", body, flags=re.M)
    # an X-macro list expands to its own commas: end it like an enumerator
    body = re.sub(r"\b(\w+\(\w+\))", r"\1,", body)
    rows, columns = [], None
    entries, pending, cur, i = [], [], "", 0
    while i < len(body):
        if body.startswith("/*", i):
            j = body.find("*/", i + 2) + 2
            com = body[i:j]
            if com.startswith("/**<") and entries and not cur.strip():
                entries[-1][1] = one_line(com)
            elif com.startswith("/**<") and cur.strip():
                entries.append([" ".join(cur.split()), one_line(com)])
                cur = ""
            elif com.startswith("/**"):
                pending.append(one_line(com))
            i = j
            continue
        c = body[i]
        if c == ",":
            entries.append([" ".join(cur.split()), " ".join(pending)])
            pending, cur = [], ""
        else:
            cur += c
        i += 1
    if cur.strip():
        entries.append([" ".join(cur.split()), " ".join(pending)])
    for const, doc in entries:
        if not const:
            continue
        m = re.match(r"(\w+)\((\w+)\)$", const)
        if m and m.group(1) in macros and m.group(2) in expanders:
            params, expansion = expanders[m.group(2)]
            prefix = re.search(r"(\w*)##\s*" + re.escape(params[0]), expansion)
            prefix = prefix.group(1) if prefix else ""
            mac = macros[m.group(1)]
            names = re.search(r"X\(([^)]*)\)", " ".join(mac.doc)) if mac.doc else None
            names = [s.strip() for s in names.group(1).split(",")] if names else params
            columns = names[1:]
            for args in re.findall(r"\bX\((.*?)\)\s*(?:\\|$)", mac.raw, re.M):
                parts = split_args(args)
                rows.append(([prefix + parts[0]] + parts[1:], ""))
        else:
            rows.append(([const], doc))
    item.values = (columns, rows)


def split_args(s):
    """Split macro arguments at top-level commas (strings kept whole)."""
    out, cur, depth, q = [], "", 0, False
    for c in s:
        if c == '"':
            q = not q
        if not q and c in "(":
            depth += 1
        if not q and c in ")":
            depth -= 1
        if c == "," and depth == 0 and not q:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    out.append(cur.strip())
    return out


def section_title(com):
    """The title of a `/* ---- title ---- */` comment ("" for a bare ruler,
    None for any other comment); the lines of a longer one are kept."""
    text = re.sub(r"^/\*|\*/$", "", com)
    lines = [re.sub(r"^\s*\*(?!\*)", "", ln) for ln in text.split("\n")]
    if "----" not in lines[0]:
        return None
    lines = [" ".join(ln.replace("-" * 4, " ").strip(" -").split()) for ln in lines]
    return "\n".join(ln for ln in lines if ln)


class Header:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        self.brief = ""
        self.doc = []
        self.entries = []         # ("section", title) or ("group", doc lines, [items])


def parse_header(path):
    src = open(path, encoding="utf-8").read()
    # the C++ linkage blocks: blanked, keeping the line numbers
    src = re.sub(r"^#\s*ifdef\s+__cplusplus\b.*?^#\s*endif\b[^\n]*",
                 lambda m: "\n" * m.group(0).count("\n"), src, flags=re.M | re.S)
    chunks = lex(src)
    h = Header(path)
    macros = {}
    pending_doc = None            # lines of the last /** */ comment, not yet used
    prev = None                   # the last item placed
    run_open = False              # may the next item join prev's group?
    ruler_line = None             # the end line of an empty `/* ---- */` ruler
    for ch in chunks:
        if ch.kind == "doc" and not h.doc and re.search(r"[@\\]file\b", ch.text):
            file_doc(h, ch.text)
            continue
        if ch.kind == "doc":
            pending_doc = comment_lines(ch.text)
            run_open = False
            continue
        if ch.kind == "post":
            if prev is not None and ch.line == prev.end_line:
                prev.post = (prev.post + " " + one_line(ch.text)).strip()
            run_open = False
            continue
        if ch.kind == "comment":
            title = section_title(ch.text)
            if title == "":
                ruler_line = ch.end_line
                title = None
            elif title is None and ruler_line is not None and ch.line == ruler_line + 1:
                title = " ".join(re.sub(r"^/\*|\*/$", "", ch.text).split())
            if title:
                h.entries.append(("section", " ".join(title.split())))
            run_open = False
            continue
        item = macro_item(ch, macros) if ch.kind == "pp" else decl_item(ch, macros)
        if item is None:
            run_open = False
            continue
        place(h, item, pending_doc, prev, run_open, src)
        prev, run_open, pending_doc = item, True, None
    return h, macros


def file_doc(h, text):
    """The header's own comment: its @brief and the text after it."""
    lines = [ln for ln in comment_lines(text) if not re.match(r"\s*[@\\]file\b", ln)]
    text = "\n".join(lines)
    m = re.match(r"\s*[@\\]brief\s+(.*?)(\n\s*\n|\Z)", text, re.S)
    if m:
        h.brief = " ".join(m.group(1).split())
        text = text[m.end():]
    h.doc = text.strip("\n").split("\n") if text.strip() else []


def macro_item(ch, macros):
    """A public #define, or None (other directives, guards, bg__ helpers)."""
    m = re.match(r"#\s*define\s+(\w+)", ch.text)
    if not m or m.group(1).startswith("BG__") or re.match(r"BRIGADE_\w+_H$", m.group(1)):
        return None
    raw = ch.text
    code = "\n".join(re.sub(r"\s*\\$", "", ln.rstrip()) for ln in
                     re.sub(r"[ \t]*/\*.*?\*/", "", raw, flags=re.S).split("\n"))
    item = Item("macro", m.group(1), code.strip("\n"), ch.line, ch.end_line)
    item.raw = raw
    post = re.search(r"/\*\*<(.*?)\*/", raw, re.S)
    if post:
        item.post = one_line("/**<" + post.group(1) + "*/")
    macros[item.name] = item
    return item


def decl_item(ch, macros):
    """A public declaration, or None."""
    kn = decl_name(ch.text)
    if not kn or re.sub(r"^(struct|enum) ", "", kn[1]).lower().startswith("bg__"):
        return None
    item = Item(kn[0], kn[1], code_text(ch.text), ch.line, ch.end_line)
    item.raw = ch.text
    if item.kind == "struct":
        parse_struct(item, ch.text)
    elif item.kind == "enum":
        parse_enum(item, ch.text, macros)
    return item


def place(h, item, doc, prev, run_open, src):
    """Put an item in a new group (with the doc comment above it) or in the
    group of the item on the line just above it, when that group has a doc
    comment and neither item has a /**< */ of its own."""
    lines = src.split("\n")
    if doc is None and run_open and prev is not None and item.line == prev.end_line + 1 \
            and h.entries and h.entries[-1][0] == "group" and h.entries[-1][1] \
            and not prev.post and "/**<" not in lines[item.end_line - 1]:
        h.entries[-1][2].append(item)
    else:
        h.entries.append(("group", doc or [], [item]))
    item.doc = doc or []


# --------------------------------------------------------------------------- Markdown

class Names:
    """Declared names and where their entry is, for links in the prose."""

    def __init__(self):
        self.target = {}

    def add(self, name, target):
        self.target.setdefault(name, target)


IDENT = re.compile(r"\b(?:bg|BG|BRIGADE)_\w+(?:(?:\.|->)\w+)*(?:\(\))?|\*?\b\w+_p\b")


def inline(text, names, table=False, self_names=()):
    """One line of comment prose as Markdown: identifiers as code (linked when
    declared), @p name as code, Markdown's special characters escaped."""
    out = []
    for k, part in enumerate(re.split(r"(`[^`\n]*`)", text)):
        if k % 2:
            out.append(part.replace("|", "\\|") if table else part)
            continue
        part = re.sub(r"[@\\]p\s+(\w+)", lambda m: "\0" + m.group(1) + "\0", part)
        pieces = re.split(r"(\0\w+\0)", part)
        res = []
        for j, p in enumerate(pieces):
            if j % 2:
                res.append("`" + p.strip("\0") + "`")
                continue
            last = 0
            for m in IDENT.finditer(p):
                res.append(escape(p[last:m.start()], table))
                word = m.group(0)
                base = re.match(r"\*?(\w+)", word).group(1)
                code = "`" + word + "`"
                if base in names.target and base not in self_names:
                    code = f"[{code}](#{names.target[base]})"
                res.append(code)
                last = m.end()
            res.append(escape(p[last:], table))
        out.append("".join(res))
    return "".join(out)


def escape(s, table):
    """Escape what Markdown would read as markup: emphasis (a `*` or `_` that
    can open or close it), HTML (`<`), links (`](`), table cells (`|`)."""
    s = s.replace("\\", "\\\\").replace("<", "\\<")
    s = re.sub(r"(?<!\s)\*|\*(?!\s)", r"\\*", s)
    s = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", s)
    s = re.sub(r"\](?=[(\[:])", r"\\]", s)
    if table:
        s = s.replace("|", "\\|")
    return s


def prose(lines, names, self_names=()):
    """Doc comment lines as Markdown blocks."""
    out, i, prev_blank, in_list = [], 0, True, 0
    while i < len(lines):
        ln = lines[i]
        m = re.match(r"^\s*[@\\]code(\{[^}]*\})?\s*$", ln)
        if m:
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*[@\\]endcode\s*$", lines[j]):
                j += 1
            code = textwrap.dedent("\n".join(lines[i + 1:j])).strip("\n")
            if out and out[-1] != "":
                out.append("")
            if m.group(1) == "{.unparsed}":
                out += ["```text"] + code.split("\n") + ["```", ""]
            else:
                out += ["*(compiled from the header by test_docs_code)*", "", NO_COMPILE_EXAMPLE,
                        "```c"] + code.split("\n") + ["```", ""]
            i, prev_blank = j + 1, True
            continue
        if not ln.strip():
            if out and out[-1] != "":
                out.append("")
            prev_blank = True
            i += 1
            continue
        if prev_blank and re.match(r"^ {4,}\S", ln):
            # an indented block stays verbatim (Markdown's indented code)
            while i < len(lines) and (re.match(r"^ {4,}\S", lines[i]) or not lines[i].strip()):
                out.append(lines[i].rstrip())
                i += 1
            while out and out[-1] == "":
                out.pop()
            out.append("")
            continue
        m = re.match(r"^\s*[@\\]param(\[[a-z,]+\])?\s+(\w+)\s*(.*)$", ln)
        indent = len(ln) - len(ln.lstrip())
        if m:
            out.append(f"- Parameter `{m.group(2)}`: " + inline(m.group(3), names, self_names=self_names))
            in_list = 2
        elif re.match(r"[-+] ", ln.strip()):
            out.append(ln[:min(indent, 3)] + inline(ln.strip(), names, self_names=self_names))
            in_list = min(indent, 3) + 2      # where the item's text starts
        else:
            body = inline(ln.strip(), names, self_names=self_names)
            if re.match(r"^(\d+[.)]|#|>|=+$|-+$)", ln.strip()):
                body = "\\" + body           # not a list, heading, quote or underline
            if in_list and indent:
                body = " " * in_list + body   # the item goes on
            elif in_list:
                out.append("")                # the list has ended
                in_list = 0
            out.append(body)
        prev_blank = False
        i += 1
    while out and out[-1] == "":
        out.pop()
    return out


def fence(code, note=NO_COMPILE_DECL):
    return [note, "```c"] + code.split("\n") + ["```"]


def render_group(doc, items, names):
    """A heading with an anchor per name, the declarations as the header
    writes them (a struct or enum as its first line), the doc comment, each
    item's /**< */ comment, then the fields or values of structs and enums."""
    ids = [anchor(it.name) for it in items]
    title = ", ".join(f"`{it.name}`" for it in items)
    out = ["#### " + "".join(f'<a id="{a}"></a>' for a in ids) + title, ""]
    self_names = {it.name for it in items}
    for it in items:
        if it.kind == "enum":
            self_names |= {re.match(r"\w+", cells[0]).group(0) for cells, _ in it.values[1]}
    out += fence("\n".join(compound_head(it) if it.kind in ("struct", "enum") else it.code
                           for it in items)) + [""]
    if doc:
        out += prose(doc, names, self_names) + [""]
    for it in items:
        if it.post:
            lead = f"`{it.name}`: " if len(items) > 1 else ""
            out += [lead + inline(it.post, names, self_names=self_names), ""]
    for it in items:
        if it.kind == "struct":
            out += struct_table(it, names)
        elif it.kind == "enum":
            out += enum_table(it, names)
    return out


def compound_head(it):
    """`typedef struct bg_x { ... } bg_x_t;`: a struct or enum without its body."""
    t = " ".join(strip_comments(it.raw).split())
    return t[:t.index("{")] + "{ ... }" + t[t.rindex("}") + 1:]


def struct_table(it, names):
    out, table = [], False
    for f in it.fields:
        if f[0] == "section":
            if table:
                out.append("")
            first, *rest = f[1].split("\n")
            out += ["**" + inline(first, names) + "**"] + [inline(ln, names) for ln in rest] + [""]
            table = False
            continue
        if not table:
            out += ["| Field | Description |", "|---|---|"]
            table = True
        decl = f[1].rstrip(";").replace("|", "\\|")
        out.append(f"| `{decl}` | {inline(f[2], names, table=True)} |")
    if table:
        out.append("")
    return out


def enum_table(it, names):
    """Constants of an enum: with an X-macro list, one column per argument."""
    columns, rows = it.values
    columns = [c[:1].upper() + c[1:] for c in columns or []]
    described = any(doc for _, doc in rows) or not columns
    cols = ["Constant"] + columns + (["Description"] if described else [])
    self_names = {re.match(r"\w+", cells[0]).group(0) for cells, _ in rows} | {it.name}
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for cells, doc in rows:
        cells = cells + [""] * (1 + len(columns) - len(cells))
        row = [f"`{c}`".replace("|", "\\|") if c else "" for c in cells]
        if described:
            row.append(inline(doc, names, table=True, self_names=self_names))
        out.append("| " + " | ".join(row) + " |")
    return out + [""]


def ordered_headers(src):
    paths = sorted(glob.glob(os.path.join(src, "include", "brigade", "*.h")))
    by_name = {os.path.basename(p): p for p in paths}
    names = [n for n in ORDER if n in by_name]
    names += sorted(n for n in by_name if n not in ORDER and n != UMBRELLA)
    if UMBRELLA in by_name:
        names.append(UMBRELLA)
    return [by_name[n] for n in names]


def generate(src):
    """(Markdown text, the headers' parsed form)."""
    headers = [parse_header(p)[0] for p in ordered_headers(src)]
    names = Names()
    for h in headers:
        for e in h.entries:
            if e[0] != "group":
                continue
            for it in e[2]:
                a = anchor(it.name)
                names.add(it.name, a)
                tag = re.match(r"(?:typedef\s+)?(?:struct|enum|union)\s+(\w+)", " ".join(it.raw.split()))
                if tag:
                    names.add(tag.group(1), a)
                if it.kind == "enum":
                    for cells, _ in it.values[1]:
                        names.add(re.match(r"\w+", cells[0]).group(0), a)

    out = ["<!-- Generated by scripts/gen_api.py from include/brigade/*.h (the build's `docs` target): do not edit. -->",
           "# brigade API reference", "",
           "Every public declaration of `include/brigade/*.h`, with its doc comment, in the",
           "library's dependency order. `#include <brigade/brigade.h>` includes them all.",
           "Design: docs/architecture.md in the source tree. The build generates this file",
           "(`cmake --build BUILD --target docs` writes BUILD/docs/api.md); `test_api_docs` checks it.", "",
           "## Contents", ""]
    for h in headers:
        hid = "header-" + anchor(h.name[:-2])
        out.append(f"- [{h.name}](#{hid})" + (f": {inline(h.brief, names)}" if h.brief else ""))
        decls = [it.name for e in h.entries if e[0] == "group" for it in e[2]]
        if decls:
            out.append("  <br>" + ", ".join(f"[`{n}`](#{anchor(n)})" for n in decls))
    out.append("")
    for h in headers:
        hid = "header-" + anchor(h.name[:-2])
        out += [f'## <a id="{hid}"></a>{h.name}', "",
                f"`#include <brigade/{h.name}>`" + (f": {inline(h.brief, names)}" if h.brief else ""), ""]
        if h.doc:
            out += prose(h.doc, names) + [""]
        for e in h.entries:
            if e[0] == "section":
                out += [f"### {inline(e[1][:1].upper() + e[1][1:], names)}", ""]
            else:
                out += render_group(e[1], e[2], names)
    while out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n", headers


def undocumented(headers):
    """Public functions without a doc comment: 'header:line: name'."""
    res = []
    for h in headers:
        for e in h.entries:
            if e[0] != "group":
                continue
            for it in e[2]:
                if it.kind == "function" and not e[1] and not it.post:
                    res.append(f"include/brigade/{h.name}:{it.line}: {it.name}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--output")
    args = ap.parse_args()
    text, headers = generate(args.source)
    missing = undocumented(headers)
    if missing:
        print(f"gen_api.py: warning: {len(missing)} public functions have no doc comment:", file=sys.stderr)
        for m in missing:
            print("  " + m, file=sys.stderr)
    path = args.output or "-"
    if path == "-":
        sys.stdout.write(text)
    else:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
