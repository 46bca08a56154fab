"""scripts/gpu-check.sh rehearsed on the CPU (GPU_CHECK_DEVICE=cpu): a lent GPU comes with a few minutes of device
time, so the script's own plumbing (the fixture build, the verify calls, the report it reads) must already work.
Sections 1 and 6 here, on the package and hub cache the session built (GPU_CHECK_PACKAGE: the build step is
`python -m fixtures.build`, which the session fixture and `make demo` run); the mid-size and multi-GPU sections run
in a full rehearsal by hand (about 2 minutes)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_the_gpu_check_rehearses_its_first_section_on_the_cpu(tmp_path, built):
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_MIDSIZE": "0", "GPU_CHECK_MULTIGPU": "0",
           "GPU_CHECK_TESTS": "0", "GPU_CHECK_ISOLATIONS": "auto", "PYTHON": sys.executable,
           "TMPDIR": str(tmp_path),
           "GPU_CHECK_PACKAGE": built["package"], "GPU_CHECK_HF_CACHE": built["hf_cache"]}
    done = subprocess.run(["bash", str(ROOT / "scripts/gpu-check.sh")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert "rehearsal on the CPU" in done.stderr
    # Each artifact's row names how its child started. The spawn pass is the same loop with another flag: left out
    # here (four fresh imports); tests/test_zygote.py runs the command line with --isolation spawn.
    assert sum(line.startswith(("control-", "lora-")) and line.rstrip().endswith("fork")
               for line in out.splitlines()) == 4, out
    assert "-- isolation spawn" not in out
    assert out.count("verdict: pass; findings: []") == 1
    assert "rehearsal: nothing kept" in out
    assert not list((ROOT / "benchmarks/results").glob("gpu-check-*rehearsal*"))
    assert not list(tmp_path.glob("itera-gpu-check.*"))  # its work folder is gone
    assert "== the fixture package built before" in out


def test_a_prebuilt_package_that_is_not_one_is_refused_before_any_work(tmp_path):
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "PYTHON": sys.executable, "TMPDIR": str(tmp_path),
           "GPU_CHECK_PACKAGE": str(tmp_path), "GPU_CHECK_HF_CACHE": str(tmp_path)}
    done = subprocess.run(["bash", str(ROOT / "scripts/gpu-check.sh")], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "GPU_CHECK_PACKAGE needs a built package" in done.stderr, done.stderr
    assert not list(tmp_path.glob("itera-gpu-check.*"))
