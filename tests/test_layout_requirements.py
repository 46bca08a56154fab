"""One reading of checkpoint layouts (format/layouts.py): for every layout a real run wrote, each file the layout
requires, planted missing, is reported by the static checks (`--no-reload`, the CI gate) and by the reload under
the same requirement id, and the user sees it once."""
from __future__ import annotations
from dataclasses import replace

import shutil
from pathlib import Path

import pytest
from itera_verify.reload import run_reloads
from itera_verify.rules import reload as reload_rules
from itera_verify.runtime.progress import NULL_PROGRESS

from fixtures.edit import edit_json, refresh_hashes
from fixtures.multigpu import ARTIFACTS
from tests.helpers import context

# (artifact, entry of its checkpoint folder to remove, the requirement id both halves report it under)
CASES = [
    ("ddp-checkpoint", "optimizer.pt", "optimizer"),
    ("ddp-checkpoint", "scheduler.pt", "scheduler"),
    ("ddp-checkpoint", "rng_state_1.pth", "rng:missing"),
    ("ddp-checkpoint", "trainer_state.json", "progress"),
    ("ddp-checkpoint", "model.safetensors", "weights"),
    ("fsdp-checkpoint", "optimizer_0", "fsdp-optimizer:0"),
    ("fsdp-checkpoint", "rng_state_0.pth", "rng:missing"),
    ("ds-trainer-checkpoint", "rng_state_1.pth", "rng:missing"),
]


def plant(package_dir: Path, artifact: str, entry: str) -> None:
    edit_json(package_dir, "params/control.json", lambda p: p.update(world_size=2))  # the run's 2 processes
    refresh_hashes(package_dir)
    target = package_dir / ARTIFACTS[artifact][1] / entry
    shutil.rmtree(target) if target.is_dir() else target.unlink()


@pytest.mark.parametrize("artifact, entry, requirement", CASES, ids=[f"{a}-{e}" for a, e, _ in CASES])
def test_a_missing_required_file_is_seen_without_reload_and_said_once(multigpu_dir, built_multigpu, artifact, entry,
                                                                        requirement):
    plant(multigpu_dir, artifact, entry)
    package = context(multigpu_dir, hf_cache=Path(built_multigpu["hf_cache"]))
    static = [f for f in reload_rules.check(package, phase="static") if f.artifact == artifact]
    assert len(static) == 1 and static[0].code in ("IV507", "IV508"), [(f.code, f.message) for f in static]
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=300, jobs=1,
                                                   progress=NULL_PROGRESS, only={artifact}))
    [result] = package.reloads
    seen = [p.get("requirement") for p in result.facts.get("problems") or []]
    assert requirement in seen, (seen, result.error)  # the reload saw the same requirement...
    again = [f for f in reload_rules.check(package) if f.artifact == artifact and f.code in ("IV507", "IV508")
             and f.message == static[0].message]
    assert again == []  # ...and the rules say it once, from the static phase
