"""nonfinite_count's summing fast path (issue 17: the finite check was most of a 0.5 B model's reload): a finite
sum proves every value finite, anything else is counted exactly, whatever the dtype and however large the values."""
from __future__ import annotations

import pytest
import torch

from itera_verify.reload.common import nonfinite_count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_count_is_exact_with_the_summing_fast_path(dtype):
    clean = torch.randn(10_000).to(dtype)
    assert nonfinite_count(clean) == 0
    one_nan = clean.clone()
    one_nan[17] = float("nan")
    assert nonfinite_count(one_nan) == 1
    opposite_infinities = clean.clone()
    opposite_infinities[3], opposite_infinities[9] = float("inf"), float("-inf")  # their sum is NaN, not inf
    assert nonfinite_count(opposite_infinities) == 2
    largest = torch.full((1000,), torch.finfo(dtype).max, dtype=dtype)  # finite values whose sum overflows
    assert nonfinite_count(largest) == 0
    largest[500] = float("nan")
    assert nonfinite_count(largest) == 1


def test_a_float32_sum_that_overflows_is_counted_exactly_not_called_non_finite():
    values = torch.full((64,), 3e38, dtype=torch.float32)
    assert not torch.isfinite(values.sum(dtype=torch.float32))  # the fast path alone would be wrong here
    assert nonfinite_count(values) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e5m2])
def test_the_exact_count_adds_up_over_slices_and_reads_non_contiguous_tensors(monkeypatch, dtype):
    import itera_verify.reload.common as common

    monkeypatch.setattr(common, "COUNT_SLICE", 1000)  # 10 slices for a 100 x 100 tensor
    values = torch.ones(100, 100).to(dtype)
    for row, column in ((0, 0), (9, 99), (10, 0), (99, 99)):  # both ends of a slice, the last element
        values[row, column] = float("inf") if dtype is torch.float8_e5m2 else float("nan")
    assert nonfinite_count(values) == 4
    assert nonfinite_count(values.t()) == 4  # a transposed view: not contiguous
    assert nonfinite_count(values[::2]) == 2  # rows 0 and 10: a strided view
