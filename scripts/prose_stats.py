"""How long the sentences of a Markdown file are: `python scripts/prose_stats.py README.md docs/*.md`.

tests/test_docs_match_code.py holds the README and docs/ to limits with these same functions. What counts:

- Prose only. Fenced code blocks, table rows (lines starting with `|`), headings (`#`), HTML comments and
  indented code are dropped. A link counts as its text; its target is dropped.
- An inline code span (`like this`) is one word, whatever it holds: a command or a JSON record is read as one
  thing, and its dots do not end a sentence.
- A sentence ends at `.`, `!` or `?` followed by a space and then anything but a lowercase letter ("e.g. a"
  goes on); at the end of a paragraph; and at the end of a list item. A colon or a semicolon does not end one.
- A word is a run of characters between spaces holding at least one letter or digit.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
COMMENT = re.compile(r"<!--.*?-->", re.S)
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
END = re.compile(r"(?<=[.!?])[\"')\]*_]*\s+(?=[^a-z\s])")
WORD = re.compile(r"[A-Za-z0-9]")


def prose_blocks(markdown: str) -> list[str]:
    """The paragraphs and list items of a Markdown text, each on one line, code spans as one token."""
    text = COMMENT.sub("", markdown)
    blocks: list[str] = []
    current: list[str] = []
    fenced = False

    def close() -> None:
        if current:
            blocks.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            close()
            continue
        stripped = line.strip()
        if fenced or not stripped or stripped.startswith(("|", "#")) or line.startswith("    ") and not current:
            close()
            continue
        if LIST_ITEM.match(line):
            close()
            line = LIST_ITEM.sub("", line)
        current.append(line.strip())
    close()
    return [LINK.sub(r"\1", CODE_SPAN.sub("CODE", block)) for block in blocks]


def sentences(markdown: str) -> list[str]:
    found = []
    for block in prose_blocks(markdown):
        found += [s.strip() for s in END.split(block) if words(s)]
    return found


def words(sentence: str) -> int:
    return sum(1 for token in sentence.split() if WORD.search(token))


def stats(markdown: str) -> dict:
    counts = [words(s) for s in sentences(markdown)]
    return {"sentences": len(counts), "words": sum(counts),
            "average": sum(counts) / len(counts) if counts else 0.0, "longest": max(counts, default=0)}


def main(paths: list[str]) -> int:
    for path in paths:
        text = Path(path).read_text(encoding="utf-8")
        s = stats(text)
        print(f"{path}: {len(text.splitlines())} lines, {s['sentences']} sentences, {s['words']} words, "
              f"average {s['average']:.1f}, longest {s['longest']}")
        if "-v" in sys.argv:
            for sentence in sentences(text):
                if words(sentence) > 30:
                    print(f"  [{words(sentence)}] {sentence}")
    return 0


if __name__ == "__main__":
    sys.exit(main([a for a in sys.argv[1:] if a != "-v"]))
