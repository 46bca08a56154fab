"""docs/record.md's DDP example runs as written under `torchrun --nproc_per_node 2` (gloo, CPU): without a stop
rank 0 writes the predictions every rank computed; with the ceiling broken at the first step every rank sees
run.stopped and none enters all_gather_object (before, rank 1 did, and the job hung or crashed). Once the example
has left the process group, no gloo thread is left in either rank to race the interpreter's exit."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from fixtures.hub import BASE_MODEL
from tests.helpers import torchrun_two

ROOT = Path(__file__).resolve().parents[1]


def ddp_example() -> str:
    text = (ROOT / "docs/record.md").read_text()
    section = text.split("## Several processes: `run.stopped` and the predictions", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]


# Run after the example: the threads each rank still has once it has left the process group.
THREADS_LEFT = """
import glob, json, os
names = sorted(open(task).read().strip() for task in glob.glob("/proc/self/task/*/comm"))
open(f"threads-{os.environ['RANK']}.json", "w").write(json.dumps(names))
"""


def torchrun(folder: Path, hf_cache: Path, ceiling: float) -> subprocess.CompletedProcess:
    (folder / "train.py").write_text(ddp_example() + THREADS_LEFT)
    env = dict(os.environ, BASE_MODEL=BASE_MODEL, HF_HUB_CACHE=str(hf_cache), HF_HUB_OFFLINE="1",
               CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", CEILING=str(ceiling),
               PYTHONPATH=str(ROOT / "validator"))
    return torchrun_two("train.py", folder, env, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("ceiling, status", [(100.0, "completed"), (0.5, "stopped")])
def test_the_ddp_example_takes_one_branch_on_every_rank(tmp_path, hf_cache, ceiling, status):
    done = torchrun(tmp_path, hf_cache, ceiling)
    assert done.returncode == 0, done.stderr[-3000:]
    # A group left alive (a module imported after init_process_group holds it as a default argument) keeps its
    # gloo threads, which can abort a rank at exit: itera_verify.integrations imports those modules first.
    for rank in (0, 1):
        threads = json.loads((tmp_path / f"threads-{rank}.json").read_text())
        assert not [name for name in threads if "gloo" in name], (rank, threads)
    package = tmp_path / "campaign"
    [run] = json.loads((package / "manifest.json").read_text())["runs"]
    assert run["status"] == status
    predictions = package / "predictions/full.jsonl"
    if status == "completed":  # every eval id once, though each rank computed half of them
        assert sorted(json.loads(line)["id"] for line in predictions.read_text().splitlines()) == \
            [f"ex-{i}" for i in range(4)]
    else:
        assert len(json.loads((package / "stops.json").read_text())["stops"]) == 1
        assert not predictions.exists() or not predictions.read_text().strip()
