#!/usr/bin/env python3
"""Rewrites gtest assertions on Status values to the matchers of tests/unit/status_matchers.h.

  ASSERT_TRUE(x.ok()) << x.status();             -> ASSERT_OK(x);
  EXPECT_TRUE(f().ok()) << "ctx";                -> EXPECT_OK(f()) << "ctx";
  EXPECT_FALSE(x.ok());                          -> EXPECT_THAT(x, ::testing::Not(IsOk()));
  EXPECT_EQ(x.status().code(), absl::StatusCode::kNotFound) << x.status();
                                                 -> EXPECT_THAT(x, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_NE(s.code(), absl::StatusCode::kOk)     -> EXPECT_THAT(s, ::testing::Not(StatusIs(absl::StatusCode::kOk)));

Streamed context that only repeats the status (`<< x.status()`, `<< s`, `<< s.error_message()`, ...)
is dropped: the matchers print the status. Other context is kept. Each file it changes gets
`#include "status_matchers.h"`. Idempotent; prints what it changed and the `.ok()` assertions it
left alone (compound conditions such as `a.ok() && b.ok()`), for a reader to judge.

Usage: scripts/dev/convert_status_asserts.py [--check] [paths...]   (default: tests/unit)
  --check: change nothing, exit 1 if anything would be converted.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CALL = re.compile(r"\b(ASSERT|EXPECT)_(TRUE|FALSE|EQ|NE)\s*\(")
IDENT_CODE = re.compile(r"^(?:::)?(?:absl::)?StatusCode::k\w+$")
SKIP_NAMES = {"status_matchers.h", "status_matchers_test.cc"}


def skip_literal(s, i):
    """s[i] is a quote; returns the index after the literal (raw strings: R"d(...)d")."""
    q = s[i]
    if q == '"' and i > 0 and s[i - 1] == "R":
        m = re.match(r'"([^(]*)\(', s[i:])
        if m:
            end = s.find(")" + m.group(1) + '"', i)
            return end + len(m.group(1)) + 2
    i += 1
    while i < len(s) and s[i] != q:
        i += 2 if s[i] == "\\" else 1
    return i + 1


def match_paren(s, i):
    """s[i] is '('; returns the index of its ')'."""
    depth = 0
    while i < len(s):
        c = s[i]
        if c in "\"'":
            i = skip_literal(s, i)
            continue
        if s.startswith("//", i):
            i = s.index("\n", i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced")


def split_top(s, sep):
    """Splits s at top-level occurrences of sep (outside brackets and literals)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in "\"'":
            i = skip_literal(s, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def top_level_text(s):
    """s with the contents of brackets and literals blanked out."""
    out, depth, i = [], 0, 0
    while i < len(s):
        c = s[i]
        if c in "\"'":
            j = skip_literal(s, i)
            out.append("_" * (j - i))
            i = j
            continue
        if c in "([{":
            depth += 1
            out.append(c if depth == 1 else "_")
        elif c in ")]}":
            out.append(c if depth == 1 else "_")
            depth -= 1
        else:
            out.append(c if depth == 0 else "_")
        i += 1
    return "".join(out)


def simple_operand(e):
    """True if e is a postfix expression (a.b->c(d)[e], (*p)->f()) with no top-level operator."""
    t = top_level_text(e.strip())
    t = t.replace("->", ".").replace("::", ".")
    return re.fullmatch(r"[A-Za-z_(][\w.()\[\]_]*", t) is not None


def strip_suffix(e, suffix):
    e = e.strip()
    if e.endswith(suffix) and simple_operand(e[: -len(suffix)]):
        return e[: -len(suffix)].strip()
    return None


def redundant(part, subject):
    """True if a streamed part only repeats the asserted status."""
    p = re.sub(r"\s+", "", part)
    s = re.sub(r"\s+", "", subject)
    forms = {s}
    for base in (s, s + ".status()"):
        for m in (".status()", ".message()", ".error_message()", ".ToString()", ".status().message()",
                  ".status().ToString()"):
            forms.add(base + m)
    forms |= {"std::string(" + f + ")" for f in list(forms)}
    return p in forms


def clean_tail(tail, subject):
    """tail is the text between the macro's ')' and ';'. Drops streamed parts that repeat the status."""
    if not tail.strip().startswith("<<"):
        return tail
    parts = split_top(tail.strip()[2:], "<<")
    kept = []
    for p in parts:
        if redundant(p, subject):
            # Drop a label that introduced it ("...: " << s).
            if kept and re.fullmatch(r'\s*"[^"]*(: |\\n| )"\s*', kept[-1]):
                kept.pop()
            continue
        kept.append(p)
    while kept and re.fullmatch(r'\s*"(\\n|\s|:)*"\s*', kept[0]):
        kept.pop(0)
    if not kept:
        return ""
    return " << " + " << ".join(k.strip() for k in kept)


def statement_start(text, i):
    """True if the macro at i begins a statement on its own line (so it can become several)."""
    before = text[text.rfind("\n", 0, i) + 1:i]
    prev = text[:i].rstrip()
    return before.strip() == "" and prev[-1:] in (";", "{", "}")


def code_operand(arg, kcodes):
    a = arg.strip()
    return IDENT_CODE.match(a) is not None or a in kcodes


def convert(text, qualify):
    iso = "::warren::IsOk()" if qualify else "IsOk()"
    sis = "::warren::StatusIs" if qualify else "StatusIs"
    # Local names bound to an absl::StatusCode (const absl::StatusCode kDenied = ...).
    kcodes = set(re.findall(r"absl::StatusCode\s+(k\w+)\s*=", text))
    kcodes |= set(re.findall(r"\b(k\w+)\s*=\s*absl::StatusCode::k\w+", text))
    out, pos, changed, left = [], 0, 0, []
    for m in CALL.finditer(text):
        if m.start() < pos:
            continue
        kind, what = m.group(1), m.group(2)
        open_i = m.end() - 1
        try:
            close_i = match_paren(text, open_i)
        except ValueError:
            continue
        args = split_top(text[open_i + 1:close_i], ",")
        # The streamed tail, up to the statement's ';'.
        j = close_i + 1
        while j < len(text) and text[j] != ";":
            if text[j] in "\"'":
                j = skip_literal(text, j)
            elif text[j] == "(":
                j = match_paren(text, j) + 1
            else:
                j += 1
        if j >= len(text):
            continue
        tail = text[close_i + 1:j]
        repl = None
        if what in ("TRUE", "FALSE") and len(args) == 1:
            subject = strip_suffix(args[0], ".ok()")
            if subject is not None:
                if what == "TRUE":
                    repl = f"{kind}_OK({subject}){clean_tail(tail, subject)}"
                else:
                    repl = f"{kind}_THAT({subject}, ::testing::Not({iso})){clean_tail(tail, subject)}"
            elif what == "TRUE" and statement_start(text, m.start()):
                # a.ok() && b.ok(): one assertion each, in order.
                subjects = [strip_suffix(c, ".ok()") for c in split_top(args[0], "&&")]
                if len(subjects) > 1 and None not in subjects:
                    indent = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
                    repl = (";\n" + indent).join(f"{kind}_OK({s}){clean_tail(tail, s)}" for s in subjects)
            if repl is None and ".ok()" in args[0]:
                left.append(text[m.start():j + 1])
        elif what in ("EQ", "NE") and len(args) == 2:
            a, b = args
            if code_operand(a, kcodes):
                a, b = b, a
            if code_operand(b, kcodes):
                subject = strip_suffix(a, ".code()")
                if subject is not None:
                    s2 = strip_suffix(subject, ".status()")
                    subject = s2 if s2 is not None else subject
                    matcher = f"{sis}({b.strip()})"
                    if what == "NE":
                        matcher = f"::testing::Not({matcher})"
                    repl = f"{kind}_THAT({subject}, {matcher}){clean_tail(tail, subject)}"
        if repl is None:
            continue
        out.append(text[pos:m.start()])
        out.append(repl)
        pos = j
        changed += 1
    out.append(text[pos:])
    return "".join(out), changed, left


def add_include(text):
    if re.search(r'^#include "status_matchers.h"', text, re.M):
        return text
    lines = text.split("\n")
    incs = [i for i, l in enumerate(lines) if l.startswith("#include ")]
    if not incs:
        return '#include "status_matchers.h"\n' + text
    # The quoted block after the last <...> include (the first line may be the file's own header).
    angle = [i for i in incs if lines[i].startswith("#include <")]
    quoted = [i for i in incs if lines[i].startswith('#include "') and (not angle or i > angle[-1])]
    if quoted:
        at = quoted[-1] + 1
        for i in quoted:
            if lines[i] > '#include "status_matchers.h"':
                at = i
                break
        lines.insert(at, '#include "status_matchers.h"')
    else:
        lines[angle[-1] + 1:angle[-1] + 1] = ["", '#include "status_matchers.h"']
    return "\n".join(lines)


def main(argv):
    check = "--check" in argv
    paths = [a for a in argv if not a.startswith("--")] or [str(ROOT / "tests/unit")]
    files = []
    for p in map(pathlib.Path, paths):
        files += sorted(p.rglob("*")) if p.is_dir() else [p]
    total = 0
    for f in files:
        if f.suffix not in (".cc", ".h") or f.name in SKIP_NAMES:
            continue
        text = f.read_text()
        qualify = re.search(r"^namespace warren\b", text, re.M) is None
        new, n, left = convert(text, qualify)
        for stmt in left:
            print(f"{f}: left as is: {' '.join(stmt.split())}")
        if n == 0:
            continue
        total += n
        print(f"{f}: {n} assertion(s)")
        if not check:
            f.write_text(add_include(new))
    print(f"{total} assertion(s) {'to convert' if check else 'converted'}")
    return 1 if check and total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
