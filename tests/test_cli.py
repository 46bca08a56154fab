"""The command line as a user meets it: exit codes, one-line errors, verdict, nothing written in the package."""
from __future__ import annotations

import json
import os
import hashlib

import pytest

from fixtures.edit import edit_manifest
from tests.helpers import run_cli


def tree_state(root):
    """Every path under root with its size, mtime and content digest: proof that nothing was written there."""
    state = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.isfile(path) and not os.path.islink(path) else ""
            state[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns, digest)
    return state


def test_clean_package_passes_with_exit_0_and_a_verdict_line(package_dir):
    before = tree_state(package_dir)
    result = run_cli(package_dir, "--no-reload", "--no-seal")
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("PASS") and "not reloaded" in last.lower()
    assert tree_state(package_dir) == before, "the tool wrote inside the package"


def test_defect_gives_exit_1_and_the_code(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][0].__setitem__("role", "baseline"))
    result = run_cli(package_dir, "--no-reload", "--no-seal")
    assert result.returncode == 1
    assert "IV105" in result.stdout and result.stdout.strip().splitlines()[-1].startswith("FAIL")


def test_json_format_is_one_document_on_stdout_matching_the_schema(package_dir):
    from itera_verify.package.schemas import validator

    edit_manifest(package_dir, lambda m: m["runs"][0].__setitem__("role", "baseline"))
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json")
    report = json.loads(result.stdout)
    assert list(validator("report").iter_errors(report)) == []
    assert report["verdict"] == "fail" and report["reloaded"] is False
    finding = next(f for f in report["findings"] if f["code"] == "IV105")
    assert finding["pointer"] == "/runs/0/role" and finding["path"] == "manifest.json" and finding["line"] > 1


def test_report_file_gets_the_json_and_stdout_stays_clean(package_dir, tmp_path):
    out = tmp_path / "r" / "report.json"
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json", "--report", out)
    assert result.returncode == 0
    assert json.loads(out.read_text())["verdict"] == "pass"
    assert result.stdout == ""


def test_missing_folder_is_exit_2_with_one_line(tmp_path):
    result = run_cli(tmp_path / "nope", "--no-reload")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no such folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_file_instead_of_folder_is_exit_2(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("{}")
    result = run_cli(path, "--no-reload")
    assert result.returncode == 2 and "not a folder" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_manifest_is_exit_2(package_dir):
    (package_dir / "manifest.json").chmod(0)
    result = run_cli(package_dir, "--no-reload", "--no-seal")
    assert result.returncode == 2 and "manifest.json" in result.stderr and "Traceback" not in result.stderr


def test_bad_option_is_exit_2(package_dir):
    result = run_cli(package_dir, "--format", "yaml")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_unknown_code_in_select_is_exit_2(package_dir):
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--select", "IV999")
    assert result.returncode == 2 and "IV999" in result.stderr


def test_strict_turns_a_warning_into_a_failure(package_dir):
    from fixtures.edit import edit_json, load_json, refresh_hashes

    rel = load_json(package_dir, "manifest.json")["runs"][0]["params"]
    edit_json(package_dir, rel, lambda p: p.__setitem__("dataset_path", "/home/alice/data"))
    refresh_hashes(package_dir)
    assert run_cli(package_dir, "--no-reload", "--no-seal").returncode == 0
    strict = run_cli(package_dir, "--no-reload", "--no-seal", "--strict")
    assert strict.returncode == 1 and "IV202" in strict.stdout


def test_ignore_by_prefix_silences_a_family(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][0].__setitem__("role", "baseline"))
    assert run_cli(package_dir, "--no-reload", "--no-seal", "--ignore", "IV1,IV3").returncode == 0


def test_rules_lists_every_code_and_explains_one():
    listing = run_cli("rules")
    assert listing.returncode == 0
    for code in ("IV101", "IV205", "IV303", "IV506", "IV611", "IV706"):
        assert code in listing.stdout
    explained = run_cli("rules", "iv201")
    assert explained.returncode == 0
    assert "/tmp/run3" in explained.stdout and "Fails:" in explained.stdout and "Passes:" in explained.stdout
    assert run_cli("rules", "IV999").returncode == 2


def test_python_dash_m_and_version():
    result = run_cli("--version")
    assert result.returncode == 0 and "itera-verify" in result.stdout


def test_every_rule_has_documentation_and_examples():
    from itera_verify.rules import all_rules

    rules = all_rules()
    spec_codes = {f"IV{n}" for n in [*range(101, 107), *range(201, 206), *range(301, 308), *range(401, 408),
                                    *range(501, 512), *range(601, 612), *range(701, 707)]}
    assert spec_codes <= set(rules), sorted(spec_codes - set(rules))
    for rule in rules.values():
        assert rule.title and len(rule.explain) > 40 and rule.bad and rule.good, rule.code
