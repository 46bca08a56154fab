"""docs/record.md's example runs as written (on the fixture's tiny base in its hub cache) and the package it
records passes itera-verify with every artifact reloaded; the example stays under 40 lines."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.hub import BASE_MODEL
from tests.test_record_trainer import errors, verify

ROOT = Path(__file__).resolve().parents[1]


def example() -> str:
    text = (ROOT / "docs/record.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert blocks, "docs/record.md has no python example"
    return blocks[0]


def test_the_example_is_under_40_lines():
    assert len(example().strip().splitlines()) < 40


@pytest.mark.slow
def test_the_example_records_a_campaign_that_verifies(tmp_path, hf_cache):
    (tmp_path / "example.py").write_text(example())
    env = dict(os.environ, BASE_MODEL=BASE_MODEL, HF_HUB_CACHE=str(hf_cache), HF_HUB_OFFLINE="1",
               CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = verify(tmp_path / "campaign", hf_cache)
    assert errors(report) == []
    assert sorted((r["artifact"], r["ok"]) for r in report["reloads"]) == [
        ("full-checkpoint-4", True), ("full-model", True), ("lora-r8-adapter", True),
        ("lora-r8-checkpoint-4", True)]
