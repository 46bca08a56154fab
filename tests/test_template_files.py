"""IV107: a file `itera-verify init` wrote, still unchanged, in a package about to be sealed."""
from __future__ import annotations

import json

from fixtures.edit import write_text
from itera_verify.package.template import LEGACY_READMES, README, TEMPLATE_README, write_template
from tests.handmade import write_tiny_package
from tests.helpers import run_cli, static_findings


def only(findings, code):
    return [f for f in findings if f.code == code]


def test_clean_package_has_no_template_file(package_dir):
    assert not only(static_findings(package_dir), "IV107")


def test_handmade_package_has_no_template_file(tmp_path):
    assert not only(static_findings(write_tiny_package(tmp_path / "tiny")), "IV107")


def test_the_readme_earlier_inits_wrote_left_in_a_finished_package_is_IV107(package_dir):
    write_text(package_dir, "README.md", LEGACY_READMES[0])
    (finding,) = only(static_findings(package_dir), "IV107")
    assert finding.path == "README.md" and finding.severity.value == "warning"
    assert "the README.md `itera-verify init` wrote, unchanged" in finding.message and "delete it" in finding.message


def test_the_template_guide_left_in_a_finished_package_is_IV107(package_dir):
    write_text(package_dir, TEMPLATE_README, README)
    (finding,) = only(static_findings(package_dir), "IV107")
    assert finding.path == TEMPLATE_README


def test_the_guide_moved_elsewhere_is_still_IV107(package_dir):
    write_text(package_dir, "analysis/README.md", README)
    assert [f.path for f in only(static_findings(package_dir), "IV107")] == ["analysis/README.md"]


def test_a_readme_the_user_edited_is_not_IV107(package_dir):
    write_text(package_dir, "README.md", LEGACY_READMES[0].replace("Campaign package template", "Reviews LoRA"))
    assert not only(static_findings(package_dir), "IV107")


def test_a_warning_does_not_block_the_check(package_dir):
    write_text(package_dir, "README.md", LEGACY_READMES[0])
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["verdict"] == "pass", result.stderr
    assert [f["code"] for f in report["findings"]] == ["IV107"]
    strict = run_cli(package_dir, "--no-reload", "--no-seal", "--strict", "--format", "json")
    assert strict.returncode == 1


def test_fresh_template_reports_its_unchanged_files(tmp_path):
    write_template(tmp_path / "c", campaign_id="c-1")
    found = only(static_findings(tmp_path / "c"), "IV107")
    assert sorted(f.path for f in found) == ["TEMPLATE-README.md", "manifest.json", "params/control.json",
                                             "params/variant-1.json"]
    assert [f.pointer for f in found if f.path == "manifest.json"] == [""]


def test_filled_in_files_of_a_template_are_not_IV107(tmp_path):
    root = tmp_path / "c"
    write_template(root)
    (root / TEMPLATE_README).unlink()
    (root / "params/control.json").write_text(json.dumps({"seed": 1, "lr": 3e-5}))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["question"] = "Does a LoRA r=16 variant reach macro-F1 >= 0.80?"
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    found = only(static_findings(root), "IV107")
    assert [f.path for f in found] == ["params/variant-1.json"]  # the one file still as init wrote it


def test_template_stops_and_reload_files_are_valid_as_written(tmp_path):
    write_template(tmp_path / "c")
    paths = {f.path for f in only(static_findings(tmp_path / "c"), "IV107")}
    assert "stops.json" not in paths and "reload.json" not in paths


def test_an_edited_guide_still_named_as_the_template_is_IV107(package_dir):
    write_text(package_dir, TEMPLATE_README, README.replace("delete this file before sealing", "our notes"))
    (finding,) = only(static_findings(package_dir), "IV107")
    assert finding.path == TEMPLATE_README and "rename it README.md" in finding.message


def test_a_campaign_id_holding_a_lone_surrogate_is_a_schema_finding_not_a_crash(package_dir):
    # Found by `make fuzz`: JSON's "\udfff" decodes to a str that cannot be encoded, and the template check
    # built the init manifest for it.
    path = package_dir / "manifest.json"
    path.write_text(path.read_text().replace('"campaign_id": "reviews-lora-2026-11"', '"campaign_id": "a\\udfffb"'))
    assert '"a\\udfffb"' in path.read_text()
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert any(f["pointer"] == "/campaign_id" for f in report["findings"]), report["findings"]
    assert "Traceback" not in result.stderr
