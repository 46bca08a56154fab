"""IV612: times out of order. One planted defect per test, in a copy of the real example package.

The clean package: created 2026-11-20T08:00:00Z; lora-r64 ran 09:00-09:41 (stopped 09:40), control 12:30-00:30,
lora-r16 01:00-11:00; the pilot decision at 12:00.
"""
from __future__ import annotations

from fixtures.edit import edit_json, edit_manifest
from tests.handmade import write_tiny_package
from tests.helpers import static_findings


def only(findings, code):
    return [f for f in findings if f.code == code]


def test_clean_package_has_no_timeline_finding(package_dir):
    assert not only(static_findings(package_dir), "IV612")


def test_handmade_package_has_no_timeline_finding(tmp_path):
    assert not only(static_findings(write_tiny_package(tmp_path / "tiny")), "IV612")


def test_run_that_ended_before_it_started_is_IV612(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][1].update(ended_at="2026-11-20T00:30:00Z"))  # a day off
    (finding,) = only(static_findings(package_dir), "IV612")
    assert finding.pointer == "/runs/1/ended_at" and finding.run == "control"
    assert "ended at 2026-11-20T00:30:00Z, 12 h before it started (2026-11-20T12:30:00Z)" in finding.message


def test_run_started_before_the_campaign_was_created_is_IV612(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][2].update(started_at="2026-11-19T01:00:00Z"))
    (finding,) = only(static_findings(package_dir), "IV612")
    assert finding.pointer == "/runs/2/started_at" and finding.run == "lora-r16"
    assert "before the campaign was created (2026-11-20T08:00:00Z)" in finding.message


def test_stop_dated_before_the_campaign_was_created_is_IV612(package_dir):
    edit_json(package_dir, "stops.json", lambda s: s["stops"][0].update(at="2026-11-19T09:40:00Z"))
    found = static_findings(package_dir)
    (finding,) = only(found, "IV612")
    assert finding.path == "stops.json" and finding.pointer == "/stops/0/at"
    assert {f.pointer for f in only(found, "IV408")} == {"/stops/0/at"}  # and before its run started


def test_decision_dated_before_the_campaign_was_created_is_IV612(package_dir):
    edit_manifest(package_dir, lambda m: m["timeline"]["decisions"][0].update(at="2026-11-19T12:00:00Z"))
    (finding,) = only(static_findings(package_dir), "IV612")
    assert finding.pointer == "/timeline/decisions/0/at"


def test_times_in_another_offset_are_compared_as_instants(package_dir):
    # 09:30+02:00 is 07:30Z, before 08:00Z; 10:00+02:00 is 08:00Z, not before.
    edit_manifest(package_dir, lambda m: m.update(created_at="2026-11-20T10:00:00+02:00"))
    assert not only(static_findings(package_dir), "IV612")
    edit_manifest(package_dir, lambda m: m["timeline"]["decisions"][0].update(at="2026-11-20T09:30:00+02:00"))
    assert [f.pointer for f in only(static_findings(package_dir), "IV612")] == ["/timeline/decisions/0/at"]


def test_unreadable_times_are_left_to_the_schema(package_dir):
    edit_manifest(package_dir, lambda m: (m.update(created_at="yesterday"),
                                          m["runs"][1].update(ended_at="soon")))
    found = static_findings(package_dir)
    assert not only(found, "IV612") and only(found, "IV105")
