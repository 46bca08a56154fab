"""The GPU path: every artifact reloads on cuda:0, dtypes from reload.json are honoured. Skipped without CUDA."""
from __future__ import annotations
from dataclasses import replace

from pathlib import Path

import pytest
import torch

from fixtures.edit import edit_json
from itera_verify.runtime.progress import NULL_PROGRESS
from itera_verify.reload import resolve_device, run_reloads
from itera_verify.rules import reload as reload_rules
from tests.helpers import context

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def reload_on_cuda(package_dir, hf_cache, *only):
    package = context(package_dir, hf_cache=Path(hf_cache))
    package = replace(package, reloads=run_reloads(package, device="cuda", timeout=300, jobs=4, progress=NULL_PROGRESS,
                                  only=set(only) or None))
    return {r.artifact: r for r in package.reloads}, list(reload_rules.check(package))


def test_auto_picks_cuda():
    assert resolve_device("auto") == "cuda"


def test_every_artifact_reloads_on_cuda(package_dir, hf_cache):
    results, findings = reload_on_cuda(package_dir, hf_cache)
    assert findings == []
    for result in results.values():
        assert result.ok, result.error
        assert result.device == "cuda:0"
        assert result.peak_memory_bytes and result.peak_memory_bytes > 0  # device memory, not RSS
        assert result.facts.get("device_name")


def test_bfloat16_from_reload_json_is_honoured_on_cuda(package_dir, hf_cache):
    for artifact in ("control-model", "lora-r16-adapter"):
        edit_json(package_dir, "reload.json", lambda r, a=artifact: r["artifacts"][a].update(dtype="bfloat16"))
    results, findings = reload_on_cuda(package_dir, hf_cache, "control-model", "lora-r16-adapter")
    assert [f for f in findings if f.code != "IV509"] == []
    assert results["control-model"].facts["dtype"] == "bfloat16"
    assert "bfloat16" in results["control-model"].forward
    assert results["lora-r16-adapter"].ok and results["lora-r16-adapter"].device == "cuda:0"


def test_cli_reload_on_cuda_passes(package_dir, hf_cache):
    from tests.helpers import run_cli

    result = run_cli(package_dir, "--device", "cuda", "--no-seal", "--hf-cache", hf_cache, "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"device": "cuda:0"' in result.stdout
