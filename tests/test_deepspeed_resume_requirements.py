"""What DeepSpeed's own resume refuses, the tool refuses (format/layouts.py deepspeed_requirements, one reading for
the static checks and the reload): a missing `latest` (DeepSpeed loads nothing, the Trainer stops), an empty one,
one naming a folder that is not there, a step folder without model states (AssertionError), and under the Trainer
no global_step* entry (deepspeed_load_checkpoint: Can't find a valid checkpoint). Each planted in the multi-GPU
fixture is one static finding (--no-reload) that the reload reports under the same id and the rules say once;
the shared reading is compared with DeepSpeed's real engine.load_checkpoint and the Trainer's
deepspeed_load_checkpoint on 2 gloo processes."""
from __future__ import annotations
from dataclasses import replace

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from itera_verify.format import layouts
from itera_verify.reload import run_reloads
from itera_verify.rules import reload as reload_rules
from itera_verify.runtime.progress import NULL_PROGRESS

from fixtures.multigpu import ARTIFACTS, two_ranks
from tests.helpers import context

STEP = "global_step2"


def no_latest(folder: Path) -> None:
    (folder / "latest").unlink()


def empty_latest(folder: Path) -> None:
    (folder / "latest").write_bytes(b"")


def latest_names_a_missing_folder(folder: Path) -> None:
    (folder / "latest").write_text("global_step9")


def no_model_states(folder: Path) -> None:
    for states in (folder / STEP).glob("*model_states.pt"):
        states.unlink()


def tag_without_global_step(folder: Path) -> None:
    (folder / STEP).rename(folder / "step2")
    (folder / "latest").write_text("step2")


def step_folder_removed(folder: Path) -> None:
    shutil.rmtree(folder / STEP)


def latest_with_a_newline(folder: Path) -> None:
    (folder / "latest").write_text(f"  {STEP}\n")


# (artifact, what the user did, the requirement id both halves report it under)
CASES = [
    ("zero2-checkpoint", no_latest, "deepspeed:latest"),
    ("zero2-checkpoint", empty_latest, "deepspeed:tag"),
    ("zero3-checkpoint", latest_names_a_missing_folder, "deepspeed:tag"),
    ("zero2-checkpoint", no_model_states, "deepspeed:model-states"),
    ("ds-trainer-checkpoint", no_latest, "deepspeed:latest"),
    ("ds-trainer-checkpoint", tag_without_global_step, "deepspeed:global-step"),
    ("ds3-trainer-checkpoint", step_folder_removed, "deepspeed:global-step"),
    ("ds-trainer-checkpoint", no_model_states, "deepspeed:model-states"),
]


def static_and_reload(package_dir: Path, hf_cache: str, artifact: str):
    package = context(package_dir, hf_cache=Path(hf_cache))
    static = [f for f in reload_rules.check(package, phase="static") if f.artifact == artifact]
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=300, jobs=1,
                                                   progress=NULL_PROGRESS, only={artifact}))
    return package, static


@pytest.mark.parametrize("artifact, plant, requirement", CASES, ids=[f"{a}-{p.__name__}" for a, p, _ in CASES])
def test_what_deepspeed_cannot_resume_is_seen_without_reload_and_said_once(multigpu_dir, built_multigpu, artifact,
                                                                           plant, requirement):
    plant(multigpu_dir / ARTIFACTS[artifact][1])
    package, static = static_and_reload(multigpu_dir, built_multigpu["hf_cache"], artifact)
    assert len(static) == 1 and static[0].code == "IV507", [(f.code, f.message) for f in static]
    [result] = package.reloads
    seen = [p.get("requirement") for p in result.facts.get("problems") or []]
    assert seen == [requirement], (seen, result.error)  # the reload stops there, as DeepSpeed does
    reported = [f for f in reload_rules.check(package) if f.artifact == artifact and f.code.startswith("IV50")]
    assert reported == [], [(f.code, f.message) for f in reported]  # said once, by the static phase


@pytest.mark.parametrize("artifact", ["zero2-checkpoint", "ds-trainer-checkpoint"])
def test_a_tag_with_spaces_and_a_trailing_newline_resumes(multigpu_dir, built_multigpu, artifact):
    latest_with_a_newline(multigpu_dir / ARTIFACTS[artifact][1])
    package, static = static_and_reload(multigpu_dir, built_multigpu["hf_cache"], artifact)
    assert static == [] and package.reloads[0].ok, package.reloads[0].error


def names_reading(folder: Path, trainer: bool) -> list[str]:
    """format/layouts.py's reading of a folder, as both halves make it."""
    files = [p.name for p in folder.iterdir() if p.is_file()]
    dirs = [p.name for p in folder.iterdir() if p.is_dir()]
    latest = (folder / "latest").read_bytes()[:layouts.LATEST_READ] if "latest" in files else None
    tag = layouts.deepspeed_tag(latest) if latest is not None else ""
    step_files = [p.name for p in (folder / tag).iterdir()] if tag and tag in dirs else []
    return [need.id for need in layouts.deepspeed_requirements(str(folder), files, dirs, latest, step_files,
                                                               trainer=trainer)]


def test_the_reading_agrees_with_deepspeeds_own_resume(built_multigpu, tmp_path, monkeypatch):
    """Every planted form, resumed by DeepSpeed 0.19.8 (engine.load_checkpoint) and by the Trainer's
    deepspeed_load_checkpoint on 2 gloo processes: the tool finds a requirement unmet exactly where they do not
    resume (DeepSpeed alone resumes a tag that is not global_step<N>; the Trainer does not). The launch leaves
    nothing in the temporary folder (torchelastic's log folders went there)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    clean = Path(built_multigpu["package"]) / ARTIFACTS["zero2-checkpoint"][1]
    plants = [no_latest, empty_latest, latest_names_a_missing_folder, no_model_states, tag_without_global_step,
              latest_with_a_newline, lambda folder: None]
    variants = []
    for index, plant in enumerate(plants):
        folder = tmp_path / f"v{index}"
        shutil.copytree(clean, folder)
        plant(folder)
        variants += [str(folder), f"trainer:{folder}"]
    out = tmp_path / "resumed.json"
    two_ranks(["fixtures.deepspeed_resume", str(clean), str(out), *variants], tmp_path / "resume.log",
              Path(__file__).resolve().parents[1])
    assert list(temporary.iterdir()) == []
    resumed = json.loads(out.read_text())
    for variant in variants:
        trainer = variant.startswith("trainer:")
        unmet = names_reading(Path(variant.removeprefix("trainer:")), trainer)
        assert (resumed[variant] == "resumed") == (unmet == []), (variant, resumed[variant], unmet)
    assert resumed[str(tmp_path / "v4")] == "resumed" and resumed[f"trainer:{tmp_path / 'v4'}"].startswith(
        "refused: ValueError: Can't find a valid checkpoint")
    assert resumed[str(tmp_path / "v0")] == "loaded nothing"
