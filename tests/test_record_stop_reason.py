"""A stop record's reason spells a non-finite value as the metrics file and the checker do (NaN, Infinity,
-Infinity), not as Python prints it (nan, inf): the demo's stop reads "train_loss became NaN at step 3"."""
from __future__ import annotations

import pytest
from itera_verify.record.stoprules import check

RULES = [{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "train_loss"},
         {"id": "f1-floor", "kind": "below_threshold", "metric": "eval_macro_f1", "threshold": 0.6}]


@pytest.mark.parametrize(("value", "spelled"), [(float("nan"), "NaN"), (float("inf"), "Infinity"),
                                                (float("-inf"), "-Infinity")])
def test_a_nonfinite_loss_is_spelled_as_in_json(value, spelled):
    violation = check(RULES, 3, "train_loss", value)
    assert violation.rule == "nonfinite-loss" and violation.reason == f"train_loss became {spelled} at step 3"


def test_a_value_under_the_floor_keeps_its_digits_and_a_nonfinite_one_is_spelled():
    assert check(RULES, 2, "eval_macro_f1", 0.5812).reason == "eval_macro_f1 = 0.5812 at step 2, under the floor 0.6"
    assert check(RULES, 2, "eval_macro_f1", float("nan")).reason.startswith("eval_macro_f1 = NaN at step 2")


def test_a_finite_loss_above_the_floor_breaks_no_rule():
    assert check(RULES, 1, "train_loss", 4.87) is None and check(RULES, 1, "eval_macro_f1", 0.61) is None
