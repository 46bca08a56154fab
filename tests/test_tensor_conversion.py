"""IV512's float conversion (rules/_tensors.py, numpy only) writes the bytes torch's `.to(dtype)` writes: a
differential test against torch over random values and every edge (ties, subnormals, overflow, signed zeros)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from itera_verify.rules._tensors import _decode, encode

TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def edge_values() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    random = torch.randn(200_000, generator=generator) * torch.logspace(-45, 38, 200_000).flip(0).sqrt()
    bits = torch.randint(0, 2**31, (100_000,), generator=generator, dtype=torch.int64).to(torch.int32)
    uniform_bits = bits.view(torch.float32)  # every exponent, ties included (low mantissa bits 0x8000)
    ties = (torch.arange(-5000, 5000, dtype=torch.int32) << 16 | 0x8000).view(torch.float32)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 1e5, -1e5, 3.4e38, -3.4e38, 1e-40, -1e-40,
                            6e-8, 3e-8, 1.4e-45, float("inf"), float("-inf")])
    values = torch.cat([random, uniform_bits, ties, special])
    return values[~torch.isnan(values)]


@pytest.mark.parametrize("source,target", [("F32", "BF16"), ("F32", "F16"), ("BF16", "F16"), ("F16", "BF16"),
                                           ("BF16", "F32"), ("F16", "F32"), ("F32", "F32")])
def test_conversion_is_byte_for_byte_what_torch_writes(source, target):
    original = edge_values().to(TORCH[source])
    original = original[~torch.isnan(original)]
    raw = original.numpy().tobytes() if source != "BF16" else original.view(torch.int16).numpy().tobytes()
    ours = encode(_decode(raw, source), target)
    converted = original.to(TORCH[target])
    theirs = converted.view(torch.int16).numpy().tobytes() if target == "BF16" else converted.numpy().tobytes()
    assert len(ours) == len(theirs)
    if ours != theirs:
        mine = np.frombuffer(ours, np.uint8).reshape(-1, TORCH[target].itemsize)
        torch_bytes = np.frombuffer(theirs, np.uint8).reshape(-1, TORCH[target].itemsize)
        first = int(np.nonzero((mine != torch_bytes).any(axis=1))[0][0])
        pytest.fail(f"value {original[first].item()!r}: ours {mine[first].tobytes().hex()}, "
                    f"torch {torch_bytes[first].tobytes().hex()}")


def test_a_nan_stays_a_nan_in_every_format():
    nan = np.array([np.nan, -np.nan], dtype=np.float32)
    for target in ("F32", "F16", "BF16"):
        back = _decode(encode(nan, target), target)
        assert np.isnan(back).all()
