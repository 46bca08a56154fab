"""A campaign keeps going (issue 39 item 2): a resume proof that fails after the training has ended (a short run,
the first save at the end, a slow disk) becomes the run's stop record, whenever its result arrives: at
`run.complete()`, which then returns instead of raising, or at the interpreter's exit. The next run starts.

The checkpoint is a real torch-resume file written by torch.save without its optimizer state: the proof (the
very reload `itera-verify` runs, in its background process) finds IV507 in it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

ROOT = Path(__file__).resolve().parents[1]
EVAL_IDS = ["ex-1", "ex-2", "ex-3"]

CAMPAIGN = '''
import torch
from itera_verify.record import open_campaign

def open_it(root):
    campaign = open_campaign(root, "keeps-going", "Does the variant match the control?", "toy", "v1",
                             {eval_ids!r})
    campaign.declare_plan(lots=[{{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}}], reserved_hours=1)
    campaign.declare_stop_rules([{{"id": "nan", "kind": "nonfinite_loss", "metric": "loss"}},
                                 {{"id": "no-resume", "kind": "no_usable_resume"}}])
    return campaign

def short_run(campaign, root):
    """Two steps, its only save at the end, saved without the optimizer state: the proof fails after training."""
    run = campaign.run("short", "variant", params={{"seed": 1}}).start()
    model = torch.nn.Linear(4, 2)
    run.log(1, "loss", 0.9)
    (root / "checkpoints").mkdir(exist_ok=True)
    torch.save({{"model": model.state_dict(), "scheduler": {{}}, "rng": {{}}, "step": 2, "data_state": {{"seen": 8}}}},
               root / "checkpoints" / "short.pt")
    artifact = run.artifact(root / "checkpoints" / "short.pt", "resume-checkpoint")
    run.log(2, "loss", 0.8)
    run.saved(artifact, 2, 0.1, prove_resume="first")
    return run
'''


def write_script(folder: Path, body: str) -> Path:
    script = folder / "campaign.py"
    script.write_text(CAMPAIGN.format(eval_ids=EVAL_IDS) + body)
    return script


def run_script(script: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": f"{ROOT / 'validator'}", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env, capture_output=True, text=True,
                          timeout=600)


def stops(root: Path) -> dict:
    return {s["run"]: s for s in json.loads((root / "stops.json").read_text())["stops"]}


def runs(root: Path) -> dict:
    return {r["id"]: r for r in json.loads((root / "manifest.json").read_text())["runs"]}


def test_a_proof_failing_after_training_stops_the_run_at_complete_and_the_next_run_goes_on(tmp_path):
    script = write_script(tmp_path, '''
from pathlib import Path
root = Path("pkg").absolute()
campaign = open_it(root)
short = short_run(campaign, root)
print("complete:", short.complete(), "stopped:", short.stopped)
following = campaign.run("next", "variant", params={"seed": 2}).start()
following.log(1, "loss", 0.5)
following.write_predictions({"id": i, "prediction": "a"} for i in %r)
print("next complete:", following.complete())
''' % EVAL_IDS)
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "complete: False stopped: True" in done.stdout and "next complete: True" in done.stdout
    assert "did not complete" in done.stderr and "!" * 80 in done.stderr  # said on a framed warning
    root = tmp_path / "pkg"
    stop = stops(root)["short"]
    assert stop["rule"] == "no-resume" and stop["step"] == 2
    assert "checkpoint short-short.pt (step 2)" in stop["reason"]
    assert "IV507" in stop["reason"] and "optimizer" in stop["reason"]
    assert runs(root)["short"]["status"] == "stopped" and runs(root)["next"]["status"] == "completed"
    proof = runs(root)["short"]["checkpoints"][0]["proof"]
    assert proof["ok"] is False and "IV507" in proof["codes"]


def test_a_proof_failing_with_no_complete_call_is_the_stop_record_at_the_interpreters_exit(tmp_path):
    script = write_script(tmp_path, '''
from pathlib import Path
root = Path("pkg").absolute()
short_run(open_it(root), root)
print("script ends")
''')
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-3000:]
    root = tmp_path / "pkg"
    stop = stops(root)["short"]
    assert stop["rule"] == "no-resume" and "IV507" in stop["reason"]
    assert runs(root)["short"]["status"] == "stopped"
