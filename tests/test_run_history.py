"""Run histories are read, not assumed (issue 41, IV311/IV312): a run's metrics, its checkpoints' own
trainer_state.json logs and the other runs' records tell one story per run. Real Trainer runs recorded by the
tool's recorder (fixtures/truth.py): a correct crash-and-resume in `clean`, a restart from scratch and a resume from
another run's checkpoint in `planted`; copies of real files for the rest."""
from __future__ import annotations

import shutil
from pathlib import Path

from fixtures.edit import edit_json, edit_manifest, refresh_hashes
from tests.conftest import private_copy
from tests.helpers import static_findings

HISTORY = ("IV311", "IV312")


def history(package: Path, run: str | None = None) -> list:
    return [f for f in static_findings(package, select=HISTORY) if f.code in HISTORY and (run is None
                                                                                          or f.run == run)]


def test_a_correct_crash_and_resume_whose_metrics_repeat_two_steps_is_one_story(built_truth):
    clean = Path(built_truth["clean"])
    steps = [line for line in (clean / "metrics/resumed.jsonl").read_text().splitlines() if '"name": "loss"' in line]
    assert [int(line.split('"step": ')[1].split(",")[0]) for line in steps] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    assert history(clean) == []


def test_a_run_trained_again_from_scratch_under_its_id_is_IV311(built_truth):
    [finding] = history(Path(built_truth["planted"]), "restarted")
    assert (finding.code, finding.path) == ("IV311", "metrics/restarted.jsonl")
    assert "starts over at step 1 after reaching step 4" in finding.message


def test_a_run_resumed_from_another_runs_checkpoint_is_IV312(built_truth):
    [finding] = history(Path(built_truth["planted"]), "borrowed")
    assert (finding.code, finding.path) == ("IV312", "checkpoints/borrowed/checkpoint-6/trainer_state.json")
    assert "resumed from run control's checkpoint" in finding.message and "steps 1-3" in finding.message


def test_a_resume_from_another_runs_checkpoint_declared_in_the_params_passes(built_truth, tmp_path):
    package = private_copy(built_truth["planted"], tmp_path, "planted")
    edit_json(package, "params/borrowed.json",
              lambda params: params.update(init_from="checkpoints/control/checkpoint-3"))
    refresh_hashes(package)
    assert history(package, "borrowed") == []


def test_metrics_copied_from_another_run_disagree_with_the_runs_own_checkpoints_IV312(truth_dir):
    shutil.copy(truth_dir / "metrics/control.jsonl", truth_dir / "metrics/resumed.jsonl")
    [finding] = history(truth_dir, "resumed")
    assert (finding.code, finding.path) == ("IV312", "metrics/resumed.jsonl")
    assert "the metrics are run control's" in finding.message


def test_metrics_copied_from_a_run_with_another_seed_are_IV312_without_any_checkpoint(truth_dir):
    shutil.copy(truth_dir / "metrics/control.jsonl", truth_dir / "metrics/bf16.jsonl")

    def drop_checkpoints(manifest):
        manifest["artifacts"] = [a for a in manifest["artifacts"] if not (a["run"] == "bf16"
                                                                          and a["kind"] == "resume-checkpoint")]
        next(r for r in manifest["runs"] if r["id"] == "bf16").pop("checkpoints")
    edit_manifest(truth_dir, drop_checkpoints)
    shutil.rmtree(truth_dir / "checkpoints/bf16")
    [finding] = history(truth_dir, "bf16")
    assert finding.code == "IV312" and "same loss as run control" in finding.message
    assert "seed (16 and 11)" in finding.message


def test_a_checkpoint_copied_from_another_run_is_IV312(truth_dir):
    own = truth_dir / "checkpoints/resumed/checkpoint-8"
    shutil.rmtree(own)
    shutil.copytree(truth_dir / "checkpoints/control/checkpoint-6", own)
    findings = history(truth_dir, "resumed")
    assert [(f.code, f.path) for f in findings] == [("IV312", "checkpoints/resumed/checkpoint-8/trainer_state.json")]
    assert "its log is run control's" in findings[0].message
