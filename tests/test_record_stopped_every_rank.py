"""`run.stopped` is the same on every rank (issue 25, docs/record.md): rank 0 decides and records the stop; a rank that
writes nothing learns it from the package (the run's status, read under the lock), so after-training code
(predictions gathered to rank 0) takes the same branch everywhere."""
from __future__ import annotations

from itera_verify.record import open_campaign

RULES = [{"id": "diverged", "kind": "above_threshold", "metric": "loss", "threshold": 6}]


def campaign_for(root, main_process: bool):
    campaign = open_campaign(root, "ranks", "Do the ranks agree?", "toy", "v1", ["a", "b"],
                             main_process=main_process)
    campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}], reserved_hours=1)
    campaign.declare_stop_rules(RULES)
    return campaign


def test_a_rank_that_did_not_decide_sees_the_stop_rank_0_recorded(tmp_path):
    rank0 = campaign_for(tmp_path / "pkg", True).run("control", "control", params={"seed": 1}).start()
    rank1 = campaign_for(tmp_path / "pkg", False).run("control", "control", params={"seed": 1}).start()
    # Each rank logs its own loss: only rank 0's breaks the ceiling, and only rank 0 stops the run.
    assert rank1.log(3, "loss", 5.0) is None
    rank0.stop_for(rank0.log(3, "loss", 7.5))
    assert rank0.stopped and rank1.stopped


def test_no_rank_sees_a_stop_that_did_not_happen(tmp_path):
    rank0 = campaign_for(tmp_path / "pkg", True).run("control", "control", params={"seed": 1}).start()
    rank1 = campaign_for(tmp_path / "pkg", False).run("control", "control", params={"seed": 1}).start()
    rank0.log(3, "loss", 2.0)
    assert not rank0.stopped and not rank1.stopped
