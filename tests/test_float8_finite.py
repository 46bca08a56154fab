"""The 8-bit float formats are checked for NaN and infinity by their bit patterns: torch.isfinite is missing for
most of them and says True for float8_e8m0fnu's NaN byte 0xFF. Real safetensors files, reloaded in a child."""
from __future__ import annotations

import pytest
import torch

from fixtures.artifacts import write_safetensors
from fixtures.edit import edit_json, edit_manifest
from itera_verify.reload.common import SMALL_FLOAT_NONFINITE, nonfinite_count
from tests.test_reload import codes_for, reload

# dtype -> a byte that is NaN (or infinite) in it, and a byte that is a finite number in it
PATTERNS = {
    torch.float8_e4m3fn: (0x7F, 0x38),  # 0x7F/0xFF NaN; 0x38 = 1.0
    torch.float8_e5m2: (0x7C, 0x3C),  # 0x7C +inf, 0x7D..0x7F NaN; 0x3C = 1.0
    torch.float8_e8m0fnu: (0xFF, 0x7F),  # 0xFF NaN; 0x7F = 2**0
    torch.float8_e4m3fnuz: (0x80, 0x40),  # 0x80 NaN (the only one)
    torch.float8_e5m2fnuz: (0x80, 0x40),
}
ARTIFACT = "control-model"
REL = "artifacts/f8/weights.safetensors"


def tensor_of(dtype, byte: int, count: int = 16):
    data = torch.full((count,), 0x38 if dtype is torch.float8_e4m3fn else 0x40, dtype=torch.uint8)
    data[5] = byte
    return data.view(dtype)


@pytest.mark.parametrize("dtype", list(PATTERNS), ids=lambda d: str(d).removeprefix("torch."))
def test_every_byte_pattern_is_judged_like_the_widened_value(dtype):
    every = torch.arange(256, dtype=torch.uint8).view(dtype)
    widened = int((~torch.isfinite(every.float())).sum())  # torch converts float8 to float32 correctly
    assert widened > 0 and nonfinite_count(every) == widened


def test_float4_has_no_nonfinite_pattern():
    assert SMALL_FLOAT_NONFINITE["float4_e2m1fn_x2"] is None
    assert nonfinite_count(torch.arange(256, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)) == 0


def as_safetensors_artifact(package_dir, tensors: dict) -> None:
    path = package_dir / REL
    path.parent.mkdir(parents=True)
    write_safetensors(path, tensors, metadata={"format": "pt"})
    edit_manifest(package_dir, lambda m: m["artifacts"][0].update(kind="safetensors", path=REL))
    edit_json(package_dir, "reload.json", lambda r: r["artifacts"][ARTIFACT].update(loader="safetensors")
              or r["artifacts"][ARTIFACT].pop("dtype", None))


@pytest.mark.parametrize("dtype", list(PATTERNS), ids=lambda d: str(d).removeprefix("torch."))
def test_a_nan_byte_in_a_float8_safetensors_file_is_IV504(package_dir, hf_cache, dtype):
    nan_byte, _ = PATTERNS[dtype]
    as_safetensors_artifact(package_dir, {"w.finite": tensor_of(dtype, PATTERNS[dtype][1]),
                                          "w.poisoned": tensor_of(dtype, nan_byte)})
    assert (package_dir / REL).read_bytes().count(bytes([nan_byte])) >= 1
    results, findings = reload(package_dir, hf_cache, ARTIFACT)
    assert codes_for(findings, ARTIFACT) == ["IV504"], [f.message for f in findings]
    message = next(f.message for f in findings if f.artifact == ARTIFACT)
    assert "w.poisoned" in message and "non-finite" in message and "w.finite" not in message


def test_finite_float8_safetensors_of_every_format_reload(package_dir, hf_cache):
    as_safetensors_artifact(package_dir, {str(dtype).removeprefix("torch."): tensor_of(dtype, finite)
                                          for dtype, (_, finite) in PATTERNS.items()})
    results, findings = reload(package_dir, hf_cache, ARTIFACT)
    assert results[ARTIFACT].ok and codes_for(findings, ARTIFACT) == [], [f.message for f in findings]
