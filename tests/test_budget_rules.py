"""IV601–IV611: one planted defect per test, in a copy of the real example package."""
from __future__ import annotations

import shutil

from fixtures.edit import edit_manifest, refresh_hashes
from itera_verify.rules import Selection
from itera_verify.flows.checks import run_checks
from itera_verify.package.budget import shipped_tariffs, tariffs
from tests.handmade import write_tiny_package
from tests.helpers import codes, static_findings, context

FAMILY = {f"IV6{n:02d}" for n in range(1, 12)}


def only(findings, code):
    return [f for f in findings if f.code == code]


def test_clean_package_has_no_budget_finding(package_dir):
    assert not codes(static_findings(package_dir)) & FAMILY


def test_shipped_catalog_prices_rtx_4090_lots():
    assert shipped_tariffs()["RTX 4090"] == {"3": 47.14, "7": 110, "30": 390}


def test_two_gpu_lot_price_multiplied_again_is_IV601(package_dir):
    def edit(m):
        m["plan"]["lots"][0].update(gpus=2, price_usd=94.28)
        m["plan"]["rental_total_usd"] = 188.56
        m["decision"].pop("cost_per_accepted_usd")

    edit_manifest(package_dir, edit)
    found = static_findings(package_dir)
    (finding,) = only(found, "IV601")
    assert finding.pointer == "/plan/rental_total_usd"
    assert "188.56 USD but the lots add up to 94.28 USD" in finding.message
    assert "already covers all of its GPUs" in finding.message
    assert "IV602" not in codes(found)  # the catalog has no 2-GPU lot: no invented price


def test_rental_total_off_by_a_cent_is_IV601(package_dir):
    edit_manifest(package_dir, lambda m: m["plan"].update(rental_total_usd=47.15))
    (finding,) = only(static_findings(package_dir), "IV601")
    assert "47.15 USD" in finding.message and "multiplied" not in finding.message


def test_lot_price_not_the_catalog_price_is_IV602(package_dir):
    def edit(m):
        m["plan"]["lots"][0]["price_usd"] = 41.47
        m["plan"]["rental_total_usd"] = 41.47
        m["decision"].pop("cost_per_accepted_usd")

    edit_manifest(package_dir, edit)
    found = static_findings(package_dir)
    (finding,) = only(found, "IV602")
    assert finding.pointer == "/plan/lots/0/price_usd" and finding.severity.value == "warning"
    assert "41.47 USD but the catalog says 47.14 USD" in finding.message
    assert not codes(found) & (FAMILY - {"IV602"})


def test_configured_tariffs_override_the_shipped_catalog(package_dir):
    edit_manifest(package_dir, lambda m: (m["plan"]["lots"][0].update(price_usd=41.47),
                                          m["plan"].update(rental_total_usd=41.47),
                                          m["decision"].pop("cost_per_accepted_usd")))
    package = context(package_dir, tariffs={"RTX 4090": {"3": 41.47}, "2x RTX 4090": {"3": 90}})
    assert tariffs(package)["RTX 4090"] == {"3": 41.47, "7": 110, "30": 390}
    assert "IV602" not in codes(run_checks(package, Selection(), "static"))


def test_78_hours_on_a_3_day_lot_is_IV603(package_dir):
    edit_manifest(package_dir, lambda m: m["timeline"].update(observed_hours=78))
    (finding,) = only(static_findings(package_dir), "IV603")
    assert finding.pointer == "/timeline/observed_hours"
    assert finding.message == ("observed 78 h exceeds the 3-day lot window (72 h) by 6 h: consider the 7-day lot "
                               "(110 USD) or a reduced protocol")


def test_lots_side_by_side_give_the_longest_window_not_the_sum(package_dir):
    def edit(m):
        m["plan"]["lots"].append({"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14})
        m["plan"]["rental_total_usd"] = 94.28
        m["decision"]["cost_per_accepted_usd"] = 47.89  # (94.28 + 1.50) / 2
        m["timeline"].update(observed_hours=100, deviations=[{"hours": 52, "explanation": "slow"}])

    edit_manifest(package_dir, edit)
    found = static_findings(package_dir)
    (finding,) = only(found, "IV603")
    assert "(72 h) by 28 h: consider the 7-day lot (110 USD)" in finding.message
    assert not codes(found) & (FAMILY - {"IV603"})


def test_wrong_cost_per_accepted_run_is_IV604(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"].update(cost_per_accepted_usd=23.57))
    (finding,) = only(static_findings(package_dir), "IV604")
    assert finding.pointer == "/decision/cost_per_accepted_usd"
    assert "48.64 USD (rental + included other expenses) / 2 accepted runs is 24.32 USD" in finding.message


def test_cost_per_accepted_run_stated_with_nothing_accepted_is_IV604(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"].update(outcome="negative", accepted=[]))
    (finding,) = only(static_findings(package_dir), "IV604")
    assert "nothing was accepted" in finding.message and "undefined" in finding.message
    assert "48.64 USD" in finding.message


def test_cost_per_accepted_run_of_zero_is_IV604(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"].update(cost_per_accepted_usd=0))
    (finding,) = only(static_findings(package_dir), "IV604")
    assert "is 0" in finding.message


def test_excluded_expense_is_not_in_the_cost_per_accepted_run(package_dir):
    edit_manifest(package_dir, lambda m: m["plan"]["other_expenses"].append(
        {"label": "team lunch", "usd": 60, "included": False}))
    assert "IV604" not in codes(static_findings(package_dir))


def test_overrun_without_an_explained_deviation_is_IV605(package_dir):
    edit_manifest(package_dir, lambda m: m["timeline"].update(deviations=[]))
    (finding,) = only(static_findings(package_dir), "IV605")
    assert finding.severity.value == "warning" and finding.pointer == "/timeline/deviations"
    assert "+4.5 h to explain, explained deviations add up to +0 h" in finding.message


def test_deviation_without_explanation_does_not_count_is_IV605(package_dir):
    edit_manifest(package_dir, lambda m: m["timeline"]["deviations"][0].update(explanation=" "))
    (finding,) = only(static_findings(package_dir), "IV605")
    assert "4.5 h more listed without an explanation" in finding.message


def test_deviations_within_a_tenth_of_an_hour_are_fine(package_dir):
    edit_manifest(package_dir, lambda m: m["timeline"]["deviations"][0].update(hours=4.45))
    assert "IV605" not in codes(static_findings(package_dir))


def test_reserving_more_than_the_window_is_IV606(package_dir):
    edit_manifest(package_dir, lambda m: m["plan"].update(reserved_hours=80))
    found = static_findings(package_dir)
    (finding,) = only(found, "IV606")
    assert finding.pointer == "/plan/reserved_hours" and "exceeds the window of 72 h by 8 h" in finding.message


def test_window_longer_than_the_lots_is_IV606(package_dir):
    edit_manifest(package_dir, lambda m: m["plan"].update(window_hours=96))
    (finding,) = only(static_findings(package_dir), "IV606")
    assert finding.pointer == "/plan/window_hours" and "the 3-day lot: 72 h" in finding.message


def test_decision_without_summary_is_IV607(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"].pop("summary"))
    (finding,) = only(static_findings(package_dir), "IV607")
    assert finding.pointer == "/decision" and "no summary" in finding.message


def test_no_decision_at_all_is_IV607(package_dir):
    edit_manifest(package_dir, lambda m: m.pop("decision"))
    found = static_findings(package_dir)
    assert len(only(found, "IV607")) == 1
    assert "IV608" not in codes(found)  # one finding for one omission


def test_decision_without_error_analysis_is_IV608(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"].pop("error_analysis"))
    (finding,) = only(static_findings(package_dir), "IV608")
    assert finding.severity.value == "warning"


def test_error_analysis_file_not_delivered_is_IV608(package_dir):
    (package_dir / "analysis/errors.md").unlink()
    (finding,) = only(static_findings(package_dir), "IV608")
    assert "analysis/errors.md is not in the package" in finding.message


def test_accepting_a_run_twice_is_IV609(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"].update(accepted=["control", "lora-r16", "lora-r16"],
                                                              cost_per_accepted_usd=24.32))
    found = static_findings(package_dir)
    (finding,) = only(found, "IV609")
    assert finding.pointer == "/decision/accepted/2" and "twice" in finding.message
    assert "IV604" not in codes(found)  # distinct runs: still 48.64 / 2


def test_accepting_a_replay_of_the_same_configuration_is_IV609(package_dir):
    shutil.copyfile(package_dir / "params/control.json", package_dir / "params/lora-r16.json")
    refresh_hashes(package_dir)
    (finding,) = only(static_findings(package_dir), "IV609")
    assert finding.run == "lora-r16" and "same config_sha256" in finding.message


def test_plan_written_after_the_first_run_started_is_IV610(package_dir):
    edit_manifest(package_dir, lambda m: m["plan"].update(declared_at="2026-11-20T12:00:00Z"))
    (finding,) = only(static_findings(package_dir), "IV610")
    assert finding.severity.value == "warning" and "3 h after run lora-r64 started" in finding.message


def test_no_decision_after_the_pilot_is_IV611(package_dir):
    edit_manifest(package_dir, lambda m: m["timeline"].update(decisions=[]))
    (finding,) = only(static_findings(package_dir), "IV611")
    assert finding.pointer == "/timeline/decisions" and finding.severity.value == "warning"


def test_pilot_decision_left_blank_is_IV611(package_dir):
    edit_manifest(package_dir, lambda m: m["timeline"]["decisions"][0].update(decision=""))
    assert "IV611" in codes(static_findings(package_dir))


# ---- a package written by hand ----------------------------------------------------------------------------

def test_handmade_package_budget_is_clean(tmp_path):
    write_tiny_package(tmp_path / "tiny")
    assert not codes(static_findings(tmp_path / "tiny")) & FAMILY


def test_handmade_package_with_three_accepted_runs_rounds_to_the_cent(tmp_path):
    # 48.64 / 3 = 16.2133… -> 16.21; 16.22 is a cent off
    def edit(manifest, stated):
        manifest["runs"][2].update(status="completed", predictions="predictions/small.jsonl")
        manifest["decision"].update(accepted=["base", "small", "big"], cost_per_accepted_usd=stated)

    write_tiny_package(tmp_path / "ok", lambda m: edit(m, 16.21))
    assert "IV604" not in codes(static_findings(tmp_path / "ok"))
    write_tiny_package(tmp_path / "off", lambda m: edit(m, 16.22))
    assert "IV604" in codes(static_findings(tmp_path / "off"))


def test_handmade_package_with_unreadable_budget_shapes_does_not_crash(tmp_path):
    def edit(manifest):
        manifest["plan"] = {"lots": [None, {"gpu": ["x"], "days": "3", "gpus": [], "price_usd": "47"}],
                            "rental_total_usd": True, "other_expenses": "none", "window_hours": None}
        manifest["timeline"] = {"observed_hours": "52", "deviations": [1, {"hours": None}], "decisions": {}}
        manifest["decision"] = {"cost_per_accepted_usd": float("inf"), "accepted": {}}

    write_tiny_package(tmp_path / "tiny", edit)
    found = codes(static_findings(tmp_path / "tiny"))
    assert "IV611" in found and "IV607" in found
