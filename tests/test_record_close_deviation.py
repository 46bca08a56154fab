"""`campaign.close(..., deviation="why")` computes the deviation hours itself (issue 25): observed - reserved - the
deviations already recorded, so IV605 finds the hours explained without arithmetic by hand."""
from __future__ import annotations

import pytest

from itera_verify.record import RecordError, open_campaign
from tests.helpers import static_findings


def clock(*times):
    ticks = iter(times)
    last = [times[0]]

    def now() -> str:
        last[0] = next(ticks, last[0])
        return last[0]
    return now


def closed(tmp_path, deviation, recorded=()):
    campaign = open_campaign(tmp_path / "pkg", "hours", "Is it on time?", "toy", "v1", ["a"], main_process=True,
                             clock=clock("2026-11-20T08:00:00Z"))
    campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}], reserved_hours=4)
    campaign.declare_stop_rules([{"id": "nan", "kind": "nonfinite_loss", "metric": "loss"}])
    for hours, why in recorded:
        campaign.deviation(hours, why)
    campaign.now = clock("2026-11-20T14:30:00Z")  # 6.5 h after the campaign was created
    return campaign, campaign.close("inconclusive", "nothing run", accepted=[], deviation=deviation)


def test_close_records_the_hours_the_deviations_leave_unexplained(tmp_path):
    campaign, manifest = closed(tmp_path, "the dataset download was throttled", recorded=[(1.0, "a slow start")])
    timeline = manifest["timeline"]
    assert timeline["observed_hours"] == 6.5
    assert timeline["deviations"] == [{"hours": 1.0, "explanation": "a slow start"},
                                      {"hours": 1.5, "explanation": "the dataset download was throttled"}]
    assert not [f for f in static_findings(campaign.root, select=("IV605",)) if f.code == "IV605"]


def test_a_blank_deviation_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(RecordError, match="explanation"):
        closed(tmp_path, "  ")
    assert not (tmp_path / "pkg/analysis").exists()
