"""The run context (issue 24 item 2): discovery returns an immutable inventory, one documents object reads the
package's bytes for the checks, and every rule family is check(ctx)."""
from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from itera_verify.package import Documents, FileEntry, Inventory, RunContext, discover
from itera_verify.rules import families
from tests.helpers import context

RULES_DIR = Path(__file__).resolve().parents[1] / "validator" / "itera_verify" / "rules"


def _tiny(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_text('{"a": 1}')
    (tmp_path / "manifest.json").write_text('{"campaign_id": "c"}')
    (tmp_path / "link").symlink_to("sub/a.json")
    return tmp_path


def test_discovery_returns_an_inventory_nothing_can_change(tmp_path):
    inventory = discover(_tiny(tmp_path))
    assert isinstance(inventory, Inventory)
    assert set(inventory.files) == {"manifest.json", "sub/a.json"} and inventory.dirs == {"sub"}
    assert set(inventory.links) == {"link"}
    entry = inventory.files["sub/a.json"]
    with pytest.raises(TypeError):
        inventory.files["planted.bin"] = entry  # type: ignore[index]
    with pytest.raises(TypeError):
        del inventory.files["sub/a.json"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        inventory.links["other"] = inventory.links["link"]  # type: ignore[index]
    with pytest.raises(TypeError):
        inventory.specials["fifo"] = "fifo"  # type: ignore[index]
    with pytest.raises(AttributeError):
        inventory.dirs.add("planted")  # type: ignore[attr-defined]
    for name in ("root", "files", "links", "dirs", "specials"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(inventory, name, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.size = 0  # type: ignore[misc]
    assert set(inventory.files) == {"manifest.json", "sub/a.json"} and inventory.dirs == {"sub"}


def test_an_inventory_built_from_plain_containers_is_frozen_too(tmp_path):
    """Whoever builds one (a test, a later step) gets read-only views, not the dicts it passed."""
    files = {"x": FileEntry("x", 1, 0, 0, 0)}
    inventory = Inventory(tmp_path, files=files, dirs={"d"})
    files["y"] = FileEntry("y", 1, 0, 0, 0)  # the caller's dict changes; the inventory does not
    assert set(inventory.files) == {"x"}
    with pytest.raises(TypeError):
        inventory.files["z"] = files["y"]  # type: ignore[index]
    assert isinstance(inventory.dirs, frozenset)


def test_the_context_reads_documents_through_one_reader_whose_caches_travel_by_one_export(tmp_path):
    ctx = context(_tiny(tmp_path))
    assert isinstance(ctx.documents, Documents) and ctx.documents.inventory is ctx.inventory
    assert ctx.documents.manifest == {"campaign_id": "c"}
    assert ctx.documents.document("sub/a.json").value == {"a": 1}
    assert ctx.documents.document("missing.json") is None
    digest = ctx.documents.sha256("sub/a.json")
    child = RunContext(ctx.inventory, ctx.options)  # what a forked check process computes, in its own reader
    child.documents.sha256("manifest.json")
    ctx.documents.merge_caches(child.documents.export_caches())
    assert ctx.documents.digests == {"sub/a.json": digest, "manifest.json": child.documents.digests["manifest.json"]}
    with pytest.raises(KeyError):
        ctx.documents.cache("undeclared")


def test_every_rule_family_takes_the_context():
    for module in families():
        first = next(iter(inspect.signature(module.check).parameters))
        assert first == "ctx", f"{module.__name__}.check({first}, ...): a rule receives the run context"


# What opens, stats or reads a file by name. A rule family reads a package file only through ctx.documents
# (its open(), read_bytes(), document(), safetensors_header(), ...), and names one on disk only through
# ctx.documents.path(), never the inventory's abspath()/os_path().
OPENERS = {"open", "open_binary", "read_safetensors_header", "read_json_file", "fdopen", "read_bytes", "read_text",
           "iter_lines", "ZipFile", "mmap", "memmap", "safe_open", "load", "scandir", "listdir"}
PATH_MAKERS = {"abspath", "os_path"}
# Readers that open what they are handed by name: the tensor payload reader (_tensors.py: package weights named by
# ctx.documents.path(), and the reference weights in the Hugging Face cache), and untrained.py's reading of that
# cache (refs/<revision>, a snapshot's weight index). Each is listed with the names it may call.
ALLOWED = {
    "_tensors.py": {"open_binary", "read_safetensors_header"},
    "untrained.py": {"read_text", "read_json_file"},
    "tokenizer_fit.py": {"read_json_file"},  # the adapter's base config.json in the hub cache
}


def _through_documents(node: ast.AST) -> bool:
    """`ctx.documents.<name>(...)` or `<anything>.documents.<name>(...)`."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
        and node.value.attr == "documents"


def _readers_outside_documents(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in OPENERS and not _through_documents(func):
                found.append((node.lineno, name))
        if isinstance(node, ast.Attribute) and node.attr in PATH_MAKERS:
            found.append((node.lineno, node.attr))
    return found


def test_no_rule_family_reads_a_package_file_except_through_ctx_documents():
    offences = []
    for path in sorted(RULES_DIR.glob("*.py")):
        allowed = ALLOWED.get(path.name, set())
        offences += [f"{path.name}:{line}: {name}" for line, name in _readers_outside_documents(path.read_text())
                     if name not in allowed]
    assert not offences, "rules read files without ctx.documents:\n" + "\n".join(offences)


def test_the_reader_check_sees_what_it_forbids():
    """The check itself can fail: each way a rule used to read a package file directly is caught."""
    before = [
        'with open_binary(ctx.inventory.abspath(rel)) as fh: pass',
        'with open(ctx.inventory.os_path(rel), "rb") as stream: pass',
        'header = read_safetensors_header(path, unreadable_is_none=False)',
        'data = Path(p).read_bytes()',
        'fd = os.open(p, 0)',
    ]
    for line in before:
        assert _readers_outside_documents(line), line
    after = 'with ctx.documents.open(rel) as fh: ctx.documents.read_bytes(rel); ctx.documents.path(rel)'
    assert not _readers_outside_documents(after)
