"""The recorder never follows a link it did not create (issue 23, item 5): for every file it writes, a link
planted where it writes (the file itself, its folder, a folder further up) is refused with a RecordError naming
the package path and its target, and nothing outside the package is truncated, created, appended or changed."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from itera_verify.record import RecordError, open_campaign
from itera_verify.record.lock import package_lock

from tests.test_record_api import EVAL_IDS, QUESTION, campaign_at

CANARY = b"the user's own file: not the recorder's\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the package, with a file the recorder must never touch and a `control/` sub-folder (so
    that a path continued through a linked folder exists there)."""
    folder = tmp_path / "outside"
    (folder / "control").mkdir(parents=True)
    (folder / "canary.txt").write_bytes(CANARY)
    return folder


def snapshot(folder: Path) -> dict:
    """Every entry under `folder` (itself included) with its bytes and mtime: a new file changes its folder's."""
    entries = [folder, *sorted(folder.rglob("*"))]
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in entries}


def plant(package: Path, rel: str, target: Path) -> None:
    """Replace the package path `rel` (if any) by a link to `target`."""
    path = package / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    os.symlink(target, path)


def refused(rel: str, target: Path):
    return pytest.raises(RecordError, match=re.escape(f"{rel} is a link to {target}"))


def started(package: Path):
    campaign = campaign_at(package)
    run = campaign.start_run("control", "control", params={"seed": 1})
    return campaign, run


def completed(package: Path):
    campaign, run = started(package)
    with run.predictions() as stream:
        for i in EVAL_IDS:
            stream.write(i, "yes")
    run.complete()
    return campaign, run


# (what the recorder does, the package path a link is planted at, target under `outside`, stage, action)
WRITERS = [
    ("open writes the manifest", "manifest.json", "canary.txt", None,
     lambda pkg, c, r: campaign_at(pkg)),
    ("open writes the frozen ids", "corpus", ".", None, lambda pkg, c, r: campaign_at(pkg)),
    ("open writes the frozen ids", "corpus/eval_ids.txt", "canary.txt", None, lambda pkg, c, r: campaign_at(pkg)),
    ("open writes the frozen ids", "corpus/eval_ids.txt", "new.txt", None, lambda pkg, c, r: campaign_at(pkg)),
    ("a deviation rewrites the manifest", "manifest.json", "canary.txt", started,
     lambda pkg, c, r: c.deviation(1, "late")),
    ("a stop writes stops.json", "stops.json", "canary.txt", started,
     lambda pkg, c, r: r.stop("nonfinite-loss", 1, "loss became NaN")),
    ("an artifact writes reload.json", "reload.json", "canary.txt", started,
     lambda pkg, c, r: r.artifact(_weights(pkg), "safetensors")),
    ("a start writes the params", "params", ".", started,
     lambda pkg, c, r: c.start_run("variant", "variant", params={"seed": 2})),
    ("a start writes the params", "params/variant.json", "canary.txt", started,
     lambda pkg, c, r: c.start_run("variant", "variant", params={"seed": 2})),
    ("a log appends metrics", "metrics", ".", started, lambda pkg, c, r: r.log(1, "loss", 1.0)),
    ("a log appends metrics", "metrics/control.jsonl", "canary.txt", started, lambda pkg, c, r: r.log(1, "loss", 1.0)),
    ("a log appends metrics", "metrics/control.jsonl", "new.txt", started, lambda pkg, c, r: r.log(1, "loss", 1.0)),
    ("predictions are appended", "predictions", ".", started, lambda pkg, c, r: r.predictions()),
    ("predictions are appended", "predictions/control.jsonl", "canary.txt", started,
     lambda pkg, c, r: r.predictions()),
    ("predictions are appended", "predictions/control.jsonl", "new.txt", started,
     lambda pkg, c, r: r.predictions().write(EVAL_IDS[0], "yes")),
    ("a close writes the error analysis", "analysis", ".", completed,
     lambda pkg, c, r: c.close("inconclusive", "one run", ["control"], error_analysis="# none\n")),
    ("a close writes the error analysis", "analysis/errors.md", "canary.txt", completed,
     lambda pkg, c, r: c.close("inconclusive", "one run", ["control"], error_analysis="# none\n")),
    ("an adapter's pin rewrites adapter_config.json", "adapter/adapter_config.json", "canary.txt", started,
     lambda pkg, c, r: r.adapter("adapter", base="org/base")),
]


def _weights(package: Path) -> Path:
    (package / "weights.safetensors").write_bytes(b"not read by the recorder")
    return package / "weights.safetensors"


@pytest.mark.parametrize("what,rel,target,stage,action", WRITERS,
                         ids=[f"{w[0]}: {w[1]} -> {w[2]}" for w in WRITERS])
def test_a_link_planted_where_the_recorder_writes_is_refused_and_nothing_outside_changes(
        tmp_path, outside, what, rel, target, stage, action):
    package = tmp_path / "pkg"
    campaign, run = stage(package) if stage else (None, None)
    package.mkdir(exist_ok=True)
    plant(package, rel, outside / target)
    before = snapshot(outside)
    with refused(rel, outside / target):
        action(package, campaign, run)
    assert snapshot(outside) == before
    assert (outside / "canary.txt").read_bytes() == CANARY and not (outside / "new.txt").exists()


def test_a_linked_folder_further_up_the_resume_files_path_is_refused(tmp_path, outside):
    from tests.test_record_resume import RESUME, tiny_loop

    _, run = started(tmp_path / "pkg")
    plant(tmp_path / "pkg", "checkpoints", outside)  # checkpoints/control/resume.pt would land in outside/control
    before = snapshot(outside)
    with refused("checkpoints", outside):
        run.resume_file(RESUME, **tiny_loop())
    assert snapshot(outside) == before and not (outside / "control/resume.pt").exists()


def test_a_linked_resume_file_is_refused_and_its_target_kept(tmp_path, outside):
    from tests.test_record_resume import RESUME, tiny_loop

    _, run = started(tmp_path / "pkg")
    plant(tmp_path / "pkg", RESUME, outside / "canary.txt")
    before = snapshot(outside)
    with refused(RESUME, outside / "canary.txt"):
        run.resume_file(RESUME, **tiny_loop())
    assert snapshot(outside) == before


@pytest.mark.parametrize("target", ["canary.txt", "new.txt"])
def test_the_lock_fallback_is_never_opened_through_a_link(tmp_path, outside, target):
    package = tmp_path / "pkg"
    package.mkdir()
    os.symlink(outside / target, tmp_path / ".pkg.itera-lock")
    before = snapshot(outside)
    with refused(str(tmp_path / ".pkg.itera-lock"), outside / target):
        with package_lock(package, folder_lock=False):
            pass
    assert snapshot(outside) == before and not (outside / "new.txt").exists()


def test_a_metrics_file_hard_linked_to_a_users_file_is_never_appended(tmp_path, outside):
    package = tmp_path / "pkg"
    _, run = started(package)
    (package / "metrics").mkdir()
    os.link(outside / "canary.txt", package / "metrics/control.jsonl")
    before = snapshot(outside)
    with pytest.raises(RecordError, match="metrics/control.jsonl has 2 names"):
        run.log(1, "loss", 1.0)
    assert snapshot(outside) == before


def test_a_new_campaign_in_a_folder_with_a_planted_link_is_left_as_it_was(tmp_path, outside):
    """The first step of a new campaign in a folder someone prepared: refused before any document is written,
    so the package holds nothing half-made (no manifest without its frozen ids)."""
    package = tmp_path / "pkg"
    package.mkdir()
    os.symlink(outside, package / "corpus")
    before = snapshot(outside)
    with refused("corpus", outside):
        open_campaign(package, "api-test", QUESTION, "toy", "v1", EVAL_IDS)
    assert [p.name for p in package.iterdir()] == ["corpus"] and snapshot(outside) == before


def test_the_normal_flow_in_a_package_reached_through_a_linked_root_still_records(tmp_path):
    """Only what lies inside the package is refused as a link: the folder the user named may itself be one."""
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "pkg")
    campaign, _ = completed(tmp_path / "pkg")
    campaign.close("inconclusive", "one run", ["control"], error_analysis="# none\n")
    assert (real / "analysis/errors.md").is_file() and (real / "predictions/control.jsonl").is_file()


def test_the_final_model_is_not_saved_into_a_linked_folder(tmp_path, outside):
    from fixtures.artifacts import tiny_gpt2
    from itera_verify.integrations.common import save_final_model

    _, run = started(tmp_path / "pkg")
    plant(tmp_path / "pkg", "artifacts", outside)
    before = snapshot(outside)
    with refused("artifacts", outside):
        save_final_model(run, tiny_gpt2(), "artifacts/control")
    assert snapshot(outside) == before


def test_the_final_model_is_not_saved_over_a_link_inside_its_folder(tmp_path, outside):
    from fixtures.artifacts import tiny_gpt2
    from itera_verify.integrations.common import save_final_model

    _, run = started(tmp_path / "pkg")
    plant(tmp_path / "pkg", "artifacts/control/config.json", outside / "canary.txt")
    before = snapshot(outside)
    with refused("artifacts/control/config.json", outside / "canary.txt"):
        save_final_model(run, tiny_gpt2(), "artifacts/control")
    assert snapshot(outside) == before
