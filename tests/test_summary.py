"""The budget, plan, runs and curves summaries the report shows (docs/format.md budget paragraph, §4, §6)."""
from __future__ import annotations

import json
import math

from fixtures.edit import append_jsonl, edit_manifest, write_text
from itera_verify.report import summary
from itera_verify.rules import Selection
from tests.handmade import write_tiny_package
from tests.helpers import run_cli, static_findings, context


def _blocking(package_dir):
    selection = Selection()
    return [f for f in static_findings(package_dir) if selection.blocks(f)]


def _budget(package_dir):
    return summary.budget_summary(context(package_dir), _blocking(package_dir))


def test_spec_example_costs_24_32_per_accepted_run(package_dir):
    budget = _budget(package_dir)
    assert budget["rental_usd"] == 47.14
    assert budget["other_expenses_included"] == [{"label": "object storage", "usd": 1.5}]
    assert budget["total_usd"] == 48.64
    assert budget["accepted_declared"] == 2 and budget["accepted"] == 2
    assert budget["accepted_runs"] == ["control", "lora-r16"]
    assert budget["cost_per_accepted_usd"] == 24.32
    assert budget["stopped_runs"] == ["lora-r64"]  # spent, never delivered, still in the cost
    assert budget["lots"] == [{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}]
    assert budget["window_hours"] == 72 and budget["rejected"] == []
    assert "undefined_reason" not in budget


def test_an_accepted_run_that_fails_a_check_is_not_counted(package_dir):
    append_jsonl(package_dir, "metrics/control.jsonl", [{"step": 5, "name": "train_loss", "value": float("nan")}])
    budget = _budget(package_dir)
    assert budget["accepted_declared"] == 2 and budget["accepted"] == 1
    assert budget["accepted_runs"] == ["lora-r16"]
    assert budget["cost_per_accepted_usd"] == 48.64
    (rejected,) = budget["rejected"]
    assert rejected["run"] == "control" and rejected["causes"][0].startswith("IV404: ")


def test_nothing_accepted_leaves_the_cost_per_run_undefined_never_zero(package_dir):
    edit_manifest(package_dir, lambda m: (m["decision"].update(outcome="negative", accepted=[]),
                                          m["decision"].pop("cost_per_accepted_usd")))
    budget = _budget(package_dir)
    assert budget["accepted"] == 0 and budget["cost_per_accepted_usd"] is None
    assert budget["cost_incurred_usd"] == 48.64
    assert "undefined" in budget["undefined_reason"] and "the decision accepts no run" in budget["undefined_reason"]


def test_every_accepted_run_failing_gives_the_causes_and_the_cost_incurred(package_dir):
    for run in ("control", "lora-r16"):
        append_jsonl(package_dir, f"metrics/{run}.jsonl", [{"step": 9, "name": "eval_macro_f1", "value": 0.2}])
    budget = _budget(package_dir)
    assert budget["accepted"] == 0 and budget["cost_per_accepted_usd"] is None
    assert budget["cost_incurred_usd"] == 48.64
    assert [r["run"] for r in budget["rejected"]] == ["control", "lora-r16"]
    assert "IV405" in budget["undefined_reason"]


def test_excluded_expenses_are_listed_apart_and_not_in_the_total(package_dir):
    edit_manifest(package_dir, lambda m: m["plan"]["other_expenses"].append(
        {"label": "team lunch", "usd": 60, "included": False}))
    budget = _budget(package_dir)
    assert budget["total_usd"] == 48.64
    assert budget["other_expenses_excluded"] == [{"label": "team lunch", "usd": 60.0}]


def test_handmade_package_budget(tmp_path):
    root = write_tiny_package(tmp_path / "tiny")
    budget = _budget(root)
    assert (budget["total_usd"], budget["accepted"], budget["cost_per_accepted_usd"]) == (48.64, 2, 24.32)
    assert budget["other_expenses_excluded"] == [{"label": "coffee", "usd": 9.99}]
    assert budget["stopped_runs"] == ["big"]


def test_json_report_budget_follows_the_spec_shape(package_dir):
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json")
    report = json.loads(result.stdout)
    assert report["budget"]["total_usd"] == 48.64
    assert report["budget"]["accepted"] == 2 and report["budget"]["cost_per_accepted_usd"] == 24.32


def test_json_report_with_nothing_accepted_says_null(package_dir):
    edit_manifest(package_dir, lambda m: (m["decision"].update(outcome="negative", accepted=[]),
                                          m["decision"].pop("cost_per_accepted_usd")))
    report = json.loads(run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json").stdout)
    assert report["budget"]["accepted"] == 0 and report["budget"]["cost_per_accepted_usd"] is None
    assert report["budget"]["cost_incurred_usd"] == 48.64


def test_plan_summary_compares_without_rewriting(package_dir):
    before = (package_dir / "manifest.json").read_bytes()
    plan = summary.plan_summary(context(package_dir))
    assert (package_dir / "manifest.json").read_bytes() == before
    assert plan["window_hours"] == 72 and plan["reserved_hours"] == 48 and plan["observed_hours"] == 52.5
    assert plan["uncommitted_margin_hours"] == 24 and plan["observed_minus_reserved_hours"] == 4.5
    assert plan["explained_deviation_hours"] == 4.5
    assert plan["declared_at"] == "2026-11-20T08:00:00Z"
    assert plan["first_run_started_at"] == "2026-11-20T09:00:00Z" and plan["first_run"] == "lora-r64"
    assert plan["declared_before_first_run"] is True
    assert [d["decision"] for d in plan["decisions_after_pilot"]] == ["reduce"]


def test_plan_declared_late_is_shown_as_declared(package_dir):
    edit_manifest(package_dir, lambda m: m["plan"].update(declared_at="2026-11-21T08:00:00Z"))
    plan = summary.plan_summary(context(package_dir))
    assert plan["declared_at"] == "2026-11-21T08:00:00Z" and plan["declared_before_first_run"] is False


def test_runs_summary_shows_stops_last_values_and_findings(package_dir):
    append_jsonl(package_dir, "metrics/lora-r16.jsonl", [{"step": 5, "name": "eval_macro_f1", "value": 0.41}])
    findings = static_findings(package_dir)
    runs = {r["id"]: r for r in summary.runs_summary(context(package_dir), findings)}
    assert runs["control"]["accepted"] is True and runs["control"]["findings"] == 0
    assert runs["lora-r16"]["accepted"] is False and runs["lora-r16"]["findings"] == 1
    assert runs["lora-r16"]["last_values"]["eval_macro_f1"] == {"step": 5, "value": 0.41}
    stopped = runs["lora-r64"]
    assert stopped["status"] == "stopped" and stopped["accepted"] is False
    assert stopped["stop"]["rule"] == "nonfinite-loss" and "NaN" in stopped["stop"]["reason"]
    assert stopped["last_values"]["train_loss"] == {"step": 3, "value": None, "nonfinite": "NaN"}
    assert runs["control"]["role"] == "control" and runs["control"]["category"] == "indispensable"


def test_curves_keep_everything_when_short(package_dir):
    curves = summary.metric_curves(context(package_dir))
    r64 = curves["lora-r64"]["train_loss"]
    assert r64 == {"points": [[1, 4.87], [2, 9.61], [3, None]], "nonfinite_steps": [3], "total_points": 3,
                   "downsampled": False}
    assert set(curves) == {"control", "lora-r16", "lora-r64"}


def test_long_curves_are_thinned_keeping_ends_and_nonfinite_points(package_dir):
    lines = [{"step": s, "name": "train_loss", "value": float("nan") if s in (1234, 5678) else 1 / s}
             for s in range(1, 10_001)]
    write_text(package_dir, "metrics/control.jsonl", "".join(json.dumps(r) + "\n" for r in reversed(lines)))
    curve = summary.metric_curves(context(package_dir), max_points=100)["control"]["train_loss"]
    assert curve["total_points"] == 10_000 and curve["downsampled"] is True
    steps = [p[0] for p in curve["points"]]
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 10_000
    assert 100 <= len(steps) <= 102
    assert [1234, None] in curve["points"] and [5678, None] in curve["points"]
    assert curve["nonfinite_steps"] == [1234, 5678]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert max(gaps) <= 102  # evenly spread, not the first hundred points


def test_summaries_tolerate_a_malformed_manifest(tmp_path):
    def edit(manifest):
        manifest["plan"] = ["not", "an", "object"]
        manifest["runs"] = [None, {"id": 5}, {"id": "base", "metrics": 3}, {"id": "small", "status": []}]
        manifest["timeline"] = {"deviations": "none", "decisions": [None, {"after": 1}]}
        manifest["decision"] = {"accepted": "small"}

    root = write_tiny_package(tmp_path / "tiny", edit)
    package = context(root)
    budget = summary.budget_summary(package, [])
    assert budget["total_usd"] is None and budget["cost_per_accepted_usd"] is None and budget["accepted"] == 0
    assert "unknown" in budget["undefined_reason"]
    plan = summary.plan_summary(package)
    assert plan["window_hours"] is None and plan["uncommitted_margin_hours"] is None
    runs = summary.runs_summary(package, [])
    assert [r["id"] for r in runs] == [None, "base", "small"]
    assert summary.metric_curves(package) == {}


def test_summaries_of_a_package_without_manifest(tmp_path):
    write_text(tmp_path, "stops.json", '{"stops": []}')
    package = context(tmp_path)
    assert summary.budget_summary(package, [])["accepted"] == 0
    assert summary.plan_summary(package)["observed_hours"] is None
    assert summary.runs_summary(package, []) == [] and summary.metric_curves(package) == {}


def test_budget_is_exact_where_floats_are_not(tmp_path):
    # 0.1 + 0.2 in floats is 0.30000000000000004; three lots of 0.1 + 0.2 + 47.14 must give 47.44 exactly
    def edit(manifest):
        manifest["plan"]["lots"] = [{"gpu": "X", "days": 1, "price_usd": p} for p in (0.1, 0.2, 47.14)]
        manifest["plan"]["rental_total_usd"] = 47.44
        manifest["plan"]["other_expenses"] = []
        manifest["decision"]["cost_per_accepted_usd"] = 23.72

    root = write_tiny_package(tmp_path / "tiny", edit)
    budget = _budget(root)
    assert budget["rental_usd"] == 47.44 and budget["cost_per_accepted_usd"] == 23.72
    assert not {f.code for f in static_findings(root)} & {"IV601", "IV604"}
    assert not math.isnan(budget["total_usd"])


def test_nan_tokens_in_the_manifest_and_stops_never_reach_the_json_report(tmp_path):
    """NaN is legal input; the report is strict JSON, so what the summaries copy must not carry it."""
    def edit(manifest):
        manifest["plan"]["lots"][0]["price_usd"] = float("nan")
        manifest["timeline"]["decisions"][0]["note"] = float("inf")

    root = write_tiny_package(tmp_path / "tiny", edit)
    write_text(root, "stops.json", '{"stops": [{"run": "big", "rule": NaN, "step": Infinity, "reason": "x"}]}')
    package = context(root)
    findings = static_findings(root)
    for produced in (summary.budget_summary(package, findings), summary.plan_summary(package),
                     summary.runs_summary(package, findings), summary.metric_curves(package)):
        json.dumps(produced, allow_nan=False)
    assert summary.budget_summary(package, findings)["lots"][0]["price_usd"] is None


def test_deeply_nested_manifest_values_are_not_copied_into_the_report(tmp_path):
    def edit(manifest):
        manifest["timeline"]["decisions"][0]["note"] = "DEEP"
        manifest["plan"]["lots"][0]["gpu"] = {"name": "RTX 4090"}

    root = write_tiny_package(tmp_path / "tiny", edit)
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(text.replace('"DEEP"', "[" * 900 + "]" * 900))
    package = context(root)
    plan = summary.plan_summary(package)
    budget = summary.budget_summary(package, [])
    assert plan["decisions"][0]["note"] is None and budget["lots"][0]["gpu"] is None
    assert budget["lots"][0]["price_usd"] == 47.14
    json.dumps([plan, budget], allow_nan=False)
