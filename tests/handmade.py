"""A tiny package written by hand in the shape docs/format.md gives (plain JSON dicts, no fixture builder, no artifacts).

Tests use it to check rules and summaries against values they can read at a glance, independently of the
real example package.
"""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

EVAL_IDS = ["q1", "q2", "q3"]
# Two models' own answers: they differ on q2 (byte-identical files would be a copy, IV308).
PREDICTIONS = {"base": ["yes", "yes", "yes"], "small": ["yes", "no", "yes"]}

PARAMS = {
    "base": {"seed": 1, "lr": 0.001},
    "small": {"seed": 2, "lr": 0.001, "lora_r": 8},
    "big": {"seed": 3, "lr": 0.01, "lora_r": 64},
}

METRICS = {
    "base": [{"step": 1, "name": "loss", "value": 2.0}, {"step": 2, "name": "loss", "value": 1.5},
             {"step": 2, "name": "f1", "value": 0.9}],
    "small": [{"step": 1, "name": "loss", "value": 2.1}, {"step": 2, "name": "loss", "value": 1.7},
              {"step": 2, "name": "f1", "value": 0.85}],
    "big": [{"step": 1, "name": "loss", "value": 3.0}, {"step": 2, "name": "loss", "value": float("nan")}],
}

MANIFEST = {
    "format": "itera-output/1",
    "campaign_id": "tiny",
    "question": "Does a LoRA r=8 variant reach F1 >= 0.8?",
    "created_at": "2026-01-01T08:00:00Z",
    "corpus": {"name": "tiny-corpus", "revision": "r1", "eval_ids": "corpus/eval_ids.txt", "eval_ids_sha256": ""},
    "plan": {
        "declared_at": "2026-01-01T08:00:00Z", "window_hours": 72, "reserved_hours": 10,
        "lots": [{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}],
        "rental_total_usd": 47.14,
        "other_expenses": [{"label": "object storage", "usd": 1.5, "included": True},
                           {"label": "coffee", "usd": 9.99, "included": False}],
    },
    "stop_rules": {"declared_at": "2026-01-01T08:30:00Z", "rules": [
        {"id": "nan", "kind": "nonfinite_loss", "metric": "loss"},
        {"id": "floor", "kind": "below_threshold", "metric": "f1", "threshold": 0.5}]},
    "runs": [
        {"id": "base", "role": "control", "category": "indispensable", "status": "completed",
         "started_at": "2026-01-01T09:00:00Z", "ended_at": "2026-01-01T12:00:00Z",
         "params": "params/base.json", "config_sha256": "", "metrics": "metrics/base.jsonl",
         "predictions": "predictions/base.jsonl"},
        {"id": "small", "role": "variant", "category": "indispensable", "status": "completed",
         "started_at": "2026-01-01T12:00:00Z", "ended_at": "2026-01-01T15:00:00Z",
         "params": "params/small.json", "config_sha256": "", "metrics": "metrics/small.jsonl",
         "predictions": "predictions/small.jsonl"},
        {"id": "big", "role": "variant", "category": "exploratory", "status": "stopped",
         "started_at": "2026-01-01T15:00:00Z", "ended_at": "2026-01-01T15:30:00Z",
         "params": "params/big.json", "config_sha256": "", "metrics": "metrics/big.jsonl", "predictions": None},
    ],
    "artifacts": [],
    "timeline": {"observed_hours": 12, "deviations": [{"hours": 2, "explanation": "slow eval"}],
                 "decisions": [{"at": "2026-01-01T10:00:00Z", "after": "pilot", "decision": "continue"}]},
    "decision": {"outcome": "positive", "summary": "small reaches 0.85 F1, base 0.90; big stopped on NaN loss.",
                 "accepted": ["base", "small"], "error_analysis": "analysis/errors.md",
                 "cost_per_accepted_usd": 24.32},
}

STOPS = {"stops": [{"run": "big", "rule": "nan", "at": "2026-01-01T15:30:00Z", "step": 2,
                    "reason": "loss became NaN at step 2"}]}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_tiny_package(root: Path, manifest_edit=None) -> Path:
    """Write the tiny package at `root`; `manifest_edit(manifest)` may change the manifest before the hashes
    are recorded. Returns `root`."""
    root = Path(root)
    manifest = copy.deepcopy(MANIFEST)
    _write(root / "corpus/eval_ids.txt", "".join(i + "\n" for i in EVAL_IDS))
    for run_id, params in PARAMS.items():
        _write(root / f"params/{run_id}.json", json.dumps(params, indent=2) + "\n")
        _write(root / f"metrics/{run_id}.jsonl", "".join(json.dumps(r) + "\n" for r in METRICS[run_id]))
    for run_id, answers in PREDICTIONS.items():
        _write(root / f"predictions/{run_id}.jsonl",
               "".join(json.dumps({"id": i, "prediction": a}) + "\n" for i, a in zip(EVAL_IDS, answers)))
    _write(root / "analysis/errors.md", "# Errors\n\nq2 is hard for both runs.\n")
    _write(root / "stops.json", json.dumps(STOPS, indent=2) + "\n")
    _write(root / "reload.json", json.dumps({"artifacts": {}}) + "\n")
    sha = lambda rel: hashlib.sha256((root / rel).read_bytes()).hexdigest()  # noqa: E731
    manifest["corpus"]["eval_ids_sha256"] = sha("corpus/eval_ids.txt")
    for run in manifest["runs"]:
        run["config_sha256"] = sha(run["params"])
    if manifest_edit is not None:
        manifest_edit(manifest)
    _write(root / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return root
