"""One campaign on two lots, on each machine (docs/record.md, "Two lots"): the recorder names the lot of every run,
`--part` checks and seals what a lot holds and leaves the rest to the assembled campaign, and each lot's time and
GPUs are judged on their own (IV603, IV613). A campaign on one machine is unchanged."""
from __future__ import annotations

import json
import shutil

import pytest

from itera_verify import audit, settle, verify
from itera_verify.record import RecordError, open_campaign
from tests.helpers import codes
from tests.lots import CAMPAIGN, EVAL_IDS, LOTS, QUESTION, lots, record_lot, seal_part


def check(package, **options):
    return verify(package, settle(reload=False, seal=False, **options))


def errors(report) -> set[str]:
    return {f.code for f in report.blocking()}


# ---- the recorder -------------------------------------------------------------------------------------------------

def test_each_run_a_lot_starts_records_its_lot(tmp_path):
    root = record_lot(tmp_path, "lot-b")
    manifest = json.loads((root / "manifest.json").read_text())
    assert [(r["id"], r["lot"]) for r in manifest["runs"]] == [("lora-r8", "lot-b"), ("lora-r16", "lot-b")]
    assert [lot["id"] for lot in manifest["plan"]["lots"]] == ["lot-a", "lot-b"]
    assert manifest["plan"]["rental_total_usd"] == 94.28


def test_a_machine_of_a_two_lot_plan_that_does_not_say_which_lot_it_is_cannot_start_a_run(tmp_path):
    with pytest.raises(RecordError, match="say which one this machine is"):
        record_lot(tmp_path, None, [("control", "control", 0)])


def test_a_machine_opened_as_a_lot_the_plan_does_not_name_cannot_declare_the_plan(tmp_path):
    with pytest.raises(RecordError, match="'lot-c', which the plan's lots do not name"):
        record_lot(tmp_path, "lot-c")


def test_a_plan_naming_one_lot_twice_is_refused(tmp_path):
    with pytest.raises(RecordError, match="two lots named 'lot-a'"):
        record_lot(tmp_path, "lot-a", plan=lots("lot-a", "lot-a"))


def test_reopening_lot_b_s_folder_as_lot_a_is_refused(tmp_path):
    root = record_lot(tmp_path, "lot-b")
    with pytest.raises(RecordError, match="holds the runs of lot 'lot-b', not 'lot-a'"):
        open_campaign(root, CAMPAIGN, QUESTION, "toy", "v1", eval_ids=EVAL_IDS, lot="lot-a")


def test_a_second_machine_declaring_another_plan_after_its_first_run_is_refused(tmp_path):
    root = record_lot(tmp_path, "lot-b")
    campaign = open_campaign(root, CAMPAIGN, QUESTION, "toy", "v1", eval_ids=EVAL_IDS, lot="lot-b")
    campaign.declare_plan(lots=LOTS, reserved_hours=4)  # the same plan again: a no-op
    with pytest.raises(RecordError, match="the plan cannot change"):
        campaign.declare_plan(lots=lots("lot-a", "lot-b", days=7), reserved_hours=4)


def test_closing_a_lot_s_part_is_refused(tmp_path):
    root = record_lot(tmp_path, "lot-a")
    campaign = open_campaign(root, CAMPAIGN, QUESTION, "toy", "v1", eval_ids=EVAL_IDS, lot="lot-a")
    with pytest.raises(RecordError, match="a campaign closes once"):
        campaign.close("positive", "done", accepted=["control"])
    assert "decision" not in json.loads((root / "manifest.json").read_text())


# ---- a part: checked on its lot, sealed under its lot's name ---------------------------------------------------

def test_a_lot_without_the_control_passes_as_a_part_and_seals_under_its_lot_name(tmp_path):
    archive = seal_part(record_lot(tmp_path, "lot-b"), tmp_path / "out")
    assert archive.name == "two-lots.lot-b.part.tar.zst"
    assert archive.with_name(archive.name + ".sha256").is_file()
    record = check(tmp_path / CAMPAIGN, part=True)
    assert record.plan["part"] == {"lot": "lot-b", "left_to_the_assembled_campaign": [
        "the decision", "exactly one control", "the cost per accepted run"]}


def test_the_same_lot_checked_as_a_whole_campaign_lacks_its_control_and_decision(tmp_path):
    root = record_lot(tmp_path, "lot-b")
    assert {"IV302", "IV607", "IV105"} <= errors(check(root))  # IV105: observed_hours, which the close writes
    assert errors(check(root, part=True)) == set()


def test_a_part_still_needs_everything_a_lot_holds(tmp_path):
    root = record_lot(tmp_path, "lot-b")
    (root / "predictions/lora-r8.jsonl").write_text('{"id": "ex-0", "prediction": 1}\n')
    assert errors(check(root, part=True)) == {"IV303"}


def test_a_part_holding_the_runs_of_two_lots_is_IV616(tmp_path):
    root = record_lot(tmp_path, "lot-b")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["runs"][1]["lot"] = "lot-a"
    (root / "manifest.json").write_text(json.dumps(manifest))
    report = check(root, part=True)
    assert errors(report) == {"IV616"}
    assert "runs of several (lot-b: lora-r8; lot-a: lora-r16)" in report.findings[0].message


def test_a_part_carrying_a_decision_is_IV615(tmp_path):
    root = record_lot(tmp_path, "lot-a")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["decision"] = {"outcome": "positive", "summary": "lot-a alone", "accepted": ["control"]}
    (root / "manifest.json").write_text(json.dumps(manifest))
    report = check(root, part=True)
    assert errors(report) == {"IV615"}
    assert "holds manifest.decision" in report.findings[0].message


def test_a_run_on_a_lot_the_plan_does_not_name_is_IV616(tmp_path):
    root = record_lot(tmp_path, "lot-b")
    manifest = json.loads((root / "manifest.json").read_text())
    for run in manifest["runs"]:
        run["lot"] = "lot-z"
    (root / "manifest.json").write_text(json.dumps(manifest))
    report = check(root, part=True)
    assert codes(report.findings) == {"IV616"}
    assert "ran on lot 'lot-z', which the plan does not name (lot-a, lot-b)" in report.findings[0].message


def test_a_part_is_audited_as_a_part_by_its_name(tmp_path):
    archive = seal_part(record_lot(tmp_path / "lot-b", "lot-b"), tmp_path / "out")
    report = audit(archive, settle(reviewer=True))
    assert report.verdict == "pass", [f.to_json() for f in report.findings]
    renamed = archive.with_name("two-lots.tar.zst")
    shutil.copy(archive, renamed)  # the same bytes under a whole campaign's name: judged as one
    assert {"IV302", "IV607"} <= {f.code for f in audit(renamed, settle(reviewer=True)).blocking()}


# ---- each lot's time and GPUs ------------------------------------------------------------------------------------

def assembled_manifest(tmp_path) -> tuple:
    """A whole campaign on two lots, written as assemble would (the tests change its times)."""
    root = record_lot(tmp_path, "lot-a")
    other = record_lot(tmp_path / "b", "lot-b")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["runs"] += json.loads((other / "manifest.json").read_text())["runs"]
    manifest["artifacts"] += json.loads((other / "manifest.json").read_text())["artifacts"]
    for folder in ("params", "metrics", "predictions", "artifacts"):
        for path in (other / folder).iterdir():
            shutil.copy(path, root / folder / path.name)
    reload = json.loads((root / "reload.json").read_text())
    reload["artifacts"].update(json.loads((other / "reload.json").read_text())["artifacts"])
    (root / "reload.json").write_text(json.dumps(reload))
    manifest["timeline"]["observed_hours"] = 4
    manifest["created_at"] = manifest["plan"]["declared_at"] = manifest["stop_rules"]["declared_at"] = \
        "2026-11-20T00:00:00Z"
    return root, manifest


def timed(manifest, **times) -> dict:
    for run in manifest["runs"]:
        run["started_at"], run["ended_at"] = times[run["id"].replace("-", "_")]
    return manifest


def write(root, manifest):
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_a_lot_busy_past_its_three_days_is_IV603_naming_that_lot(tmp_path):
    root, manifest = assembled_manifest(tmp_path)
    manifest["plan"]["lots"][1]["started_at"] = "2026-11-21T00:00:00Z"  # lot-b bought a day later
    manifest = timed(manifest, control=("2026-11-20T01:00:00Z", "2026-11-20T05:00:00Z"),
                     lora_r8=("2026-11-21T01:00:00Z", "2026-11-22T00:00:00Z"),
                     lora_r16=("2026-11-22T00:00:00Z", "2026-11-24T06:00:00Z"))
    report = check(write(root, manifest))
    found = [f for f in report.findings if f.code == "IV603"]
    assert len(found) == 1 and found[0].pointer == "/plan/lots/1", [f.to_json() for f in report.findings]
    assert "lot lot-b ran 78 h" in found[0].message and "by 6 h" in found[0].message
    lines = {lot["id"]: lot for lot in report.plan["lots"]}
    assert lines["lot-b"]["observed_hours"] == 78 and lines["lot-a"]["observed_hours"] == 4


def test_two_lots_started_a_day_apart_each_within_its_window_pass(tmp_path):
    root, manifest = assembled_manifest(tmp_path)
    manifest["plan"]["lots"][1]["started_at"] = "2026-11-21T00:00:00Z"
    manifest["timeline"]["observed_hours"] = 90  # the campaign spans both lots: more than one lot's 72 h
    manifest["plan"]["reserved_hours"] = 4
    manifest = timed(manifest, control=("2026-11-20T01:00:00Z", "2026-11-22T00:00:00Z"),
                     lora_r8=("2026-11-21T01:00:00Z", "2026-11-22T00:00:00Z"),
                     lora_r16=("2026-11-22T00:00:00Z", "2026-11-23T18:00:00Z"))
    assert "IV603" not in codes(check(write(root, manifest)).findings)


def test_two_runs_at_once_on_a_one_gpu_lot_are_IV613_though_the_other_lot_is_idle(tmp_path):
    root, manifest = assembled_manifest(tmp_path)
    manifest = timed(manifest, control=("2026-11-20T01:00:00Z", "2026-11-20T05:00:00Z"),
                     lora_r8=("2026-11-20T06:00:00Z", "2026-11-20T10:00:00Z"),
                     lora_r16=("2026-11-20T07:00:00Z", "2026-11-20T09:00:00Z"))
    report = check(write(root, manifest))
    found = [f for f in report.findings if f.code == "IV613"]
    assert len(found) == 1 and "but lot lot-b holds 1" in found[0].message
    # The same runs with no lot named: two GPUs bought, two in use, as before.
    for run in manifest["runs"]:
        del run["lot"]
    for lot in manifest["plan"]["lots"]:
        del lot["id"]
    assert "IV613" not in codes(check(write(root, manifest)).findings)


def test_runs_on_two_lots_at_the_same_time_each_on_its_own_gpu_pass(tmp_path):
    root, manifest = assembled_manifest(tmp_path)
    manifest = timed(manifest, control=("2026-11-20T01:00:00Z", "2026-11-20T05:00:00Z"),
                     lora_r8=("2026-11-20T01:00:00Z", "2026-11-20T03:00:00Z"),
                     lora_r16=("2026-11-20T03:00:00Z", "2026-11-20T05:00:00Z"))
    assert "IV613" not in codes(check(write(root, manifest)).findings)


# ---- one machine, as before --------------------------------------------------------------------------------------

def test_a_campaign_on_one_machine_is_checked_as_before(package_dir):
    report = check(package_dir)
    assert not {"IV615", "IV616", "IV617"} & codes(report.findings)
    assert report.plan["lots"] == [] and report.plan["part"] is None
    manifest = json.loads((package_dir / "manifest.json").read_text())
    assert all("lot" not in run for run in manifest["runs"])


def test_a_lot_s_rental_start_is_its_own_machine_s(tmp_path):
    from datetime import UTC, datetime

    root = tmp_path / CAMPAIGN
    campaign = open_campaign(root, CAMPAIGN, QUESTION, "toy", "v1", eval_ids=EVAL_IDS, lot="lot-b")
    campaign.declare_plan(lots=LOTS, reserved_hours=4, started_at=datetime(2026, 11, 21, tzinfo=UTC))
    plan = json.loads((root / "manifest.json").read_text())["plan"]
    assert [lot.get("started_at") for lot in plan["lots"]] == [None, "2026-11-21T00:00:00Z"]
