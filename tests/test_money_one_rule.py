"""The recorder and the checker price a campaign with one rule (format/money.py): whatever plan and acceptance
the recorder accepts, the package it writes passes the budget rules (IV6xx) of its own checker."""
from __future__ import annotations

from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from itera_verify.flows.verify import verify
from itera_verify.format.money import cost_per_accepted, money, total_usd
from itera_verify.record import cost_per_accepted as recorded_cost_per_accepted
from itera_verify.record import open_campaign
from itera_verify import settle

EVAL_IDS = ["q-0", "q-1"]
RULES = [{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"}]
# A GPU the shipped catalog does not price: IV602 (catalog price) has nothing to say, every other IV6xx rule runs.
GPU = "Test GPU"


def record(root, prices: list[float], expenses: list[tuple[float, bool]], accepted: int) -> dict:
    campaign = open_campaign(root, "money-test", "Does the variant beat the control?", "toy", "v1", EVAL_IDS)
    campaign.declare_plan(lots=[{"gpu": GPU, "days": 3, "gpus": 1, "price_usd": p} for p in prices],
                          reserved_hours=2,
                          other_expenses=[{"label": f"e{i}", "usd": usd, "included": inc}
                                          for i, (usd, inc) in enumerate(expenses)])
    campaign.declare_stop_rules(RULES)
    for index in range(accepted):
        run = campaign.start_run(f"run-{index}", "control" if index == 0 else "variant", params={"seed": index})
        run.log_dict(1, {"loss": 1.0})
        with run.predictions() as stream:
            for i in EVAL_IDS:
                stream.write(i, "yes")
        run.complete()
        if index == 0:
            campaign.decision("continue", after="pilot")
    return campaign.close("inconclusive", "money sweep", accepted=[f"run-{i}" for i in range(accepted)],
                          error_analysis="# none\n", observed_hours=2)


def budget_codes(root) -> list[str]:
    report = verify(root, settle(reload=False, seal=False))
    # IV614 (info) says the test GPU's lots are unpriced, as it should; the money rules are what is swept.
    return sorted(f"{f.code} {f.message}" for f in report.findings if f.code.startswith("IV6") and f.code != "IV614")


def test_the_reported_disagreements_are_gone(tmp_path):
    # 10.25 USD over 2 accepted runs: a float rounds half to even (5.12), the checker's Decimal half up (5.13).
    manifest = record(tmp_path / "a", [10.25], [], 2)
    assert manifest["decision"]["cost_per_accepted_usd"] == 5.13
    assert budget_codes(tmp_path / "a") == []
    # A catalog price and an included expense: 110 + 1.25 over 2 is 55.625, written 55.63.
    manifest = record(tmp_path / "b", [110], [(1.25, True)], 2)
    assert manifest["decision"]["cost_per_accepted_usd"] == 55.63
    assert budget_codes(tmp_path / "b") == []


def test_the_recorder_writes_with_the_checkers_arithmetic():
    plan = {"lots": [{"price_usd": 0.1}, {"price_usd": 0.2}], "other_expenses": [{"usd": 0.005, "included": True}]}
    # 0.1 + 0.2 + 0.005 is 0.30500000000000005 in floats; exactly 0.305 in decimals, 0.31 at the cent.
    assert total_usd(plan) == Decimal("0.305")
    assert recorded_cost_per_accepted(plan, ["a"]) == money(cost_per_accepted(total_usd(plan), 1)) == 0.31
    assert recorded_cost_per_accepted(plan, ["a", "a"]) == 0.31  # distinct runs
    assert recorded_cost_per_accepted(plan, []) is None


cents = st.integers(min_value=1, max_value=500_000).map(lambda c: c / 100)
odd_amounts = st.decimals(min_value=Decimal("0.001"), max_value=Decimal("5000"), places=3).map(float)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prices=st.lists(st.one_of(cents, odd_amounts), min_size=1, max_size=3),
       expenses=st.lists(st.tuples(st.one_of(cents, odd_amounts), st.booleans()), max_size=3),
       accepted=st.integers(min_value=1, max_value=7))
def test_any_plan_the_recorder_accepts_passes_its_own_budget_rules(tmp_path_factory, prices, expenses, accepted):
    root = tmp_path_factory.mktemp("money") / "pkg"
    manifest = record(root, prices, expenses, accepted)
    assert budget_codes(root) == [], manifest["plan"]
