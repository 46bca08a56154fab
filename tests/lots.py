"""Campaigns on several lots for the tests: each lot recorded by the real recorder in its own folder (a machine),
with real safetensors weights, then sealed as a part by the real verify (no mock anywhere)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from itera_verify import settle, verify
from itera_verify.record import open_campaign

CAMPAIGN = "two-lots"
QUESTION = "Does a LoRA variant reach the control's loss?"
EVAL_IDS = [f"ex-{i}" for i in range(4)]


def lots(*ids: str, gpus: int = 1, days: int = 3) -> list[dict]:
    return [{"id": lot, "gpu": "RTX 4090", "days": days, "gpus": gpus, "price_usd": 47.14} for lot in ids]


LOTS = lots("lot-a", "lot-b")
# lot -> its runs: (id, role, seed)
RUNS = {"lot-a": [("control", "control", 0)], "lot-b": [("lora-r8", "variant", 1), ("lora-r16", "variant", 2)],
        "lot-c": [("lora-r32", "variant", 3)]}


def record_lot(folder: Path, lot: str | None, runs=None, *, plan=None, question: str = QUESTION,
               pilot: bool | None = None, extra_files: dict[str, bytes] | None = None) -> Path:
    """The lot's package at folder/two-lots, as its machine records it."""
    root = Path(folder) / CAMPAIGN
    campaign = open_campaign(root, CAMPAIGN, question, "toy", "v1", eval_ids=EVAL_IDS, lot=lot)
    campaign.declare_plan(lots=plan if plan is not None else LOTS, reserved_hours=4)
    campaign.declare_stop_rules([{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"}])
    (root / "artifacts").mkdir(exist_ok=True)
    for run_id, role, seed in runs if runs is not None else RUNS[lot]:
        run = campaign.start_run(run_id, role, params={"seed": seed, "variant": run_id})
        weights = np.random.default_rng(seed).standard_normal((4, 4)).astype("float32")
        for step in range(1, 4):
            run.log(step, "loss", float(np.abs(weights).mean()) / step)
        save_file({"weight": weights}, str(root / f"artifacts/{run_id}.safetensors"))
        run.artifact(f"artifacts/{run_id}.safetensors", "safetensors")
        with run.predictions() as out:
            for i, eval_id in enumerate(EVAL_IDS):
                out.write(eval_id, int(weights[i].argmax()) + 10 * seed)
        run.complete()
    if pilot if pilot is not None else lot in ("lot-a", None):
        campaign.decision("continue", after="pilot", note="the control trains")
    for rel, data in (extra_files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def seal_part(package: Path, out: Path, *, reload: bool = False, sign: str | None = None, **options) -> Path:
    """The part sealed by `itera-verify PACKAGE --part` (its archive), or AssertionError with the findings."""
    out.mkdir(parents=True, exist_ok=True)
    report = verify(package, settle(part=True, reload=reload, device="cpu", output=f"{out}/",
                                    sign=sign, **options))
    assert report.sealed, [f.to_json() for f in report.findings]
    return Path(report.archive["path"])


def keygen(folder: Path, name: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@example.com", "-f",
                    str(folder / name)], check=True)
    return folder / name


def allowed_signers(path: Path, *keys: Path) -> Path:
    path.write_text("".join(f"{key.name}@example.com {key.with_suffix('.pub').read_text()}" for key in keys))
    return path


def close(package: Path, accepted: list[str], **more) -> dict:
    campaign = open_campaign(package, CAMPAIGN, QUESTION, "toy", "v1", eval_ids=EVAL_IDS)
    return campaign.close("inconclusive", "three steps each: too short to compare.", accepted=accepted,
                          error_analysis="# Errors\n\nToo few steps.\n", **more)
