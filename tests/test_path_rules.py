"""IV201–IV205 on the real example package: one planted defect per test."""
from __future__ import annotations

import json
import os
import struct

import pytest

from fixtures.edit import edit_json, edit_manifest, load_json, refresh_hashes, write_text
from tests.helpers import static_findings


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


def test_tmp_path_in_a_text_file_has_its_line(package_dir):
    rel = load_json(package_dir, "manifest.json")["decision"]["error_analysis"]
    text = (package_dir / rel).read_text()
    (package_dir / rel).write_text(text + "\nLogs were in /var/tmp/logs/run.txt during the pilot.\n")
    found = only(static_findings(package_dir), "IV201")
    assert [(f.path, f.line) for f in found] == [(rel, text.count("\n") + 2)]


@pytest.mark.parametrize("block", [64, 200, 4096])
def test_tmp_paths_in_a_text_file_read_in_many_blocks_have_their_lines_and_columns(package_dir, monkeypatch, block):
    """Lines are counted only when a block holds a match: the numbers must still be those of the whole file."""
    from itera_verify.rules import paths

    monkeypatch.setattr(paths, "BLOCK", block)
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
    from itera_verify.package import discover
    from itera_verify.rules import Selection, run_checks

    rel = first_params(package_dir)
    edit_json(package_dir, rel, lambda p: p.__setitem__("cache_dir", "/mnt/ephemeral/hf"))
    refresh_hashes(package_dir)
    package = discover(package_dir)
    package.tmp_patterns = ("/mnt/ephemeral",)
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
    from itera_verify.rules import paths

    real_open = paths.open_binary

    def refusing_open(path):
        if str(path).endswith("control-model/model.safetensors"):
            raise PermissionError(13, "Permission denied")
        return real_open(path)

    monkeypatch.setattr(paths, "open_binary", refusing_open)
    with pytest.raises(UsageError, match="artifacts/control-model/model.safetensors: cannot read"):
        static_findings(package_dir)
