"""`above_threshold` (docs/record.md): a ceiling, "eval loss above 6", in the recorder (live), the manifest schema and
IV405/IV408, planted in the example package."""
from __future__ import annotations

import pytest

from fixtures.edit import edit_json, edit_manifest
from itera_verify.record import RecordError, open_campaign
from tests.helpers import codes, static_findings


def ceiling(package_dir, metric: str, threshold: float, rule_id: str = "loss-ceiling") -> None:
    edit_manifest(package_dir, lambda m: m["stop_rules"]["rules"].append(
        {"id": rule_id, "kind": "above_threshold", "metric": metric, "threshold": threshold}))


def only(findings, code: str) -> list:
    return [f for f in findings if f.code == code]


def test_accepted_run_whose_last_value_is_above_the_ceiling_is_IV405(package_dir):
    # The control ends at train_loss 4.58, under the ceiling; lora-r16 at 4.88, above it.
    ceiling(package_dir, "train_loss", 4.7)
    (finding,) = only(static_findings(package_dir), "IV405")
    assert finding.run == "lora-r16" and "above the ceiling 4.7" in finding.message and "4.88048" in finding.message


def test_accepted_run_under_the_ceiling_passes(package_dir):
    ceiling(package_dir, "train_loss", 6.0)
    assert codes(static_findings(package_dir)) & {"IV405", "IV408", "IV104", "IV105"} == set()


def test_accepted_run_that_never_logs_the_ceiling_metric_is_IV405(package_dir):
    ceiling(package_dir, "eval_loss", 6.0)
    found = only(static_findings(package_dir), "IV405")
    assert {f.run for f in found} == {"control", "lora-r16"} and "ceiling" in found[0].message


def test_a_ceiling_without_a_threshold_is_a_schema_error(package_dir):
    edit_manifest(package_dir, lambda m: m["stop_rules"]["rules"].append(
        {"id": "loss-ceiling", "kind": "above_threshold", "metric": "eval_loss"}))
    assert "IV105" in codes(static_findings(package_dir))


def test_a_ceiling_stop_the_metrics_deny_is_IV408(package_dir):
    # lora-r64 "stopped by an F1 ceiling" at step 3, though its last eval_macro_f1 (0.38) is under it.
    ceiling(package_dir, "eval_macro_f1", 0.5)
    edit_json(package_dir, "stops.json", lambda s: s["stops"][0].update(rule="loss-ceiling"))
    found = [f for f in only(static_findings(package_dir), "IV408") if f.run == "lora-r64"]
    assert found and "above the ceiling 0.5" in found[0].message


def test_the_recorder_stops_a_run_above_its_ceiling(tmp_path):
    campaign = open_campaign(tmp_path / "pkg", "ceiling", "Does it diverge?", "toy", "v1", ["a", "b"],
                             main_process=True)
    campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}], reserved_hours=1)
    campaign.declare_stop_rules([{"id": "diverged", "kind": "above_threshold", "metric": "eval_loss",
                                  "threshold": 6}])
    run = campaign.run("control", "control", params={"seed": 1}).start()
    assert run.log(10, "eval_loss", 5.9) is None
    violation = run.log(20, "eval_loss", 6.4)
    assert violation.rule == "diverged" and "above the ceiling 6" in violation.reason
    run.stop_for(violation)
    assert run.stopped and campaign.manifest["runs"][0]["status"] == "stopped"


@pytest.mark.parametrize("rule", [{"id": "c", "kind": "above_threshold", "metric": "eval_loss"},
                                  {"id": "c", "kind": "above_threshold", "metric": "eval_loss", "threshold": "6"},
                                  {"id": "c", "kind": "above_threshold", "threshold": 6}])
def test_a_ceiling_needs_its_metric_and_a_numeric_threshold(tmp_path, rule):
    campaign = open_campaign(tmp_path / "pkg", "ceiling", "Does it diverge?", "toy", "v1", ["a"], main_process=True)
    with pytest.raises(RecordError, match="above_threshold"):
        campaign.declare_stop_rules([rule])
