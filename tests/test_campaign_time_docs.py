"""docs/record.md's campaign-time example (a hand-written loop: priced saves, the first one's resume proven in the
background, the four stop rules declared, the rental's start, the training ids) runs as written, and the package
it records verifies without an error, its first save proven."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_record_trainer import errors

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Campaign time"


def example() -> str:
    text = (ROOT / "docs/record.md").read_text()
    section = text[text.index(HEADING):]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]


@pytest.mark.slow
def test_the_campaign_time_example_records_priced_and_proven_saves(tmp_path):
    (tmp_path / "example.py").write_text(example())
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the rental ends at" in done.stderr
    manifest = json.loads((tmp_path / "campaign/manifest.json").read_text())
    first, second = manifest["runs"][0]["checkpoints"]
    assert first["step"] == 20 and first["proof"]["ok"] is True and "proof" not in second
    assert manifest["corpus"]["train_ids"] == "corpus/train_ids.txt"
    verified = subprocess.run([str(ROOT / ".venv/bin/itera-verify"), str(tmp_path / "campaign"), "--no-seal",
                               "--format", "json", "--device", "cpu"], capture_output=True, text=True, timeout=600,
                              check=False)
    report = json.loads(verified.stdout)
    assert errors(report) == [], report["findings"]
    # Only the example's brevity shows (no pilot decision, no deviation explained): nothing of campaign time.
    assert {f["code"] for f in report["findings"]} <= {"IV605", "IV611"}, report["findings"]
    assert report["runs"][0]["saves"]["proof_ok"] is True
