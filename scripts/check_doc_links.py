#!/usr/bin/env python3
"""Checks the documentation's shape: every relative link in README.md and docs/*.md resolves to a file or folder of
the repository (and a #fragment into a Markdown file names one of its headings), and every docs/*.md page has at
most 300 lines (docs/measurements/ holds history and is exempt from the length rule, not from the link check of the
pages that link into it).

usage: scripts/check_doc_links.py [REPO_ROOT]   (default: this script's parent's parent)
Exit status 0 when everything holds, 1 with one line per problem on stderr otherwise."""

import re
import sys
from pathlib import Path

MAX_LINES = 300
# [text](target) and [text]: target reference definitions; images too. Code spans are removed first.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
CODE_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def github_anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(md_path):
    anchors, seen = set(), {}
    text = CODE_FENCE.sub("", md_path.read_text(encoding="utf-8"))
    for match in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        base = github_anchor(match.group(1))
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return anchors


def links_of(md_path):
    text = CODE_FENCE.sub("", md_path.read_text(encoding="utf-8"))
    text = CODE_SPAN.sub("", text)
    return INLINE_LINK.findall(text) + REF_DEF.findall(text)


def check_link(page, target, root):
    """Returns a problem description, or None when the link resolves (external links are not checked)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    path_part, _, fragment = target.partition("#")
    dest = page if not path_part else (page.parent / path_part).resolve()
    if not dest.exists():
        return f"{page.relative_to(root)}: link '{target}' names {path_part}, which does not exist"
    try:
        dest.relative_to(root)
    except ValueError:
        return f"{page.relative_to(root)}: link '{target}' leaves the repository"
    if fragment and dest.suffix == ".md" and fragment not in anchors_of(dest):
        return f"{page.relative_to(root)}: link '{target}': no heading with anchor #{fragment} in {dest.name}"
    return None


def main(argv):
    root = Path(argv[1]).resolve() if len(argv) > 1 else Path(__file__).resolve().parent.parent
    pages = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    problems = []
    for page in pages:
        for target in links_of(page):
            problem = check_link(page, target, root)
            if problem:
                problems.append(problem)
        if page.parent.name == "docs":
            lines = len(page.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                problems.append(f"{page.relative_to(root)}: {lines} lines (at most {MAX_LINES})")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"check_doc_links: {len(pages)} pages, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
