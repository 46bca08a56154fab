"""IV201–IV206 on the real example package: one planted defect per test."""
from __future__ import annotations

import json
import os

import pytest

from fixtures.edit import edit_json, edit_manifest, load_json, refresh_hashes, write_text
from tests.helpers import static_findings, context


def only(findings, code):
    return [f for f in findings if f.code == code]


def first_params(package_dir):
    return load_json(package_dir, "manifest.json")["runs"][0]["params"]


def test_clean_package_has_no_path_findings(package_dir):
    assert not [f for f in static_findings(package_dir) if f.code.startswith("IV2")]


@pytest.mark.parametrize("value", ["/tmp/run3", "/var/tmp/x/ckpt", "/dev/shm/cache", "/run/user/1000/out",
                                   "/private/var/folders/ab/T/x", "/var/folders/ab/T/x", "/tmp",
                                   "C:\\Users\\me\\AppData\\Local\\Temp\\run3", "file:///tmp/run3/model"])
def test_output_dir_in_a_temporary_directory_is_IV201(package_dir, value):
    rel = first_params(package_dir)
    edit_json(package_dir, rel, lambda p: p.__setitem__("output_dir", value))
    refresh_hashes(package_dir)
    found = only(static_findings(package_dir), "IV201")
    assert [(f.path, f.pointer) for f in found] == [(rel, "/output_dir")]
    assert found[0].line is not None


@pytest.mark.parametrize("value", ["runs/tmp/3", "s3://bucket/tmp/run3", "/tmpfs-notes", "my/var/tmp/x"])
def test_paths_that_only_look_temporary_are_not_IV201(package_dir, value):
    rel = first_params(package_dir)
    edit_json(package_dir, rel, lambda p: p.__setitem__("note", value))
    refresh_hashes(package_dir)
    assert not only(static_findings(package_dir), "IV201")


def test_the_current_TMPDIR_is_a_temporary_directory(package_dir, monkeypatch):
    monkeypatch.setenv("TMPDIR", "/scratch/job-42")
    rel = first_params(package_dir)
    edit_json(package_dir, rel, lambda p: p.__setitem__("cache_dir", "/scratch/job-42/hf"))
    refresh_hashes(package_dir)
    assert [f.pointer for f in only(static_findings(package_dir), "IV201")] == ["/cache_dir"]


def test_the_TMPDIR_that_counts_is_the_runs_snapshot_not_a_later_change(package_dir, monkeypatch):
    from itera_verify.rules import Selection
    from itera_verify.flows.checks import run_checks
    from itera_verify.runtime.environment import Environment

    monkeypatch.delenv("TMPDIR", raising=False)
    rel = first_params(package_dir)
    edit_json(package_dir, rel, lambda p: p.__setitem__("cache_dir", "/scratch/job-7/hf"))
    refresh_hashes(package_dir)
    ctx = context(package_dir, environment=Environment.read({"TMPDIR": "/scratch/job-7/"}))
    monkeypatch.setenv("TMPDIR", "/elsewhere")  # read after the entry point: not this run's setting
    found = only(run_checks(ctx, Selection(), "static"), "IV201")
    assert [f.pointer for f in found] == ["/cache_dir"]


def test_tmp_path_in_a_text_file_has_its_line(package_dir):
    rel = load_json(package_dir, "manifest.json")["decision"]["error_analysis"]
    text = (package_dir / rel).read_text()
    (package_dir / rel).write_text(text + "\nLogs were in /var/tmp/logs/run.txt during the pilot.\n")
    found = only(static_findings(package_dir), "IV201")
    assert [(f.path, f.line) for f in found] == [(rel, text.count("\n") + 2)]


@pytest.mark.parametrize("block", [64, 200, 4096])
def test_tmp_paths_in_a_text_file_read_in_many_blocks_have_their_lines_and_columns(package_dir, monkeypatch, block):
    """Lines are counted only when a block holds a match: the numbers must still be those of the whole file."""
    from itera_verify.rules import _paths_search

    monkeypatch.setattr(_paths_search, "BLOCK", block)
    rel = load_json(package_dir, "manifest.json")["decision"]["error_analysis"]
    lines = (package_dir / rel).read_text().splitlines() + [f"filler line {i}" for i in range(150)]
    for number in (3, 40, 41, 97):
        lines[number - 1:number - 1] = [f"{'x' * (number % 7)} see /tmp/run{number}/log"]
    (package_dir / rel).write_text("\n".join(lines) + "\n")
    expected = [(i + 1, line.index("/") + 1) for i, line in enumerate(lines) if "/tmp/" in line]
    found = [f for f in only(static_findings(package_dir), "IV201") if f.path == rel and f.line]
    assert [(f.line, f.column) for f in found] == expected and len(expected) == 4


def test_tmp_path_in_adapter_config_is_IV201(package_dir):
    edit_json(package_dir, "artifacts/lora-r16/adapter_config.json",
              lambda c: c.__setitem__("base_model_name_or_path", "/dev/shm/base"))
    found = only(static_findings(package_dir), "IV201")
    assert [(f.path, f.pointer) for f in found] == [("artifacts/lora-r16/adapter_config.json",
                                                     "/base_model_name_or_path")]


def test_tmp_path_in_yaml_value_is_IV201(package_dir):
    write_text(package_dir, "analysis/train.yaml", "trainer:\n  output_dir: /tmp/out\n")
    found = only(static_findings(package_dir), "IV201")
    assert [(f.path, f.pointer) for f in found] == [("analysis/train.yaml", "/trainer/output_dir")]


def test_tmp_path_in_safetensors_metadata_is_IV201(package_dir):
    from fixtures.artifacts import write_safetensors
    import torch

    write_safetensors(package_dir / "artifacts" / "extra.safetensors", {"w": torch.ones(2)},
                      metadata={"source": "/tmp/export/w.bin"})
    found = only(static_findings(package_dir), "IV201")
    assert [(f.path, f.pointer) for f in found] == [("artifacts/extra.safetensors", "/__metadata__/source")]


def test_tmp_path_pickled_in_training_args_is_IV201(package_dir):
    import pickle

    (package_dir / "checkpoints" / "control" / "notes.pkl").write_bytes(
        pickle.dumps({"output_dir": "/tmp/trainer-out/checkpoint-4"}))
    found = only(static_findings(package_dir), "IV201")
    assert [f.path for f in found] == ["checkpoints/control/notes.pkl"]
    assert "/tmp/trainer-out" in found[0].message


def test_extra_tmp_pattern_from_configuration(package_dir):
    from itera_verify.rules import Selection
    from itera_verify.flows.checks import run_checks

    rel = first_params(package_dir)
    edit_json(package_dir, rel, lambda p: p.__setitem__("cache_dir", "/mnt/ephemeral/hf"))
    refresh_hashes(package_dir)
    package = context(package_dir, tmp_patterns=("/mnt/ephemeral",))
    assert [f.code for f in run_checks(package, Selection(select=("IV201",)))] == ["IV201"]


def test_absolute_path_outside_the_package_is_IV202_warning(package_dir):
    rel = first_params(package_dir)
    edit_json(package_dir, rel, lambda p: p.__setitem__("dataset_path", "/home/alice/data/reviews"))
    refresh_hashes(package_dir)
    found = only(static_findings(package_dir), "IV202")
    assert [f.pointer for f in found] == ["/dataset_path"]
    assert found[0].severity.value == "warning"


def test_absolute_path_inside_the_package_is_not_IV202(package_dir):
    rel = first_params(package_dir)
    inside = os.path.realpath(package_dir / "corpus")
    edit_json(package_dir, rel, lambda p: p.__setitem__("corpus_dir", inside + "/eval_ids.txt"))
    refresh_hashes(package_dir)
    assert not only(static_findings(package_dir), "IV202")


def test_symlink_leaving_the_package_is_IV203(package_dir, tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x")
    os.symlink(outside, package_dir / "artifacts" / "shared.bin")
    assert [f.path for f in only(static_findings(package_dir), "IV203")] == ["artifacts/shared.bin"]


def test_symlink_into_tmp_says_so(package_dir):
    os.symlink("/tmp", package_dir / "artifacts" / "scratch")
    found = only(static_findings(package_dir), "IV203")
    assert len(found) == 1 and "temporary directory" in found[0].message


def test_symlink_inside_the_package_is_fine(package_dir):
    os.symlink("control-model", package_dir / "artifacts" / "latest")
    os.symlink("../corpus/eval_ids.txt", package_dir / "analysis" / "ids.txt")
    found = static_findings(package_dir)
    assert not only(found, "IV203") and not only(found, "IV204")


def test_broken_symlink_is_IV204(package_dir):
    os.symlink("checkpoint-900", package_dir / "checkpoints" / "control" / "best")
    assert [f.path for f in only(static_findings(package_dir), "IV204")] == ["checkpoints/control/best"]


def link_chain(folder, length: int, end: str | None = "end.txt") -> None:
    """`length` links in `folder`, 0000 -> 0001 -> ... -> the last, which points at `end` (a file written there)."""
    folder.mkdir(parents=True)
    for i in range(length):
        os.symlink(f"{i + 1:04d}" if i + 1 < length else end, folder / f"{i:04d}")
    if end is not None:
        (folder / end).write_text("end\n")


def test_a_chain_of_40_links_resolves_as_the_kernel_follows_it(package_dir):
    link_chain(package_dir / "analysis" / "chain", 40)
    found = static_findings(package_dir)
    assert not only(found, "IV204") and not only(found, "IV203")


def test_a_chain_of_41_links_is_IV204_too_many_levels_of_links(package_dir):
    link_chain(package_dir / "analysis" / "chain", 41)
    found = only(static_findings(package_dir), "IV204")
    assert [f.path for f in found] == ["analysis/chain/0000"]  # the others need 40 links or fewer
    assert "too many levels of links" in found[0].message


def test_a_loop_of_links_is_IV204_too_many_levels_of_links(package_dir):
    os.symlink("b", package_dir / "analysis" / "a")
    os.symlink("a", package_dir / "analysis" / "b")
    found = only(static_findings(package_dir), "IV204")
    assert [f.path for f in found] == ["analysis/a", "analysis/b"]
    assert all("too many levels of links" in f.message for f in found)


@pytest.mark.slow
def test_a_chain_of_3000_links_is_checked_in_time_linear_in_its_length(package_dir):
    """Python 3.11's os.path.realpath recursed once per link (RecursionError at 1,500) and walked the rest of the
    chain for each link (3,000 links: 4.5 million look-ups)."""
    import time

    link_chain(package_dir / "analysis" / "chain", 3000)
    started = time.monotonic()
    found = only(static_findings(package_dir), "IV204")
    assert len(found) == 3000 - 40 and time.monotonic() - started < 30


def test_two_files_differing_only_in_case_are_IV206(package_dir):
    weights = package_dir / "artifacts" / "control-model" / "model.safetensors"
    (weights.parent / "Model.safetensors").write_bytes(weights.read_bytes())
    found = only(static_findings(package_dir), "IV206")
    assert [f.path for f in found] == ["artifacts/control-model/model.safetensors"]
    assert "artifacts/control-model/Model.safetensors" in found[0].message


def test_two_names_differing_only_in_unicode_normalisation_are_IV206(package_dir):
    write_text(package_dir, "analysis/r\u00e9sum\u00e9.md", "composed\n")  # é as one character
    write_text(package_dir, "analysis/re\u0301sume\u0301.md", "decomposed\n")  # e + combining accent
    assert len(only(static_findings(package_dir), "IV206")) == 1


def test_a_folder_named_seal_in_lower_case_is_IV206_beside_the_archives_SEAL(package_dir):
    write_text(package_dir, "seal/notes.md", "x\n")
    found = only(static_findings(package_dir), "IV206")
    assert [f.path for f in found] == ["seal"] and "the folder the sealed archive adds" in found[0].message


def test_two_folders_differing_only_in_case_are_IV206(package_dir):
    write_text(package_dir, "analysis/Plots/a.md", "a\n")
    write_text(package_dir, "analysis/plots/b.md", "b\n")
    assert [f.path for f in only(static_findings(package_dir), "IV206")] == ["analysis/plots"]


@pytest.mark.parametrize("value", ["../params/control.json", "/etc/passwd", "params/../../x.json"])
def test_reference_escaping_the_package_is_IV205(package_dir, value):
    edit_manifest(package_dir, lambda m: m["runs"][0].__setitem__("params", value))
    found = static_findings(package_dir)
    assert [f.pointer for f in only(found, "IV205")] == ["/runs/0/params"]
    assert not only(found, "IV101"), "an escaping reference is IV205 only"


def test_reference_with_harmless_dot_dot_stays_inside(package_dir):
    rel = first_params(package_dir)
    edit_manifest(package_dir, lambda m: m["runs"][0].__setitem__("params", "metrics/../" + rel))
    assert not only(static_findings(package_dir), "IV205")


def test_a_safetensors_file_that_cannot_be_read_is_exit_2_even_without_reload(package_dir, monkeypatch):
    """Its header is read for metadata paths: a read failure is unreadable input, never a silent pass."""
    from itera_verify.model import UsageError
    from itera_verify.package import files  # the one safetensors header reader opens it there

    real_open = files.open_binary

    def refusing_open(path):
        if str(path).endswith("control-model/model.safetensors"):
            raise PermissionError(13, "Permission denied")
        return real_open(path)

    monkeypatch.setattr(files, "open_binary", refusing_open)
    with pytest.raises(UsageError, match="artifacts/control-model/model.safetensors: cannot read"):
        static_findings(package_dir)


# ---- a line longer than LONG_LINE is searched in overlapping windows, never held whole ------------------------

def _text_file_findings(folder, content: bytes, rel: str = "train.log"):
    """(line, column, message) of the IV201 findings in one text file: a package holding nothing else."""
    from itera_verify.rules import paths

    folder.mkdir(exist_ok=True)
    (folder / rel).write_bytes(content)
    return [(f.line, f.column, f.message) for f in paths.check(context(folder)) if f.code == "IV201"]


def test_tmp_paths_on_a_line_longer_than_the_bound_have_their_lines_and_columns(package_dir, monkeypatch):
    from itera_verify.rules import _paths_search

    monkeypatch.setattr(_paths_search, "BLOCK", 64 << 10)
    monkeypatch.setattr(_paths_search, "LONG_LINE", 256 << 10)
    lines = [b"first line",
             b"x" * 3_000_000 + b" /tmp/run-a/out " + b"y" * 500_000 + b" /var/tmp/second-on-the-line",
             b"z" * 100 + b" /dev/shm/cache",
             b"w" * 700_000 + b" /tmp/near-the-end\r"]  # its match lies in the piece that ends the line, CRLF
    (package_dir / "analysis" / "train.log").write_bytes(b"\n".join(lines))
    found = [f for f in only(static_findings(package_dir), "IV201") if f.path == "analysis/train.log"]
    assert [(f.line, f.column) for f in found] == [(2, 3_000_002), (3, 102), (4, 700_002)]
    snippet = "x" * 19 + " /tmp/run-a/out " + "y" * 45  # 20 bytes before the match, 60 from its start
    assert found[0].message == f"temporary-directory path in text: …{snippet}…"
    assert found[2].message.endswith(" /tmp/near-the-end…")


@pytest.mark.slow
def test_a_match_across_a_window_boundary_of_a_long_line_is_found_once(tmp_path, monkeypatch):
    """Every start around the first two window ends and their overlaps: the same findings as a whole-line search
    (look-behind and look-ahead across the boundary included), one per line."""
    from itera_verify.rules import _paths_search

    monkeypatch.delenv("TMPDIR", raising=False)
    block, bound = 4096, 16384  # the line opens the file: windows end at every multiple of `bound`
    monkeypatch.setattr(_paths_search, "BLOCK", block)
    needles = {b" /tmp/run-1": True, b"x/tmp/run-1": False, b" /tmpx/run-1": False,
               b" \\AppData\\Local\\Temp\\x": True}  # the longest match there is: 22 bytes
    for start in [*range(bound - 90, bound + 5), *range(2 * bound - 90, 2 * bound + 5)]:
        for needle, matches in needles.items():
            content = b"=" * start + needle + b"=" * (bound + 100) + b"\nafter /var/tmp/z\n"
            monkeypatch.setattr(_paths_search, "LONG_LINE", bound)
            windowed = _text_file_findings(tmp_path / "windowed", content)
            monkeypatch.setattr(_paths_search, "LONG_LINE", 1 << 40)
            assert windowed == _text_file_findings(tmp_path / "whole", content), (start, needle)
            expected = [(1, start + 2)] * matches + [(2, 7)]
            assert [(line, column) for line, column, _ in windowed] == expected, (start, needle)


def test_a_file_without_a_newline_is_searched_in_bounded_memory(tmp_path, monkeypatch):
    """A 32 MiB file on one line: memory stays a few times block + bound, not the file (held whole and copied
    on every read, it took twice the file)."""
    import tracemalloc

    from itera_verify.rules import _paths_search, paths

    monkeypatch.setattr(_paths_search, "BLOCK", 1 << 20)
    monkeypatch.setattr(_paths_search, "LONG_LINE", 1 << 20)
    head = (b'{"id": "ex/1", "p": 0.5} ' * (2 << 20))[:32 << 20]
    (tmp_path / "one-line.jsonl").write_bytes(head + b" /tmp/at-the-end")
    package = context(tmp_path)
    tracemalloc.start()
    try:
        found = list(paths.check(package))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(f.code, f.line, f.column) for f in found] == [("IV201", 1, len(head) + 2)]
    assert peak < 4 * (_paths_search.BLOCK + _paths_search.LONG_LINE), f"peak {peak} bytes for a {len(head)}-byte line"


def test_a_long_line_that_ends_the_file_on_a_window_end_is_searched_to_its_end(tmp_path, monkeypatch):
    """No newline, and the file ends just where a window does: the line's last bytes are still searched."""
    from itera_verify.rules import _paths_search

    monkeypatch.setattr(_paths_search, "BLOCK", 4096)
    monkeypatch.setattr(_paths_search, "LONG_LINE", 16384)
    content = (b"=" * (2 * 16384 - 12) + b" /tmp/x/y").ljust(2 * 16384, b"=")
    assert [(line, column) for line, column, _ in _text_file_findings(tmp_path, content)] == [(1, 2 * 16384 - 10)]


# ---- documents looked at before they are parsed ------------------------------------------------------------------
def test_paths_alone_parses_only_documents_that_could_hold_a_path_and_misses_none(package_dir):
    """In a process of its own (a big package's split checks), the path rules read a JSON document's bytes and
    parse it only when it holds a character every reportable path needs. A path hidden behind \\u escapes, and
    a configured pattern without any slash, are still found; the findings equal those of one process."""
    from itera_verify.rules import Selection, paths
    from itera_verify.flows.checks import run_checks

    notes = package_dir / "analysis"
    (notes / "plain.json").write_text(json.dumps({"id": "ex-1", "tokens": ["w1", "w2"]}))
    (notes / "escaped.json").write_text('{"output_dir": "\\u002ftmp\\u002frun3"}')
    (notes / "pattern.json").write_text(json.dumps({"cache": "~scratchspace"}))
    package = context(package_dir, tmp_patterns=("~scratchspace",))
    found = [(f.code, f.path) for f in paths.check(package) if f.path.startswith("analysis/")]
    assert ("IV201", "analysis/escaped.json") in found and ("IV201", "analysis/pattern.json") in found
    assert package.documents.parsed("analysis/plain.json") is None  # no "/", "\\" or pattern lead: never parsed
    assert package.documents.parsed("analysis/escaped.json") is not None
    # Kept for the family that parses it next, so that it reads the file once.
    assert package.documents.document_bytes("analysis/plain.json") == (notes / "plain.json").read_bytes()
    assert package.documents.document("analysis/plain.json").value == {"id": "ex-1", "tokens": ["w1", "w2"]}
    together = context(package_dir, tmp_patterns=("~scratchspace",))
    alone = context(package_dir, tmp_patterns=("~scratchspace",))
    assert [(f.code, f.path, f.pointer, f.line) for f in run_checks(together, Selection(), "static")] == \
        [(f.code, f.path, f.pointer, f.line) for f in run_checks(alone, Selection(), "static", processes=3)]
