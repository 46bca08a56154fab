"""`--format sarif` / `--report sarif=PATH` for `verify` and `audit` (one archive or a batch): SARIF 2.1.0 valid against
the OASIS schema (tests/data/sarif-schema-2.1.0.json, its source beside it), one run, one reportingDescriptor per
rule from the registry, levels from severities, every result at its package path and line (a JSON pointer's line),
fingerprints that a second run of the same package repeats, and GitHub's upload limits kept."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from fixtures.edit import edit_manifest
from itera_verify.model import Finding, Severity
from itera_verify.package.jsonpos import line_of
from itera_verify.report import Report, renderer
from itera_verify.report.sarif_format import MAX_GZIP_BYTES, MAX_RESULTS
from itera_verify.rules import all_rules
from tests.helpers import run_cli

SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())


def assert_valid(log: dict) -> None:
    validator = jsonschema.Draft4Validator(SCHEMA, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message[:200]}" for e in errors[:5]]
    assert log["version"] == "2.1.0" and len(log["runs"]) == 1


def test_verify_sarif_locates_a_pointer_finding_at_its_line_and_describes_its_rule(package_dir, tmp_path):
    edit_manifest(package_dir, lambda m: m["plan"].update(rental_total_usd=188.56))  # IV601
    out = tmp_path / "v.sarif"
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "sarif", "--report", f"sarif={out}")
    assert result.returncode == 1, result.stderr
    log = json.loads(out.read_text())
    assert result.stdout == ""  # --report to the file only, as for json
    assert_valid(log)
    run = log["runs"][0]
    iv601 = next(r for r in run["results"] if r["ruleId"] == "IV601")
    text = (package_dir / "manifest.json").read_text()
    location = iv601["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "manifest.json"
    assert location["region"]["startLine"] == line_of(text, "/plan/rental_total_usd") > 1
    assert iv601["level"] == "error" and iv601["properties"]["pointer"] == "/plan/rental_total_usd"
    rule = run["tool"]["driver"]["rules"][iv601["ruleIndex"]]
    registered = all_rules()["IV601"]
    assert rule["id"] == "IV601" and rule["shortDescription"]["text"] == registered.title
    assert rule["fullDescription"]["text"] == registered.explain and registered.bad in rule["help"]["text"]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert len(ids) == len(set(ids))  # one descriptor per rule
    again = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "sarif")
    fingerprints = [r["partialFingerprints"] for r in json.loads(again.stdout)["runs"][0]["results"]]
    assert fingerprints == [r["partialFingerprints"] for r in run["results"]]  # the same package, the same prints


def test_audit_sarif_of_an_archive_and_of_a_batch_are_valid(sealed, tmp_path):
    single = run_cli("audit", sealed, "--format", "sarif")
    assert single.returncode == 0, single.stderr
    log = json.loads(single.stdout)
    assert_valid(log)
    assert log["runs"][0]["results"] == [] and log["runs"][0]["invocations"][0]["executionSuccessful"] is True
    folder = tmp_path / "delivery"
    folder.mkdir()
    shutil.copy(sealed, folder / "good.tar.zst")
    (folder / "bad.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 64)  # a zstd magic, then nothing sound
    report = tmp_path / "batch.sarif"
    batch = run_cli("audit", folder, "--report", f"sarif={report}", "-q")
    assert batch.returncode == 1
    log = json.loads(report.read_text())
    assert_valid(log)
    results = log["runs"][0]["results"]
    assert {r["ruleId"] for r in results} == {"IV702"} and results[0]["properties"]["archive"].endswith("bad.tar.zst")
    assert results[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "bad.tar.zst"


def test_a_batch_finding_is_located_under_its_campaign_folder_at_its_line(package_dir, tmp_path):
    """In a batch, two campaigns may each have a manifest.json: a result says which, as the archive extracts."""
    edit_manifest(package_dir, lambda m: m["decision"].pop("error_analysis"))  # IV608, a warning: still sealed
    folder = tmp_path / "delivery"
    folder.mkdir()
    sealed = run_cli(package_dir, "--no-reload", "-o", f"{folder}/")
    assert sealed.returncode == 0, sealed.stdout
    result = run_cli("audit", folder, "--format", "sarif", "-q")
    log = json.loads(result.stdout)
    assert_valid(log)
    [warning] = [r for r in log["runs"][0]["results"] if r["ruleId"] == "IV608"]
    location = warning["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "reviews-lora-2026-11/manifest.json"
    assert location["region"]["startLine"] == line_of((package_dir / "manifest.json").read_text(), "/decision") > 1
    assert warning["level"] == "warning"


def _many(count: int) -> Report:
    findings = [Finding("IV303", f"predictions/run-{i}.jsonl", f"eval id ex-{i} missing " + "x" * 400, line=i + 1,
                        severity=Severity.ERROR if i % 3 == 0 else Severity.WARNING) for i in range(count)]
    return Report(package="pkg/", findings=findings, rules={"IV303": {"severity": "error", "title": "t"}})


def test_more_results_than_github_shows_keeps_the_most_severe_and_says_how_many_went():
    log = json.loads(renderer("sarif")(_many(MAX_RESULTS + 600), {}))
    assert_valid(log)
    run = log["runs"][0]
    assert len(run["results"]) == MAX_RESULTS
    errors = sum(1 for i in range(MAX_RESULTS + 600) if i % 3 == 0)
    assert [r["level"] for r in run["results"][:errors]] == ["error"] * errors  # every error kept, first
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert any("600 results left out" in n["message"]["text"] for n in notes)
    assert len(gzip.compress(json.dumps(log).encode())) <= MAX_GZIP_BYTES


def test_a_finding_with_no_line_is_at_line_1_and_keeps_its_pointer_in_words():
    report = Report(package="pkg/", findings=[Finding("IV105", "reload.json", "bad entry", pointer="/artifacts/9",
                                                      severity=Severity.ERROR),
                                              Finding("IV302", None, "no control", severity=Severity.WARNING)])
    log = json.loads(renderer("sarif")(report, {}))
    assert_valid(log)
    first, second = log["runs"][0]["results"]
    assert first["locations"][0]["physicalLocation"]["region"] == {"startLine": 1}
    assert first["message"]["text"].endswith("(at /artifacts/9)")
    assert second["level"] == "warning" and second["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]


@pytest.mark.parametrize("name", ["sarif", "jsonl"])
def test_the_new_formats_render_a_report_with_hostile_text(name):
    report = Report(package="pkg/", findings=[Finding("IV303", "a b/ü?#.jsonl", "\x1b[31m\u202e", line=3,
                                                      severity=Severity.ERROR)])
    text = renderer(name)(report, {})
    value = json.loads(text) if name == "sarif" else json.loads(text.splitlines()[0])
    if name == "sarif":
        assert_valid(value)
        assert value["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
            "a%20b/%C3%BC%3F%23.jsonl"
    else:
        assert value["findings"][0]["line"] == 3 and text.count("\n") == 1
