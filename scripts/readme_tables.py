"""The README's loader and rule tables, and the schemas' kind and loader lists, rendered from the code's own tables.

    python scripts/readme_tables.py --check   # exit 1 and name what differs (tests/test_docs_match_code.py)
    python scripts/readme_tables.py --write   # rewrite them in place

Sources: the loader table `itera_verify.format.loaders.TABLE` (and its `KINDS`), the rule registry
`itera_verify.rules.all_rules()`. In README.md each table sits between `<!-- NAME:begin ... -->` and
`<!-- NAME:end -->` comments; nothing between them is written by hand. In the schemas only the two lists are
rewritten: `artifacts[].kind` in manifest.schema.json, `loader` in reload.schema.json.
"""
from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "validator"))

from itera_verify.format import loaders as table  # noqa: E402
from itera_verify.rules import all_rules  # noqa: E402

README = ROOT / "README.md"
MANIFEST_SCHEMA = ROOT / "schemas/manifest.schema.json"
RELOAD_SCHEMA = ROOT / "schemas/reload.schema.json"
SHAPES = {table.FOLDER: "a folder", table.EITHER: "a file or a folder"}


def loader_table() -> str:
    lines = ["| loader | artifact kind | its path | extra |", "|---|---|---|---|"]
    for row in table.TABLE:
        path = (row.what or row.file_form or SHAPES[row.shape]).replace("<", "&lt;").replace(">", "&gt;")
        kinds = ", ".join(f"`{kind}`" for kind in row.kinds)
        lines.append(f"| `{row.name}` | {kinds} | {path} | {f'`{row.extra}`' if row.extra else ''} |")
    return "\n".join(lines) + "\n"


COLUMNS = 3  # rules a row, read down each column in turn: the README stays near 200 lines as rules are added


def rule_table() -> str:
    """COLUMNS rules a row, read down the first column, then the next."""
    rules = list(all_rules().values())
    rows = -(-len(rules) // COLUMNS)
    cells = [f"{rule.code} | {rule.severity.value} | {rule.title}" for rule in rules]
    cells += [" | | "] * (rows * COLUMNS - len(cells))
    lines = ["|" + " code | severity | finding |" * COLUMNS, "|" + "---|---|---|" * COLUMNS]
    lines += ["| " + " | ".join(cells[column * rows + row] for column in range(COLUMNS)) + " |" for row in range(rows)]
    return "\n".join(lines) + "\n"


TABLES = {"loaders": loader_table, "rules": rule_table}
SCRIPT = "scripts/readme_tables.py"


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name}:begin[^>]*-->\n)(.*?)(<!-- {name}:end -->)", re.S)


def render_readme(text: str) -> str:
    for name, render in TABLES.items():
        if not block(name).search(text):
            raise SystemExit(f"README.md: no <!-- {name}:begin --> ... <!-- {name}:end --> markers")
        text = block(name).sub(lambda m, render=render: m.group(1) + render() + m.group(3), text)
    return text


# The two schema lists, found by the key and the array that follows it (the array holds no brackets).
ENUMS = {MANIFEST_SCHEMA: ('"kind": {"enum": ', '"resume-checkpoint"', lambda: table.KINDS),
         RELOAD_SCHEMA: ('"loader": {"enum": ', '"torch-resume"', lambda: table.NAMES)}


def render_schema(path: Path, text: str) -> str:
    key, member, values = ENUMS[path]
    pattern = re.compile(re.escape(key) + r"\[[^\]]*" + re.escape(member) + r"[^\]]*\]")
    match = pattern.search(text)
    if match is None:
        raise SystemExit(f"{path.name}: no {key}[...] list holding {member}")
    indent = match.start() - text.rfind("\n", 0, match.start()) - 1 + len(key) + 1
    body = textwrap.fill(", ".join(json.dumps(v) for v in values()), 120 - indent - 2, break_long_words=False,
                         break_on_hyphens=False)
    return text[:match.start()] + key + "[" + body.replace("\n", "\n" + " " * indent) + "]" + text[match.end():]


def schema_list(path: Path) -> list:
    schema = json.loads(path.read_text(encoding="utf-8"))
    if path == MANIFEST_SCHEMA:
        return schema["properties"]["artifacts"]["items"]["properties"]["kind"]["enum"]
    return schema["properties"]["artifacts"]["additionalProperties"]["properties"]["loader"]["enum"]


def stale() -> dict[Path, str]:
    """Each file that differs from what the code's tables render, with its rendering. A schema counts as
    differing only when its list does (its layout is left alone otherwise)."""
    out = {}
    text = README.read_text(encoding="utf-8")
    if render_readme(text) != text:
        out[README] = render_readme(text)
    for path, (_, _, values) in ENUMS.items():
        if schema_list(path) != list(values()):
            out[path] = render_schema(path, path.read_text(encoding="utf-8"))
    return out


def main(argv: list[str]) -> int:
    if argv not in (["--check"], ["--write"]):
        print(__doc__)
        return 2
    differing = stale()
    for path, text in differing.items():
        if argv == ["--write"]:
            path.write_text(text, encoding="utf-8")
            print(f"rewrote {path.relative_to(ROOT)}")
        else:
            print(f"{path.relative_to(ROOT)} differs from the code's tables: run python {SCRIPT} --write")
    return 1 if differing and argv == ["--check"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
