"""The README and docs/ say what the code does: each test compares a document with the code's own table, and
fails `make test` when a change makes them disagree. Fast: nothing is reloaded, no package is built."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = _script("readme_tables")
prose = _script("prose_stats")


# --- Tables generated from the code -----------------------------------------------------------------------------

def test_the_readme_loader_and_rule_tables_are_what_the_code_renders():
    """README.md's tables between the marker comments are scripts/readme_tables.py's rendering of
    format/loaders.TABLE and the rule registry; the schemas' kind and loader lists are the table's."""
    differing = tables.stale()
    assert not differing, f"run `python scripts/readme_tables.py --write`: {sorted(p.name for p in differing)}"


def test_a_loader_added_to_the_table_alone_is_caught_in_the_readme_and_both_schemas(monkeypatch):
    from itera_verify.format import loaders

    row = loaders.Loader("safetensors-2", "safetensors", ("safetensors-2",), loaders.FILE, "one .st2 file")
    monkeypatch.setattr(loaders, "TABLE", (*loaders.TABLE, row))
    monkeypatch.setattr(loaders, "KINDS", (*loaders.KINDS, "safetensors-2"))
    monkeypatch.setattr(loaders, "NAMES", (*loaders.NAMES, "safetensors-2"))
    differing = tables.stale()
    assert set(differing) == {tables.README, tables.MANIFEST_SCHEMA, tables.RELOAD_SCHEMA}
    # --write would give each schema the table's list and keep it valid JSON
    assert json.loads(differing[tables.MANIFEST_SCHEMA])["properties"]["artifacts"]["items"]["properties"][
        "kind"]["enum"][-1] == "safetensors-2"
    assert "| `safetensors-2` | `safetensors-2` | one .st2 file |" in differing[tables.README]


def test_the_manifest_schema_names_the_format_version_py_writes():
    from itera_verify.version import FORMAT

    schema = json.loads((ROOT / "schemas/manifest.schema.json").read_text())
    assert schema["properties"]["format"] == {"const": FORMAT}


def _markdown_table(text: str, header: str) -> list[list[str]]:
    """The rows of the first table whose header line starts with `header`, as lists of stripped cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_format_md_lists_every_loader_in_the_tables_order_with_its_kinds():
    from itera_verify.format.loaders import TABLE

    rows = _markdown_table((ROOT / "docs/format.md").read_text(), "| loader | artifact kind |")
    assert [(r[0].strip("`"), r[1].strip("`")) for r in rows] == [(row.name, ", ".join(row.kinds)) for row in TABLE]


def test_format_md_save_calls_map_each_kind_to_the_loader_the_recorder_registers():
    from itera_verify.format.loaders import recorder_default

    rows = _markdown_table((ROOT / "docs/format.md").read_text(), "| library | save call |")
    for row in rows:
        kind, loader = (part.strip(" `") for part in row[-1].split("→"))
        assert recorder_default(kind) == loader, row


# --- The README's usage block and each subcommand's --help ------------------------------------------------------

def _usage_block() -> str:
    text = README.read_text()
    section = text[text.index("\n## Usage\n"):]
    return section.split("```")[1]


OPTION = re.compile(r"(?<![\w:/-])(--?[a-z][a-z0-9-]*)")


def usage_options() -> dict[str, set[str]]:
    """The options the README's usage block shows, by subcommand.

    The block is the first fenced block under `## Usage`. A line starting `itera-verify` begins a command: its
    subcommand is the next word without brackets when it names one, else `verify` (`itera-verify OUTDIR`), and
    the group itself (`""`) for `itera-verify --version`. An indented line continues the command above it. An
    indented line `NAME: ...` defines an option group, continued by the lines indented deeper below it; a command
    that shows `[NAME]` takes the group's options. An option is a `-x` or `--xx` token; `# comments` are skipped.
    """
    subcommands = set(_main().commands)
    shown: dict[str, set[str]] = {}
    groups: dict[str, set[str]] = {}
    uses: dict[str, set[str]] = {}
    target: tuple[dict, str] | None = None
    for line in _usage_block().splitlines():
        line = line.split(" # ")[0].split("  #")[0]
        group = re.match(r"\s+([A-Z]+):", line)
        if line.startswith("itera-verify"):
            word = line.split()[1].strip("[]")
            name = word if word in subcommands else "" if word.startswith("-") else "verify"
            target = (shown, name)
        elif group:
            target = (groups, group.group(1))
            line = line[group.end():]
        if target is None or not line.strip():
            continue
        store, name = target
        store.setdefault(name, set()).update(OPTION.findall(line))
        if store is shown:
            uses.setdefault(name, set()).update(re.findall(r"\[([A-Z]+)\]", line))
    for name, used in uses.items():
        for group_name in used:
            shown[name] |= groups.get(group_name, set())  # [CODE] is an argument, not a group
    return shown


def _main() -> click.Group:
    from itera_verify.cli import main

    return main


def help_options(command: click.Command) -> list[tuple[str, ...]]:
    """Each option `--help` lists for a command, as all its names (`-o`, `--output`); `--help` itself aside."""
    return [tuple(p.opts + p.secondary_opts) for p in command.params
            if isinstance(p, click.Option) and "--help" not in p.opts]


def _linked_docs() -> str:
    targets = re.findall(r"\]\((docs/[^)#]+\.md)", README.read_text())
    return "\n".join((ROOT / target).read_text() for target in sorted(set(targets)))


def test_every_option_the_readme_shows_exists_and_every_option_of_help_is_documented():
    """Two directions, per subcommand:

    1. Every option the README's usage block shows for a subcommand is one that subcommand's `--help` lists
       (click's own option list, which `--help` prints), and every subcommand it names exists.
    2. Every subcommand that `itera-verify --help` lists has a line in the usage block, and every option of its
       `--help` appears there, under that subcommand (by any of its names), or, for an option too detailed for
       the README, as the literal `--name` in a docs/*.md file the README links to.

    A new subcommand (`assemble`) needs its line in the usage block; a new option (`--confine`) needs its place
    in the block or in a linked doc; an option renamed or removed must leave the README.
    """
    main = _main()
    shown = usage_options()
    assert set(shown) - {""} <= set(main.commands), "the usage block names a subcommand the tool lacks"
    assert set(main.commands) <= set(shown), f"subcommands missing from the usage block: {set(main.commands) - set(shown)}"
    docs = _linked_docs()
    for name, command in [("", main), *main.commands.items()]:
        names = {n for option in help_options(command) for n in option}
        assert shown.get(name, set()) <= names, f"{name or 'itera-verify'}: not in --help: {shown[name] - names}"
        missing = [option for option in help_options(command)
                   if not set(option) & shown.get(name, set()) and not any(f"`{n}" in docs or f" {n}" in docs
                                                                          for n in option if n.startswith("--"))]
        assert not missing, f"{name or 'itera-verify'} --help options shown nowhere: {missing}"


CHOICES = re.compile(r"(--[a-z][a-z0-9-]*) ([a-z0-9-]+(?:\|[a-z0-9-]+)+)")


def test_the_values_the_readme_lists_for_an_option_are_its_choices():
    """Where the usage block lists an option's values (`--format text|json|junit|github|html`), they are exactly
    the values `--help` accepts for that option, in every subcommand that has it: a new format (`sarif`) or
    device must be added to the README too."""
    main = _main()
    shown = dict(CHOICES.findall(_usage_block()))
    assert shown, "no option values found in the usage block"
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, click.Choice):
                for option in set(param.opts) & set(shown):
                    if option == "--format" and name == "push":  # push's own line lists its two
                        continue
                    assert shown[option].split("|") == list(param.type.choices), (name, option)
    push_format = next(p for p in main.commands["push"].params if "--format" in getattr(p, "opts", ()))
    assert "--format text|json" in _usage_block() and list(push_format.type.choices) == ["text", "json"]


def test_an_option_the_readme_shows_that_help_lacks_is_caught(monkeypatch):
    block = _usage_block()
    monkeypatch.setattr(sys.modules[__name__], "_usage_block", lambda: block.replace("[--reload]", "[--relaod]"))
    with pytest.raises(AssertionError, match="relaod"):
        test_every_option_the_readme_shows_exists_and_every_option_of_help_is_documented()


def test_the_version_option_says_the_package_format_it_writes_and_reads():
    from itera_verify.version import FORMAT, __version__

    result = CliRunner().invoke(_main(), ["--version"])
    assert result.exit_code == 0
    assert result.output == f"itera-verify {__version__} (package format: writes {FORMAT}, reads {FORMAT})\n"


def test_the_changelog_names_the_version_version_py_says():
    from itera_verify.version import __version__

    headings = re.findall(r"^## \[([^\]]+)\](.*)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    named = {version for version, _ in headings} | {m for _, rest in headings for m in re.findall(r"\d+\.\d+\.\d+", rest)}
    assert __version__ in named


# --- docs/architecture.md and the import contracts ---------------------------------------------------------------

def contract_allowances() -> dict[str, set[str]]:
    """What each top-level module of itera_verify may import, by pyproject.toml's [tool.importlinter] contracts:
    every module of a lower layer (siblings on one layer, `a | b`, are independent), less those a forbidden
    contract names whole for it (a forbidden submodule, `itera_verify.format.money`, leaves `format` allowed)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [layers] = [c["layers"] for c in contracts if c["type"] == "layers"]
    short = lambda dotted: dotted.removeprefix("itera_verify.")  # noqa: E731
    levels = [[short(m.strip()) for m in re.split(r"[|:]", layer)] for layer in layers]
    allowed = {m: {lower for below in levels[i + 1:] for lower in below} for i, level in enumerate(levels)
               for m in level}
    for contract in contracts:
        if contract["type"] == "forbidden":
            for source in contract["source_modules"]:
                allowed[short(source)] -= {short(m) for m in contract["forbidden_modules"] if "." not in short(m)}
    return allowed


def architecture_rows() -> dict[str, set[str]]:
    """docs/architecture.md's layer table: each folder (or module) and the names its "may import" column
    lists in backticks (`format/names.py` counts as `format`)."""
    rows = _markdown_table((ROOT / "docs/architecture.md").read_text(), "| folder")
    found = {}
    for row in rows:
        name = row[0].strip("`").removesuffix("/").removesuffix(".py")
        found[name] = {token.split("/")[0].removesuffix(".py") for token in re.findall(r"`([^`]+)`", row[-1])}
    return found


def test_the_architecture_layer_table_is_what_the_import_contracts_allow():
    documented, allowed = architecture_rows(), contract_allowances()
    assert set(documented) == set(allowed), f"folders: in the doc only {set(documented) - set(allowed)}, " \
                                            f"in the contracts only {set(allowed) - set(documented)}"
    wrong = {name: (sorted(documented[name]), sorted(allowed[name])) for name in allowed
             if documented[name] != allowed[name]}
    assert not wrong, f"(doc, contracts): {wrong}"


def test_every_folder_of_the_package_is_in_a_contract_and_the_table():
    source = ROOT / "validator/itera_verify"
    modules = {p.parent.name for p in source.glob("*/__init__.py")} | {"model", "options", "version"}
    assert modules == set(contract_allowances()) == set(architecture_rows())


def test_a_may_import_cell_that_lists_too_much_is_caught(monkeypatch):
    rows = architecture_rows()
    rows["record"] = rows["record"] | {"reload"}
    monkeypatch.setattr(sys.modules[__name__], "architecture_rows", lambda: rows)
    with pytest.raises(AssertionError, match="record"):
        test_the_architecture_layer_table_is_what_the_import_contracts_allow()


# --- Plain prose --------------------------------------------------------------------------------------------------

README_MAX_LINES = 200
README_MAX_AVERAGE, README_MAX_SENTENCE = 18, 40
DOCS_MAX_AVERAGE = 22


def test_the_readme_is_short_and_plain():
    """At most 200 lines; sentences of at most 18 words on average and none over 40, counted as
    scripts/prose_stats.py says (prose only: code blocks, tables, headings and link targets are left out)."""
    text = README.read_text()
    stats = prose.stats(text)
    assert len(text.splitlines()) <= README_MAX_LINES
    assert stats["average"] <= README_MAX_AVERAGE, stats
    long = [s for s in prose.sentences(text) if prose.words(s) > README_MAX_SENTENCE]
    assert not long, long


@pytest.mark.parametrize("path", [*DOCS, ROOT / "benchmarks/README.md"], ids=lambda p: p.name)
def test_each_doc_is_plain(path):
    """docs/*.md and benchmarks/README.md: sentences of at most 22 words on average."""
    stats = prose.stats(path.read_text())
    assert stats["average"] <= DOCS_MAX_AVERAGE, stats


def test_sentences_are_counted_as_the_docstring_says():
    text = ("# Title\n\nOne two three. Four five, e.g. six seven!\n\n| a | b c d |\n\n```\nnot. prose. here\n```\n"
            "- an item `with. code` and [a link](http://x.y/z.html)\n- next: still one; sentence\n")
    assert [prose.words(s) for s in prose.sentences(text)] == [3, 5, 6, 4]


# --- Links and references -----------------------------------------------------------------------------------------

PUBLISHED = [README, *DOCS, ROOT / "benchmarks/README.md", ROOT / "CHANGELOG.md"]


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_no_doc_points_outside_the_repository(path):
    """The product contract and field notes are not in the repository: a doc cites the repository's own docs."""
    text = path.read_text()
    assert not re.search(r"SPEC|§|\.\./shared|FIELD-NOTES", text), re.findall(r".{30}(?:SPEC|§|shared).{20}", text)


# Built in two parts, so that this file does not hold what it looks for.
CONTRACT_CITATIONS = ("SPEC " + "\u00a7", "SPEC" + ".md")
CITATION_SCAN = ["validator", "tests", "fixtures", "schemas", "scripts", "benchmarks", "docs"]


def _citing_the_contract(root: Path, folders: list[str], files: list[str]) -> list[str]:
    """The text files under `folders` (and `files`) that cite the product contract, which is not in the repository."""
    paths = [*(path for folder in folders for path in sorted((root / folder).rglob("*"))), *(root / f for f in files)]
    found = []
    for path in paths:
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # not text: a fixture's weights, an archive
        if any(needle in text for needle in CONTRACT_CITATIONS):
            found.append(str(path.relative_to(root)))
    return found


def test_no_code_test_or_doc_cites_the_product_contract():
    """Code, tests and docs cite the repository's own docs (docs/format.md, docs/record.md, ...), never the
    contract they were written from."""
    assert _citing_the_contract(ROOT, CITATION_SCAN, ["README.md"]) == []


def test_a_comment_citing_the_contract_is_found(tmp_path):
    (tmp_path / "validator" / "seal").mkdir(parents=True)
    (tmp_path / "validator" / "seal" / "rate.py").write_text(f'"""The rate ({CONTRACT_CITATIONS[0]}7)."""\n')
    (tmp_path / "validator" / "seal" / "clean.py").write_text('"""The rate (docs/record.md, Campaign time)."""\n')
    (tmp_path / "README.md").write_text(f"See {CONTRACT_CITATIONS[1]}.\n")
    assert _citing_the_contract(tmp_path, CITATION_SCAN, ["README.md"]) == ["validator/seal/rate.py", "README.md"]


def _figures():
    spec = importlib.util.spec_from_file_location("figures", ROOT / "scripts" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", _figures().DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_speed_figures_are_rendered_from_the_newest_benchmark_results(path):
    """Every generated figures block is what scripts/figures.py renders from benchmarks/results/ now."""
    text = path.read_text(encoding="utf-8")
    assert _figures().render(text) == text, f"{path.name}: run python scripts/figures.py --write"


def test_a_stale_figure_is_found():
    figures = _figures()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    stale = text.replace("<!-- figures:speed:end -->", "| an old row | 1 s | 2 s | 0.50 |\n<!-- figures:speed:end -->")
    assert stale != text and figures.render(stale) == figures.render(text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation but `-` and `_` dropped, spaces as `-`."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_a_heading(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{path.name}: {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{path.name}: {target}"


def test_the_reload_schemas_dtypes_are_the_loaders_dtypes():
    """reload.json's `dtype`: the schema accepts exactly the names the reload understands (format/loaders.py),
    and "auto"; a name one accepts and the other refuses would be IV105 on a loadable entry, or the reverse."""
    from itera_verify.format.loaders import DTYPES

    schema = json.loads((ROOT / "schemas/reload.schema.json").read_text())
    enum = schema["properties"]["artifacts"]["additionalProperties"]["properties"]["dtype"]["enum"]
    assert sorted(enum) == sorted(["auto", *DTYPES])


def test_make_fuzz_rewrites_only_its_block_of_the_survival_table():
    """docs/survival.md holds notes written by hand (the red team rounds, what each loader admits) around the
    block `make fuzz` generates: a run replaces the block and keeps every note."""
    from tests.fuzz_all import BLOCK_BEGIN, BLOCK_END, with_block

    document = (ROOT / "docs/survival.md").read_text()
    assert document.count(BLOCK_BEGIN) == 1 and document.count(BLOCK_END) == 1
    rewritten = with_block(document, "| reader fuzzed | inputs tried |\n|---|---|")
    outside = document[:document.index(BLOCK_BEGIN)] + document[document.index(BLOCK_END):]
    assert rewritten[:rewritten.index(BLOCK_BEGIN)] + rewritten[rewritten.index(BLOCK_END):] == outside
    assert "| reader fuzzed | inputs tried |" in rewritten and "## What each loader admits" in rewritten
    assert with_block("", "x").startswith("## Survival table")
