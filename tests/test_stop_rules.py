"""IV401–IV407: one planted defect per test, in a copy of the real example package."""
from __future__ import annotations

import json

from fixtures.edit import append_jsonl, edit_json, edit_manifest, write_json, write_text
from tests.handmade import write_tiny_package
from tests.helpers import codes, static_findings

FAMILY = {"IV401", "IV402", "IV403", "IV404", "IV405", "IV406", "IV407"}


def only(findings, code):
    return [f for f in findings if f.code == code]


def test_clean_package_has_no_stop_finding(package_dir):
    # lora-r64 holds a NaN loss, but it was stopped as declared: not IV404.
    assert not codes(static_findings(package_dir)) & FAMILY


def test_stop_rules_written_after_the_first_run_started_is_IV401(package_dir):
    edit_manifest(package_dir, lambda m: m["stop_rules"].update(declared_at="2026-11-20T10:00:00Z"))
    (finding,) = only(static_findings(package_dir), "IV401")
    assert finding.pointer == "/stop_rules/declared_at"
    assert "1 h after run lora-r64 started" in finding.message


def test_stop_rules_without_a_declaration_time_is_IV401(package_dir):
    edit_manifest(package_dir, lambda m: m["stop_rules"].pop("declared_at"))
    (finding,) = only(static_findings(package_dir), "IV401")
    assert finding.pointer == "/stop_rules" and "no declaration time" in finding.message


def test_stop_rules_declared_in_another_time_zone_before_the_first_run_are_fine(package_dir):
    # 10:00+02:00 is 08:00Z, before the first run (09:00Z)
    edit_manifest(package_dir, lambda m: m["stop_rules"].update(declared_at="2026-11-20T10:00:00+02:00"))
    assert not only(static_findings(package_dir), "IV401")


def test_no_stop_rules_at_all_is_IV401(package_dir):
    edit_manifest(package_dir, lambda m: m.pop("stop_rules"))
    found = static_findings(package_dir)
    (finding,) = only(found, "IV401")
    assert "no stop rules declared" in finding.message
    assert {f.pointer for f in only(found, "IV406")} == {"/stops/0/rule"}  # nothing declared to stop under


def test_stop_record_with_a_blank_reason_is_IV402(package_dir):
    edit_json(package_dir, "stops.json", lambda s: s["stops"][0].update(reason="  "))
    (finding,) = only(static_findings(package_dir), "IV402")
    assert finding.path == "stops.json" and finding.pointer == "/stops/0/reason" and "blank" in finding.message


def test_stop_record_without_a_rule_is_IV402(package_dir):
    edit_json(package_dir, "stops.json", lambda s: s["stops"][0].pop("rule"))
    (finding,) = only(static_findings(package_dir), "IV402")
    assert finding.pointer == "/stops/0" and "rule is missing" in finding.message


def test_stopped_run_listed_as_accepted_is_IV403(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"]["accepted"].append("lora-r64"))
    (finding,) = only(static_findings(package_dir), "IV403")
    assert finding.run == "lora-r64" and finding.pointer == "/decision/accepted/2"
    assert "train_loss became NaN at step 3" in finding.message


def test_nan_loss_in_a_completed_run_is_IV404(package_dir):
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 5, "name": "train_loss", "value": float("nan")},
                                                         {"step": 6, "name": "train_loss", "value": float("inf")}])
    (finding,) = only(static_findings(package_dir), "IV404")
    assert finding.path == "metrics/control.jsonl" and finding.line == 7 and finding.run == "control"
    assert "train_loss is NaN at step 5 (2 non-finite values in all)" in finding.message
    assert "nonfinite-loss" in finding.message


def test_infinite_loss_in_a_csv_metrics_file_is_IV404(package_dir):
    write_text(package_dir, "metrics/lora-r16.csv", "step,name,value\n1,train_loss,4.8\n2,train_loss,-Infinity\n")
    (package_dir / "metrics/lora-r16.jsonl").unlink()
    edit_manifest(package_dir, lambda m: m["runs"][1].update(metrics="metrics/lora-r16.csv"))
    found = static_findings(package_dir)
    (finding,) = only(found, "IV404")
    assert finding.path == "metrics/lora-r16.csv" and finding.line == 3 and "-Infinity" in finding.message
    assert "IV405" in codes(found)  # and the CSV has no eval_macro_f1 at all


def test_accepted_run_under_the_f1_floor_is_IV405(package_dir):
    append_jsonl(package_dir, "metrics/lora-r16.jsonl", [{"step": 5, "name": "eval_macro_f1", "value": 0.41}])
    (finding,) = only(static_findings(package_dir), "IV405")
    assert finding.run == "lora-r16" and finding.line == 7
    assert "is 0.41, under the floor 0.6 of stop rule f1-floor" in finding.message


def test_accepted_run_with_no_value_of_the_floor_metric_is_IV405(package_dir):
    path = package_dir / "metrics/control.jsonl"
    kept = [line for line in path.read_text().splitlines() if "eval_macro_f1" not in line]
    write_text(package_dir, "metrics/control.jsonl", "\n".join(kept) + "\n")
    (finding,) = only(static_findings(package_dir), "IV405")
    assert finding.run == "control" and "no value of eval_macro_f1" in finding.message


def test_low_value_at_an_earlier_step_written_last_is_not_IV405(package_dir):
    # The last value is the one at the highest step, not the last line of the file.
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 1, "name": "eval_macro_f1", "value": 0.1}])
    assert not only(static_findings(package_dir), "IV405")


def test_nan_as_the_last_floor_value_is_IV405(package_dir):
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 9, "name": "eval_macro_f1", "value": float("nan")}])
    (finding,) = only(static_findings(package_dir), "IV405")
    assert "is nan" in finding.message


def test_stop_under_an_undeclared_rule_is_IV406(package_dir):
    edit_json(package_dir, "stops.json", lambda s: s["stops"][0].update(rule="too-slow"))
    (finding,) = only(static_findings(package_dir), "IV406")
    assert finding.pointer == "/stops/0/rule" and "nonfinite-loss" in finding.message


def test_stopped_run_without_a_stop_record_is_IV407(package_dir):
    write_json(package_dir, "stops.json", {"stops": []})
    (finding,) = only(static_findings(package_dir), "IV407")
    assert finding.run == "lora-r64" and finding.pointer == "/runs/2/status"


def test_stop_record_for_a_completed_run_is_IV407(package_dir):
    edit_json(package_dir, "stops.json", lambda s: s["stops"].append(
        {"run": "control", "rule": "f1-floor", "at": "2026-11-20T20:00:00Z", "step": 2, "reason": "low F1"}))
    found = static_findings(package_dir)
    (finding,) = only(found, "IV407")
    assert finding.run == "control" and finding.path == "stops.json" and finding.pointer == "/stops/1/run"
    assert {f.run for f in only(found, "IV403")} == {"control"}  # a stopped run cannot stay accepted


# ---- a package written by hand ----------------------------------------------------------------------------

def test_handmade_package_is_clean(tmp_path):
    write_tiny_package(tmp_path / "tiny")
    assert not codes(static_findings(tmp_path / "tiny")) & FAMILY


def test_handmade_package_that_forgot_to_stop_a_nan_run(tmp_path):
    def edit(manifest):
        manifest["runs"][2]["status"] = "completed"
        manifest["runs"][2]["predictions"] = "predictions/small.jsonl"

    root = write_tiny_package(tmp_path / "tiny", edit)
    write_json(root, "stops.json", {"stops": []})
    found = static_findings(root)
    (finding,) = only(found, "IV404")
    assert finding.run == "big" and finding.path == "metrics/big.jsonl" and finding.line == 2


def test_handmade_package_with_a_string_threshold_and_odd_shapes_does_not_crash(tmp_path):
    def edit(manifest):
        manifest["stop_rules"]["rules"] = [{"id": ["x"], "kind": "nonfinite_loss", "metric": "loss"},
                                           {"id": "floor", "kind": "below_threshold", "metric": "f1",
                                            "threshold": "0.5"}, "junk"]
        manifest["decision"]["accepted"] = ["base", 3, None]

    root = write_tiny_package(tmp_path / "tiny", edit)
    write_text(root, "stops.json", json.dumps({"stops": [None, {"run": 5}, {"run": "big", "rule": "nan"}]}))
    found = codes(static_findings(root))
    assert "IV402" in found and "IV406" in found and "IV405" not in found
