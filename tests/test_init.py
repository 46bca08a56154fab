"""`itera-verify init`: a template whose findings are exactly the to-do list."""
from __future__ import annotations

import json

import pytest

from itera_verify.model import UsageError
from itera_verify.rules import Selection
from itera_verify.flows.checks import run_checks
from itera_verify.package.template import is_placeholder, write_template
from tests.helpers import run_cli, context

MY_FAMILIES = ("IV3", "IV4", "IV6")


def _resolve(document, pointer: str):
    value = document
    for part in [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]:
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _holds_placeholder(value) -> bool:
    if isinstance(value, dict):
        return any(_holds_placeholder(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_placeholder(v) for v in value)
    return is_placeholder(value)


def _points_at_something_to_fill(root, finding) -> bool:
    """The finding's pointer names a placeholder (or an object holding one), or a file still to deliver."""
    document = json.loads((root / finding.path).read_text())
    if finding.pointer is None:
        return False
    try:
        value = _resolve(document, finding.pointer)
    except (KeyError, IndexError, ValueError):
        return False
    if _holds_placeholder(value):
        return True
    return isinstance(value, str) and not (root / value).exists()  # a file the campaign will produce


def test_init_writes_a_template_package(tmp_path):
    root = tmp_path / "my-campaign"
    written = write_template(root)
    names = {p.relative_to(root).as_posix() for p in written}
    assert {"manifest.json", "stops.json", "reload.json", "params/control.json", "TEMPLATE-README.md"} <= names
    for folder in ("params", "metrics", "predictions", "corpus", "analysis"):
        assert (root / folder).is_dir()
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["format"] == "itera-output/1" and manifest["campaign_id"] == "my-campaign"
    for section in ("question", "corpus", "plan", "stop_rules", "runs", "artifacts", "timeline", "decision"):
        assert section in manifest
    assert json.loads((root / "stops.json").read_text()) == {"stops": []}
    assert set(json.loads((root / "reload.json").read_text())["artifacts"]) == {a["id"] for a in manifest["artifacts"]}
    assert is_placeholder(manifest["stop_rules"]["declared_at"])
    # What the Trainer logs its step loss as, and the cost the decision states (a placeholder until known).
    assert [r["metric"] for r in manifest["stop_rules"]["rules"] if r["kind"] == "nonfinite_loss"] == ["loss"]
    assert is_placeholder(manifest["decision"]["cost_per_accepted_usd"])


def test_the_template_guide_says_it_is_one(tmp_path):
    write_template(tmp_path / "c")
    assert not (tmp_path / "c/README.md").exists()  # a campaign's own README.md is the campaign's to write
    first_line = (tmp_path / "c/TEMPLATE-README.md").read_text().splitlines()[0]
    assert "template" in first_line and "delete this file before sealing" in first_line


def test_every_finding_on_a_fresh_template_points_at_a_placeholder(tmp_path):
    root = tmp_path / "fresh"
    write_template(root)
    findings = run_checks(context(root), Selection(), "static")
    mine = [f for f in findings if f.code.startswith(MY_FAMILIES)]
    assert {"IV304", "IV306", "IV401", "IV607"} <= {f.code for f in mine}
    # Nothing is logged yet, so nothing is contradicted: the new run and stop rules stay quiet.
    assert not {f.code for f in findings} & {"IV308", "IV408", "IV409", "IV410", "IV612"}
    assert {f.path for f in findings if f.code == "IV107"} == {
        "TEMPLATE-README.md", "manifest.json", "params/control.json", "params/variant-1.json"}
    assert {f.severity.value for f in findings if f.code == "IV107"} == {"warning"}
    for finding in mine:
        assert _points_at_something_to_fill(root, finding), (finding.code, finding.pointer, finding.message)
    # Every other family's manifest findings also land on something to fill in, not on a template default.
    for finding in findings:
        if finding.path == "manifest.json":
            assert _points_at_something_to_fill(root, finding), (finding.code, finding.pointer, finding.message)


def test_filled_in_stop_rules_declaration_clears_IV401(tmp_path):
    root = tmp_path / "fresh"
    write_template(root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["stop_rules"]["declared_at"] = "2026-11-20T08:30:00Z"
    (root / "manifest.json").write_text(json.dumps(manifest))
    codes = {f.code for f in run_checks(context(root), Selection(), "static")}
    assert "IV401" not in codes and "IV306" in codes


def test_init_into_a_folder_that_is_not_empty_is_refused(tmp_path):
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing/notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        write_template(tmp_path / "existing")
    assert sorted(p.name for p in (tmp_path / "existing").iterdir()) == ["notes.txt"]


def test_init_onto_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError):
        write_template(tmp_path / "file")


def test_init_into_an_empty_folder_is_fine(tmp_path):
    (tmp_path / "empty").mkdir()
    assert write_template(tmp_path / "empty", campaign_id="c-1")
    assert json.loads((tmp_path / "empty/manifest.json").read_text())["campaign_id"] == "c-1"


def test_folder_name_that_is_not_a_valid_id_is_cleaned(tmp_path):
    write_template(tmp_path / "my campaign (v2)")
    assert json.loads((tmp_path / "my campaign (v2)/manifest.json").read_text())["campaign_id"] == "my-campaign-v2"


def test_invalid_campaign_id_is_refused(tmp_path):
    with pytest.raises(UsageError, match="campaign id"):
        write_template(tmp_path / "x", campaign_id="../escape")
    assert not (tmp_path / "x").exists()


def test_cli_init_then_refuses_to_overwrite(tmp_path):
    first = run_cli("init", tmp_path / "c")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "c/manifest.json").is_file()
    second = run_cli("init", tmp_path / "c")
    assert second.returncode == 2 and "not empty" in second.stderr + second.stdout


def test_cli_check_of_a_fresh_template_fails_without_crashing(tmp_path):
    run_cli("init", tmp_path / "c")
    result = run_cli(tmp_path / "c", "--no-reload", "--no-seal", "--format", "json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "fail" and report["budget"]["cost_per_accepted_usd"] is None
    assert {f["path"] for f in report["findings"] if f["code"] == "IV107"} >= {"TEMPLATE-README.md"}
    assert {f["pointer"] for f in report["findings"] if f["code"] == "IV105"} >= {"/decision/cost_per_accepted_usd"}


def _template_with_control_metrics(root, metric_name):
    write_template(root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["decision"]["accepted"] = ["control"]
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    # The Trainer's log_history, written as the metrics file: its step loss is `loss`.
    (root / "metrics/control.jsonl").write_text("".join(
        json.dumps({"step": step, "name": metric_name, "value": value}) + "\n" for step, value in [(10, 0.9), (20, 0.6)]))
    return root


def test_template_rule_watches_the_loss_the_trainer_logs(tmp_path):
    root = _template_with_control_metrics(tmp_path / "c", "loss")
    assert not [f for f in run_checks(context(root), Selection(), "static") if f.code == "IV410"]


def test_template_rule_with_a_run_logging_another_name_is_IV410(tmp_path):
    root = _template_with_control_metrics(tmp_path / "c", "train_loss")
    (finding,) = [f for f in run_checks(context(root), Selection(), "static") if f.code == "IV410"]
    assert finding.run == "control" and "never logs loss" in finding.message
