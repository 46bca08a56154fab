"""Each run's saves (docs/record.md, report `runs[].saves`) where JUnit and GitHub have room for them (a suite property
per run, a notice per run), and the JSON report with the campaign-time fields (saves, stop records, the rental's
end and its estimates) validating against schemas/report.schema.json, which declares each of them."""
from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from tests.test_renderers import render, sample_report

ROOT = Path(__file__).resolve().parents[1]


def save(step: int, proof: dict | None = None) -> dict:
    return {"artifact": f"control-checkpoint-{step}", "step": step, "saved_at": f"2026-11-20T09:{step:02d}:00Z",
            "write_seconds": 0.25, "bytes": 3 * 2**20, "proof": proof, "reload_seconds": None}


# The shape summary.saves_summary produces for a run of 4 saves every 2 steps whose first proof passed.
SAVES = {"count": 4, "saves": [save(2, {"ok": True, "seconds": 9.8, "codes": [], "error": None}),
                               save(4), save(6), save(8)],
         "interval_steps": 2, "interval_minutes": 2.0, "write_seconds_mean": 0.25, "write_seconds_total": 1.0,
         "bytes_last": 3 * 2**20, "proof_seconds": 9.8, "proof_ok": True, "reload_seconds": 4.5,
         "at_risk_steps": 2, "at_risk_minutes": 2.0, "saving_share": 0.0123}
FAILED = {**SAVES, "count": 1, "saves": [save(2, {"ok": False, "seconds": 3.0, "codes": ["IV504"],
                                                  "error": "optimizer.pt cut short"})],
          "interval_steps": 2, "interval_minutes": None, "proof_ok": False, "proof_seconds": 3.0,
          "reload_seconds": None}
RENTAL = {"ends_at": "2026-11-23T08:00:00Z", "source": "plan.lots[].started_at + days", "seconds_left": 7200.0,
          "package_bytes": 5 * 2**30, "seal_estimate_seconds": 30.5, "push_estimate_seconds": None,
          "rates": {"seal_bytes_per_second": 176_000_000.0,
                    "seal_rate_source": "measured here: sha256 and zstd level 3 of the first 64 MiB",
                    "push_bytes_per_second": None, "push_rate_source": None},
          "fits": True}


def report_with_saves():
    report = sample_report()
    report.runs[0]["saves"] = copy.deepcopy(SAVES)
    report.runs[2]["saves"] = copy.deepcopy(FAILED)  # lora-r64, stopped (it has a stop record)
    report.plan["rental"] = copy.deepcopy(RENTAL)
    return report


def test_junit_holds_one_saves_property_per_run_that_saved():
    root = ET.fromstring(render("junit", report_with_saves()).encode("utf-8"))
    properties = {p.get("name"): p.get("value") for p in root.find("testsuite").find("properties")}
    assert sorted(k for k in properties if k.startswith("saves.")) == ["saves.control", "saves.lora-r64"]
    control = properties["saves.control"]
    assert control.startswith("control: 4 saves, every 2 steps / 2 min, 0.25 s to write each (3.0 MiB)")
    assert "1.2 % of the run spent saving" in control and "at risk 2 steps / 2 min" in control
    assert "early resume proof passed (9.8 s)" in control and "final reload 4.5 s" in control
    assert "early resume proof FAILED (3 s)" in properties["saves.lora-r64"]
    assert "saves." not in render("junit", sample_report())  # no saves recorded, nothing said


def test_github_says_each_runs_saves_in_a_notice():
    lines = render("github", report_with_saves()).splitlines()
    notices = [line for line in lines if line.startswith("::notice title=itera-verify saves of ")]
    assert [n.split("::")[1] for n in notices] == ["notice title=itera-verify saves of control",
                                                    "notice title=itera-verify saves of lora-r64"]
    assert "4 saves, every 2 steps / 2 min" in notices[0] and "1.2 %25 of the run spent saving" in notices[0]  # % escaped
    assert "saves of" not in render("github", sample_report())


def test_a_run_id_cannot_inject_a_workflow_command_through_its_saves_notice():
    report = report_with_saves()
    report.runs[0]["id"] = "evil::warning title=x,y::\nboom"
    lines = render("github", report).splitlines()
    notice = next(line for line in lines if "saves of" in line)
    # The title's `::` and `,` are escaped (they end a property); the message's newline is shown, not obeyed.
    assert notice.split("::")[1] == "notice title=itera-verify saves of evil%3A%3Awarning title=x%2Cy%3A%3A\\nboom"
    assert len(lines) == len(render("github", report_with_saves()).splitlines())  # no line of its own


def schema() -> dict:
    return json.loads((ROOT / "schemas/report.schema.json").read_text())


def test_a_report_with_saves_stops_and_the_rental_validates_against_the_schema():
    document = json.loads(render("json", report_with_saves()))
    assert document["runs"][0]["saves"]["count"] == 4 and document["plan"]["rental"]["fits"] is True
    jsonschema.validate(document, schema())


@pytest.mark.parametrize("spoil", [
    lambda d: d["runs"][0]["saves"].update(count="4"),
    lambda d: d["runs"][0]["saves"]["saves"][0].update(write_seconds=-1),
    lambda d: d["runs"][0]["saves"]["saves"][0]["proof"].update(codes="IV504"),
    lambda d: d["runs"][0]["saves"].update(proof_ok="yes"),
    lambda d: d["plan"]["rental"].update(fits="no"),
    lambda d: d["plan"]["rental"]["rates"].update(seal_bytes_per_second=0),
    lambda d: d["plan"]["rental"].pop("ends_at"),
], ids=["count", "write-seconds", "codes", "proof-ok", "fits", "seal-rate", "ends-at"])
def test_the_schema_declares_the_campaign_time_fields(spoil):
    # Each field is declared with its type: a report that breaks one no longer validates.
    document = json.loads(render("json", report_with_saves()))
    spoil(document)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema())


def test_the_text_report_says_the_seals_rate_and_that_it_was_measured_here():
    text = render("text", report_with_saves())
    assert "estimated 30.5 s at 168 MiB/s (measured here)" in text
    report = report_with_saves()
    report.plan["rental"]["rates"]["seal_rate_source"] = "a prior: nothing here could be read to measure it"
    assert "(a prior)" in render("text", report)
