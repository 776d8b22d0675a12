#!/usr/bin/env python3
"""Checks the library's size rule: no function longer than 80 lines and no file longer than 400 lines in src/,
compressors/, comm/, kernels/ and python/src (C++ sources: .cc, .h, .cu, .cuh).

A function's length is the number of lines from the line of its body's opening brace through the line of its
closing brace, both included (a one-line signature with `{` at its end plus 78 body lines plus `}` is 80). A file's
length is its number of lines. Lambdas and local classes count as part of the function that holds them; a lambda at
namespace or class scope counts as a function of its own.

The parser is a brace matcher, not a compiler: it drops comments, string and character literals (raw strings too)
and preprocessor lines, then classifies each `{` by the text before it (a function body follows a parameter list,
its trailing qualifiers, or a constructor's initializer list; anything else at namespace or class scope is a
container whose contents are scanned).

Exclusions (EXCLUDED_PATHS, EXCLUDED_FUNCTIONS below) carry a reason each. Known remaining offenders that other work
will split are listed, with a reason, in an allow-list file (default scripts/lengths_allowlist.txt), one per line:
    function <path>:<qualified name>  <reason>
    file <path>  <reason>
An allow-list entry that matches nothing is reported as stale (a warning; remove it).

usage: scripts/check_lengths.py [--root DIR] [--allowlist FILE] [--max-function N] [--max-file N]
Exit status 0 when everything holds, 1 with one line per offender on stderr otherwise, 2 on a usage error."""

import argparse
import fnmatch
import re
import sys
from pathlib import Path

ROOTS = ("src", "compressors", "comm", "kernels", "python/src")
SUFFIXES = (".cc", ".h", ".cu", ".cuh")
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 400

# (glob on the repository-relative path, reason). Matched against every path below the roots.
EXCLUDED_PATHS = (
    ("*/tests/*", "tests are exempt from the library's size rule (the issue's 'tests excepted')"),
    ("*/test/*", "tests are exempt from the library's size rule (the issue's 'tests excepted')"),
)
# (glob on the path, glob on the function's qualified name, reason). Only the function-length rule; the file still
# counts towards the 400-line rule.
EXCLUDED_FUNCTIONS = (
    ("python/src/*", "init_*",
     "nanobind binding tables: init_<part>(nb::module_&) is a flat list of .def/.class_ registrations whose length is "
     "the size of the Python API, not control flow"),
    ("python/src/*", "NB_MODULE",
     "nanobind binding table: the module's entry point, a flat list of registrations"),
)

CONTAINER_KEYWORDS = {"namespace", "class", "struct", "union", "enum"}
CONTROL_KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype"}
TRAILING_QUALIFIERS = {"const", "volatile", "noexcept", "override", "final", "mutable", "&", "&&", "constexpr",
                       "try"}
TOKEN = re.compile(r"[A-Za-z_]\w*|::|->|&&|\d[\w.']*|\S")


def strip_code(text):
    """The text with comments, string/char literals and preprocessor lines blanked out (newlines kept, so line
    numbers still hold). Literals become "" or '' so that `extern "C"` stays recognisable as `extern`."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":
            # Preprocessor directive, with backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                i += 1
            continue
        line_start = False
        if c == "\n":
            out.append(c)
            line_start = True
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and _raw_prefix_ok(text, i):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            end = text.find(")" + delim + '"', open_paren)
            end = n if end < 0 else end + len(delim) + 2
            out.append('""' + "".join("\n" for ch in text[i:end] if ch == "\n"))
            i = end
        elif c in "\"'":
            if c == "'" and _in_number(text, i):  # a digit separator: 1'000'000, 0xFFFF'FFFF
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _raw_prefix_ok(text, i):
    """Whether the R at text[i] starts a raw string literal: alone or after an encoding prefix (u8R, uR, UR, LR)."""
    start = i
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return text[start:i] in ("", "u8", "u", "U", "L")


def _in_number(text, i):
    """Whether the ' at text[i] is inside a numeric literal (a digit separator), not the start of a character."""
    start = i
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "'."):
        start -= 1
    return start < i and text[start].isdigit() and i + 1 < len(text) and text[i + 1].isalnum()


def tokens_with_lines(code):
    line = 1
    pos = 0
    for match in TOKEN.finditer(code):
        line += code.count("\n", pos, match.start())
        pos = match.start()
        yield match.group(0), line


def strip_trailing(head):
    """The head without the qualifiers and trailing return type that may follow a parameter list."""
    head = list(head)
    # A trailing return type: the last top-level `->` after a `)`.
    depth = 0
    for k in range(len(head) - 1, -1, -1):
        tok = head[k]
        if tok in (")", "]", ">"):
            depth += 1
        elif tok in ("(", "[", "<"):
            depth -= 1
        elif tok == "->" and depth == 0 and k > 0 and head[k - 1] == ")":
            head = head[:k]
            break
    while head:
        if head[-1] in TRAILING_QUALIFIERS:
            head.pop()
        elif head[-1] == ")" and _matching_open(head, len(head) - 1) > 0 and \
                head[_matching_open(head, len(head) - 1) - 1] in ("noexcept", "requires", "__launch_bounds__"):
            head = head[:_matching_open(head, len(head) - 1) - 1]
        else:
            break
    return head


def _matching_open(head, close_index):
    depth = 0
    for k in range(close_index, -1, -1):
        if head[k] == ")":
            depth += 1
        elif head[k] == "(":
            depth -= 1
            if depth == 0:
                return k
    return -1


def initializer_colon(head):
    """Index of a constructor initializer list's `:` (a top-level `:` right after a `)`), or -1."""
    depth = 0
    for k, tok in enumerate(head):
        if tok in ("(", "[", "{"):
            depth += 1
        elif tok in (")", "]", "}"):
            depth -= 1
        elif tok == ":" and depth == 0 and k > 0 and strip_trailing(head[:k])[-1:] == [")"]:
            return k
    return -1


def function_name(head):
    """The qualified name of the function whose head (up to the end of its parameter list) is given."""
    open_ = _matching_open(head, len(head) - 1)
    if open_ <= 0:
        return "<anonymous>"
    k = open_ - 1
    if head[k] == "]":  # a lambda: name it after the variable it initialises, if any
        names = [t for t in head[:k] if re.match(r"[A-Za-z_]", t)]
        return "<lambda %s>" % names[-1] if names else "<lambda>"
    for m in range(k, max(k - 4, -1), -1):  # operator==, operator(), operator new ...
        if head[m] == "operator":
            parts, k = head[m:open_], m - 1
            break
    else:
        k = _skip_template_args(head, k)
        if k < 0 or not re.match(r"[A-Za-z_]", head[k]):
            return "<anonymous>"
        parts, k = [head[k]], k - 1
        if k >= 0 and head[k] == "~":
            parts, k = ["~"] + parts, k - 1
    while k >= 1 and head[k] == "::":
        q = _skip_template_args(head, k - 1)
        if q < 0 or not re.match(r"[A-Za-z_]", head[q]):
            break
        parts, k = [head[q], "::"] + parts, q - 1
    return "".join(parts)


def _skip_template_args(head, k):
    """Index of the token before a template argument list ending at k (k itself when head[k] is not `>`)."""
    if head[k] != ">":
        return k
    depth = 0
    while k >= 0:
        depth += head[k] == ">"
        depth -= head[k] == "<"
        k -= 1
        if depth == 0:
            return k
    return -1


def _is_function_head(head):
    """Whether a `{` after this head (tokens since the last `;`, `{` or `}` at this scope) opens a function body."""
    if not head:
        return False
    if head[0] in CONTAINER_KEYWORDS or "namespace" in head:
        return False
    body_head = strip_trailing(head)
    if body_head[-1:] != [")"]:
        return False
    open_ = _matching_open(body_head, len(body_head) - 1)
    return open_ > 0 and body_head[open_ - 1] not in CONTROL_KEYWORDS


def find_functions(code):
    """(qualified name, first line, last line) of each function body at namespace or class scope, with lambdas at
    those scopes."""
    toks = list(tokens_with_lines(code))
    functions = []
    head = []
    # Scope stack of the containers we are in: the class's name for a class, struct or union, else None.
    k = 0
    depth_stack = []
    while k < len(toks):
        tok, line = toks[k]
        if tok == "{":
            colon = initializer_colon(head)
            in_init = colon >= 0 and head[-1:] not in ([")"], ["}"]) and head[-1:] != [] and \
                not _is_function_head(head)
            open_parens = head.count("(") - head.count(")")
            if in_init or open_parens > 0:
                # A member's brace initialiser in a constructor's initializer list, or a braced default argument
                # inside a parameter list: part of the head.
                end = _skip_braces(toks, k)
                head.append("{")
                head.append("}")
                k = end + 1
                continue
            fn_head = head[:colon] if colon >= 0 else head
            if _is_function_head(head) or (colon >= 0 and _is_function_head(fn_head)):
                end = _skip_braces(toks, k)
                name = function_name(strip_trailing(fn_head))
                classes = [c for c in depth_stack if c]
                if classes and not name.startswith("<"):
                    name = "::".join(classes + [name])
                functions.append((name, line, toks[end][1] if end < len(toks) else line))
                k = end + 1
                head = []
                continue
            depth_stack.append(_class_name(head))
            head = []
        elif tok == "}":
            head = []
            if depth_stack:
                depth_stack.pop()
        elif tok == ";":
            head = []
        else:
            head.append(tok)
        k += 1
    return functions


def _class_name(head):
    """The name a class/struct/union head declares (None for namespaces, enums, initialisers)."""
    for k, tok in enumerate(head):
        if tok in ("class", "struct", "union") and (k == 0 or head[k - 1] not in ("enum", "<", ",")):
            names = [t for t in head[k + 1:] if re.match(r"[A-Za-z_]\w*$", t) and t not in ("final", "alignas")]
            if ":" in head[k + 1:]:
                names = [t for t in head[k + 1:head.index(":", k + 1)] if re.match(r"[A-Za-z_]\w*$", t)
                         and t not in ("final",)]
            return names[-1] if names else None
    return None


def _skip_braces(toks, k):
    depth = 0
    for j in range(k, len(toks)):
        if toks[j][0] == "{":
            depth += 1
        elif toks[j][0] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def load_allowlist(path):
    entries = {}
    if path is None or not path.exists():
        return entries
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or parts[0] not in ("function", "file"):
            raise ValueError("%s:%d: expected '<function|file> <target> <reason>', got %r" % (path, number, raw))
        entries[(parts[0], parts[1])] = parts[2]
    return entries


def excluded_path(rel):
    return any(fnmatch.fnmatch("/" + rel, "*" + pattern.lstrip("*")) for pattern, _ in EXCLUDED_PATHS)


def excluded_function(rel, name):
    return any(fnmatch.fnmatch(rel, path) and fnmatch.fnmatch(name, fn) for path, fn, _ in EXCLUDED_FUNCTIONS)


def check(root, max_function, max_file):
    """(kind, target, lines) of every offender under root."""
    offenders = []
    for sub in ROOTS:
        base = root / sub
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or path.suffix not in SUFFIXES:
                continue
            rel = path.relative_to(root).as_posix()
            if excluded_path(rel):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            file_lines = len(text.splitlines())
            if file_lines > max_file:
                offenders.append(("file", rel, file_lines))
            for name, first, last in find_functions(strip_code(text)):
                length = last - first + 1
                if length > max_function and not excluded_function(rel, name):
                    offenders.append(("function", "%s:%s" % (rel, name), length, first))
    return offenders


def main(argv):
    parser = argparse.ArgumentParser(
        description="List every function over --max-function lines and every file over --max-file lines in the "
                    "library's C++ sources (%s). Exit 1 when any is over and not in the allow-list."
                    % ", ".join(ROOTS),
        epilog="Allow-list lines: 'function <path>:<name> <reason>' or 'file <path> <reason>'.")
    default_root = Path(__file__).resolve().parent.parent
    parser.add_argument("--root", type=Path, default=default_root, help="repository root (default: %(default)s)")
    parser.add_argument("--allowlist", type=Path, default=None,
                        help="allow-list file (default: <root>/scripts/lengths_allowlist.txt if it exists; "
                             "'none' for no allow-list)")
    parser.add_argument("--max-function", type=int, default=MAX_FUNCTION_LINES)
    parser.add_argument("--max-file", type=int, default=MAX_FILE_LINES)
    parser.add_argument("--all", action="store_true", help="also list allow-listed offenders")
    args = parser.parse_args(argv)
    if args.allowlist is None:
        allow_path = args.root / "scripts" / "lengths_allowlist.txt"
    elif str(args.allowlist) == "none":
        allow_path = None
    else:
        allow_path = args.allowlist
    try:
        allowed = load_allowlist(allow_path)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    offenders = check(args.root, args.max_function, args.max_file)
    used = set()
    failures = 0
    for offender in offenders:
        kind, target, length = offender[:3]
        where = "%s:%d" % (target.split(":")[0], offender[3]) if kind == "function" else target
        limit = args.max_function if kind == "function" else args.max_file
        if (kind, target) in allowed:
            used.add((kind, target))
            if args.all:
                print("allowed %s %s: %d lines (limit %d) at %s -- %s"
                      % (kind, target, length, limit, where, allowed[(kind, target)]))
            continue
        failures += 1
        print("%s %s: %d lines (limit %d) at %s" % (kind, target, length, limit, where), file=sys.stderr)
    for key in sorted(set(allowed) - used):
        print("warning: stale allow-list entry (nothing over the limit): %s %s" % key, file=sys.stderr)
    if failures:
        print("%d over the limit (functions <= %d lines, files <= %d lines)"
              % (failures, args.max_function, args.max_file), file=sys.stderr)
        return 1
    print("ok: no function over %d lines, no file over %d lines (%d allow-listed)"
          % (args.max_function, args.max_file, len(used)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
