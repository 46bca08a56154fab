"""IV401–IV410: one planted defect per test, in a copy of the real example package."""
from __future__ import annotations

import json

from fixtures.edit import append_jsonl, edit_json, edit_manifest, refresh_hashes, write_json, write_text
from tests.handmade import write_tiny_package
from tests.helpers import codes, static_findings

FAMILY = {"IV401", "IV402", "IV403", "IV404", "IV405", "IV406", "IV407", "IV408", "IV409", "IV410"}


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
    first_new_line = len((package_dir / "metrics/control.jsonl").read_text().splitlines()) + 1
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 5, "name": "train_loss", "value": float("nan")},
                                                         {"step": 6, "name": "train_loss", "value": float("inf")}])
    (finding,) = only(static_findings(package_dir), "IV404")
    assert finding.path == "metrics/control.jsonl" and finding.line == first_new_line and finding.run == "control"
    assert "train_loss is NaN at step 5 (2 non-finite values in all)" in finding.message
    assert "nonfinite-loss" in finding.message


def test_infinite_loss_in_a_csv_metrics_file_is_IV404(package_dir):
    write_text(package_dir, "metrics/lora-r16.csv", "step,name,value\n1,train_loss,4.8\n2,train_loss,-Infinity\n")
    (package_dir / "metrics/lora-r16.jsonl").unlink()
    edit_manifest(package_dir, lambda m: m["runs"][2].update(metrics="metrics/lora-r16.csv"))
    found = static_findings(package_dir)
    (finding,) = only(found, "IV404")
    assert finding.path == "metrics/lora-r16.csv" and finding.line == 3 and "-Infinity" in finding.message
    assert "IV405" in codes(found)  # and the CSV has no eval_macro_f1 at all


def test_accepted_run_under_the_f1_floor_is_IV405(package_dir):
    append_jsonl(package_dir, "metrics/lora-r16.jsonl", [{"step": 5, "name": "eval_macro_f1", "value": 0.41}])
    appended = len((package_dir / "metrics/lora-r16.jsonl").read_text().splitlines())  # the line planted last
    (finding,) = only(static_findings(package_dir), "IV405")
    assert finding.run == "lora-r16" and finding.line == appended
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
    assert finding.run == "lora-r64" and finding.pointer == "/runs/0/status"


def test_stop_record_for_a_completed_run_is_IV407(package_dir):
    edit_json(package_dir, "stops.json", lambda s: s["stops"].append(
        {"run": "control", "rule": "f1-floor", "at": "2026-11-20T20:00:00Z", "step": 2, "reason": "low F1"}))
    found = static_findings(package_dir)
    (finding,) = only(found, "IV407")
    assert finding.run == "control" and finding.path == "stops.json" and finding.pointer == "/stops/1/run"
    assert {f.run for f in only(found, "IV403")} == {"control"}  # a stopped run cannot stay accepted


# ---- IV408: a stop record the run contradicts -------------------------------------------------------------
# lora-r64 (stopped) logs steps 1..3, eval_macro_f1 0.3812 at step 2, and ran 09:00-09:40, when its rule stopped it.

def _stop(package_dir, **fields):
    edit_json(package_dir, "stops.json", lambda s: s["stops"][0].update(fields))


def test_stop_at_a_step_the_run_never_logged_is_IV408(package_dir):
    _stop(package_dir, step=40)
    (finding,) = only(static_findings(package_dir), "IV408")
    assert finding.pointer == "/stops/0/step" and finding.run == "lora-r64"
    assert "step 40, outside the steps metrics/lora-r64.jsonl logs (1–3)" in finding.message


def test_stop_dated_after_the_run_ended_is_IV408(package_dir):
    _stop(package_dir, at="2026-11-20T11:40:00+01:00")  # 10:40Z, the run ended 09:40Z
    (finding,) = only(static_findings(package_dir), "IV408")
    assert finding.pointer == "/stops/0/at" and "after the run ended (2026-11-20T09:40:00Z)" in finding.message


def test_stop_dated_before_the_run_started_is_IV408(package_dir):
    _stop(package_dir, at="2026-11-20T08:59:00Z")
    (finding,) = only(static_findings(package_dir), "IV408")
    assert finding.pointer == "/stops/0/at" and "before the run started" in finding.message


def test_stop_a_fraction_of_a_second_after_a_rounded_end_is_not_IV408(package_dir):
    _stop(package_dir, at="2026-11-20T09:40:00.750Z")
    assert not only(static_findings(package_dir), "IV408")


def test_floor_stop_where_the_metric_is_above_the_floor_is_IV408(package_dir):
    append_jsonl(package_dir, "metrics/lora-r64.jsonl", [{"step": 3, "name": "eval_macro_f1", "value": 0.72}])
    _stop(package_dir, rule="f1-floor", reason="eval_macro_f1 under 0.6 at step 3")
    (finding,) = only(static_findings(package_dir), "IV408")
    assert finding.pointer == "/stops/0/rule" and finding.run == "lora-r64"
    assert "eval_macro_f1 is 0.72 at step 3 (metrics/lora-r64.jsonl line 5), not under the floor 0.6" \
        in finding.message


def test_floor_stop_judged_on_the_last_value_before_its_step_is_IV408(package_dir):
    text = (package_dir / "metrics/lora-r64.jsonl").read_text().replace('"value": 0.3812', '"value": 0.71')
    write_text(package_dir, "metrics/lora-r64.jsonl", text)
    _stop(package_dir, rule="f1-floor")
    (finding,) = only(static_findings(package_dir), "IV408")
    assert "0.71 at step 2, the last value before step 3" in finding.message


def test_floor_stop_before_the_metric_was_ever_logged_is_IV408(package_dir):
    _stop(package_dir, rule="f1-floor", step=1)
    (finding,) = only(static_findings(package_dir), "IV408")
    assert "logs no eval_macro_f1 at or before that step" in finding.message


def test_floor_stop_without_a_step_where_the_metric_never_fell_under_the_floor_is_IV408(package_dir):
    edit_json(package_dir, "stops.json", lambda s: (s["stops"][0].pop("step"), s["stops"][0].update(rule="f1-floor")))
    edit_manifest(package_dir, lambda m: m["stop_rules"]["rules"][1].update(threshold=0.3))
    (finding,) = only(static_findings(package_dir), "IV408")
    assert "no eval_macro_f1 in metrics/lora-r64.jsonl is under the floor (its lowest is 0.3812)" in finding.message


def test_floor_stop_without_a_step_the_metrics_show_is_not_IV408(package_dir):
    edit_json(package_dir, "stops.json", lambda s: (s["stops"][0].pop("step"), s["stops"][0].update(rule="f1-floor")))
    assert not only(static_findings(package_dir), "IV408")


def test_floor_stop_the_metrics_show_is_not_IV408(package_dir):
    _stop(package_dir, rule="f1-floor", step=2, reason="eval_macro_f1 0.38 under 0.6")
    assert not only(static_findings(package_dir), "IV408")


# ---- IV409: non-finite loss-like metrics, the Trainer's masked NaN ------------------------------------------

def test_trainer_masked_nan_loss_beside_a_nan_grad_norm_is_IV409(package_dir):
    # logging_nan_inf_filter=True: the NaN step loss is logged as the window's average, grad_norm stays NaN.
    grad_norm_line = len((package_dir / "metrics/control.jsonl").read_text().splitlines()) + 2
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 5, "name": "loss", "value": 0.0},
                                                        {"step": 5, "name": "grad_norm", "value": float("nan")}])
    found = static_findings(package_dir)
    (finding,) = only(found, "IV409")
    assert finding.path == "metrics/control.jsonl" and finding.line == grad_norm_line and finding.run == "control"
    assert "grad_norm is NaN at step 5" in finding.message and "logging_nan_inf_filter" in finding.message
    assert not only(found, "IV404")  # train_loss, the rule's metric, stayed finite


def test_nan_grad_norm_only_in_the_checkpoints_trainer_state_is_IV409(package_dir):
    # The metrics file was written without grad_norm; the Trainer's own log_history still has the masked NaN.
    state = "checkpoints/control/checkpoint-4/trainer_state.json"
    edit_json(package_dir, state, lambda s: s["log_history"][1].update(loss=0.0, grad_norm=float("nan")))
    (finding,) = only(static_findings(package_dir), "IV409")
    assert finding.path == state and finding.pointer == "/log_history/1/grad_norm" and finding.run == "control"
    assert "grad_norm is NaN at step 2 in the Trainer's log" in finding.message


def test_nan_in_both_the_metrics_file_and_the_trainer_state_is_one_IV409(package_dir):
    state = "checkpoints/control/checkpoint-4/trainer_state.json"
    edit_json(package_dir, state, lambda s: s["log_history"][1].update(grad_norm=float("nan")))
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 2, "name": "grad_norm", "value": float("nan")}])
    (finding,) = only(static_findings(package_dir), "IV409")
    assert finding.path == "metrics/control.jsonl"


def test_infinite_eval_loss_in_an_accepted_run_is_IV409(package_dir):
    append_jsonl(package_dir, "metrics/lora-r16.jsonl", [{"step": 4, "name": "eval_loss", "value": float("inf")}])
    (finding,) = only(static_findings(package_dir), "IV409")
    assert finding.run == "lora-r16" and "eval_loss is Infinity at step 4" in finding.message


def test_nan_in_the_rules_own_metric_is_IV404_and_not_IV409_again(package_dir):
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 5, "name": "train_loss", "value": float("nan")}])
    found = static_findings(package_dir)
    assert len(only(found, "IV404")) == 1 and not only(found, "IV409")


def test_nan_loss_without_a_nonfinite_loss_rule_is_IV409(package_dir):
    edit_manifest(package_dir, lambda m: m["stop_rules"].update(
        rules=[r for r in m["stop_rules"]["rules"] if r["kind"] != "nonfinite_loss"]))
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 5, "name": "train_loss", "value": float("nan")}])
    found = static_findings(package_dir)
    assert [f.run for f in only(found, "IV409")] == ["control"] and not only(found, "IV404")


def test_nan_grad_norm_in_a_stopped_run_is_not_IV409(package_dir):
    append_jsonl(package_dir, "metrics/lora-r64.jsonl", [{"step": 3, "name": "grad_norm", "value": float("nan")}])
    assert not only(static_findings(package_dir), "IV409")


def _fp16(package_dir, run="control"):
    edit_json(package_dir, f"params/{run}.json", lambda p: p.update(fp16=True))
    refresh_hashes(package_dir)


def test_fp16_loss_scaler_skipping_an_overflowing_step_is_not_IV409(package_dir):
    _fp16(package_dir)
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 1, "name": "grad_norm", "value": float("inf")},
                                                        {"step": 4, "name": "grad_norm", "value": 1.3}])
    assert not only(static_findings(package_dir), "IV409")


def test_fp16_run_whose_grad_norm_never_recovered_is_IV409(package_dir):
    _fp16(package_dir)
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 1, "name": "grad_norm", "value": 1.3},
                                                        {"step": 4, "name": "grad_norm", "value": float("nan")}])
    (finding,) = only(static_findings(package_dir), "IV409")
    assert "grad_norm is NaN at step 4" in finding.message


# ---- IV410: the watched metric never logged ------------------------------------------------------------------

def test_accepted_run_logging_loss_where_the_rule_watches_train_loss_is_IV410(package_dir):
    text = (package_dir / "metrics/control.jsonl").read_text().replace('"train_loss"', '"loss"')
    write_text(package_dir, "metrics/control.jsonl", text)
    (finding,) = only(static_findings(package_dir), "IV410")
    assert finding.run == "control" and finding.path == "metrics/control.jsonl"
    assert "never logs train_loss, the metric stop rule nonfinite-loss watches (it logs " in finding.message
    # The loss-like names it does log, the Trainer's per-step loss among them.
    assert "loss" in finding.message.split("(it logs ", 1)[1].split(":", 1)[0].split(", ")


def test_unaccepted_run_without_the_watched_metric_is_not_IV410(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"].update(accepted=["control"], cost_per_accepted_usd=48.64))
    text = (package_dir / "metrics/lora-r16.jsonl").read_text().replace('"train_loss"', '"loss"')
    write_text(package_dir, "metrics/lora-r16.jsonl", text)
    assert not only(static_findings(package_dir), "IV410")


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


def test_a_stop_record_naming_its_rule_by_a_list_is_IV105_not_a_crash(package_dir):
    # Found by the fuzzer on the recorded demo: the rule's id was used as a dict key before its type was checked.
    _stop(package_dir, rule=["nonfinite-loss"])
    found = static_findings(package_dir)
    assert any(f.code == "IV105" and f.pointer == "/stops/0/rule" for f in found), [(f.code, f.pointer) for f in found]
