"""`itera-verify init OUTDIR`: a template package to start a campaign from.

Every value the campaign must decide is a placeholder `<...>` saying what goes there. Placeholders are chosen
so that checking the fresh template reports each of them (a schema finding, or the rule the value feeds), and
nothing else: the findings are the to-do list. Values with one sensible default (the format, the stop rules'
usual shape, a catalog lot) are filled in.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..format.names import ID
from ..model import UsageError
from ..version import FORMAT

RUN_ID = ID
PLACEHOLDER = re.compile(r"^\s*<[^<>]*>\s*$")


def is_placeholder(value: Any) -> bool:
    """A template value still waiting to be filled in: a string `<...>`."""
    return isinstance(value, str) and bool(PLACEHOLDER.match(value))


def _fill(what: str) -> str:
    return f"<{what}>"


TIME = "RFC 3339 time with offset, e.g. 2026-11-20T08:00:00Z"
HOURS = "number of hours"


def _run(run_id: str, role: str, params_hint: str) -> dict:
    return {
        "id": run_id, "role": role, "category": "indispensable" if role == "control" else
        _fill("indispensable | useful | exploratory"),
        "status": _fill("completed | stopped"),
        "started_at": _fill(TIME + ", when the run started"),
        "ended_at": _fill(TIME + ", when the run ended"),
        "params": f"params/{run_id}.json",
        "config_sha256": _fill(f"sha256sum params/{run_id}.json, recorded when the run starts ({params_hint})"),
        "metrics": f"metrics/{run_id}.jsonl",
        "predictions": f"predictions/{run_id}.jsonl",
    }


def template_manifest(campaign_id: str) -> dict:
    return {
        "format": FORMAT,
        "campaign_id": campaign_id,
        "question": _fill("the question this campaign answers, with its success threshold, e.g. Does a LoRA "
                          "r=16 variant reach macro-F1 >= 0.80 against the full fine-tune control?"),
        "created_at": _fill(TIME),
        "corpus": {
            "name": _fill("corpus name"),
            "revision": _fill("frozen corpus version: a tag, a commit or a dated snapshot"),
            "eval_ids": "corpus/eval_ids.txt",
            "eval_ids_sha256": _fill("sha256sum corpus/eval_ids.txt, once the eval ids are frozen"),
        },
        "plan": {
            "declared_at": _fill(TIME + ", before the first run starts"),
            "window_hours": 72,
            "reserved_hours": _fill(HOURS + " the plan commits, at most window_hours, leaving a margin"),
            "lots": [{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}],
            "rental_total_usd": 47.14,
            "other_expenses": [{"label": _fill("e.g. object storage"), "usd": _fill("amount in USD"),
                                "included": True}],
        },
        "stop_rules": {
            "declared_at": _fill(TIME + ": write the stop rules before the first run starts"),
            "rules": [
                # `loss` is the name the Trainer logs its step loss under (log_history).
                {"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"},
                {"id": "metric-floor", "kind": "below_threshold", "metric": "eval_macro_f1",
                 "threshold": _fill("floor under which a run is stopped and never accepted, e.g. 0.6")},
                {"id": "truncated", "kind": "truncated_input"},
                {"id": "no-resume", "kind": "no_usable_resume"},
            ],
        },
        "runs": [
            _run("control", "control", "the run the variants are compared with"),
            _run("variant-1", "variant", "rename the run and its files to say what it varies"),
        ],
        "artifacts": [
            {"id": "control-model", "run": "control", "kind": "transformers-model", "path": "artifacts/control-model"},
            {"id": "control-resume", "run": "control", "kind": "resume-checkpoint",
             "path": "checkpoints/control/checkpoint-N"},
            {"id": "variant-1-adapter", "run": "variant-1", "kind": "peft-adapter", "path": "artifacts/variant-1",
             "base": {"name": _fill("hub id of the base model, e.g. org/base-model"),
                      "revision": _fill("40-hex commit of the base model, never a branch such as main")}},
        ],
        "timeline": {
            "observed_hours": _fill(HOURS + " from the start of preparation to the retrieval of the results"),
            "deviations": [{"hours": _fill("signed hours, observed - reserved, this deviation explains"),
                            "explanation": _fill("what took longer or shorter than planned, and why")}],
            "decisions": [{"at": _fill(TIME), "after": "pilot", "decision": _fill("continue | reduce | stop"),
                           "note": _fill("what the pilot showed")}],
        },
        "decision": {
            "outcome": _fill("positive | negative | inconclusive"),
            "summary": _fill("the conclusion in words, with the scores it rests on"),
            "accepted": [],
            "error_analysis": "analysis/errors.md",
            "cost_per_accepted_usd": _fill("(rental + included other expenses) / number of accepted runs, in USD; "
                                           "remove this field when nothing is accepted"),
        },
    }


def template_reload() -> dict:
    return {"artifacts": {
        "control-model": {"loader": "transformers", "class": "AutoModelForCausalLM", "dtype": "float32"},
        "control-resume": {"loader": "hf-trainer-checkpoint", "class": "AutoModelForCausalLM", "dtype": "float32"},
        "variant-1-adapter": {"loader": "peft", "class": "AutoModelForCausalLM", "dtype": "float32"},
    }}


def template_params(run_id: str) -> dict:
    return {"seed": _fill(f"integer seed of run {run_id}"),
            "note": _fill("every parameter the run uses; hash this file into config_sha256 when the run starts")}


# The guide init writes beside the template. Its name and first line say it is the template's, not the
# campaign's: it describes how to fill the template in, so it has no place in the sealed archive (IV107).
TEMPLATE_README = "TEMPLATE-README.md"
README = """\
# itera-verify init template: delete this file before sealing

This file is the guide `itera-verify init` wrote beside the template; it says nothing about your
campaign. Delete it (or replace it by the campaign's own README.md) before sealing: while it is here,
the check warns (IV107).

Every `<...>` value in these files is a placeholder: replace it before the run it concerns.
`itera-verify . --no-reload --no-seal` lists what is still to fill in.

Before the first run starts: the question, the frozen corpus (corpus/eval_ids.txt, its revision and
sha256), the plan (lots, window, reserved hours, declared_at) and the stop rules (with declared_at).
The nonfinite_loss rule watches `loss`, the name the Trainer logs; keep the Trainer's NaN filter off
(logging_nan_inf_filter=False) so a NaN loss is logged as NaN.

Per run, as it runs: params/<run>.json (and its sha256 in config_sha256), metrics/<run>.jsonl
({"step": int, "name": str, "value": number} per line), then predictions/<run>.jsonl (one record per
eval id). A stopped run gets a record in stops.json, with the rule that fired and the reason.

At the end: artifacts and reload.json, the timeline, the decision (with cost_per_accepted_usd) and
analysis/errors.md.
"""

# What init wrote as README.md before it named its guide TEMPLATE-README.md: still recognised (IV107), since
# packages started from that template carry it.
LEGACY_READMES = ("""\
# Campaign package template (itera-output/1)

Every `<...>` value in these files is a placeholder: replace it before the run it concerns.
`itera-verify . --no-reload --no-seal` lists what is still to fill in.

Before the first run starts: the question, the frozen corpus (corpus/eval_ids.txt, its revision and
sha256), the plan (lots, window, reserved hours, declared_at) and the stop rules (with declared_at).

Per run, as it runs: params/<run>.json (and its sha256 in config_sha256), metrics/<run>.jsonl
({"step": int, "name": str, "value": number} per line), then predictions/<run>.jsonl (one record per
eval id). A stopped run gets a record in stops.json, with the rule that fired and the reason.

At the end: artifacts and reload.json, the timeline, the decision and analysis/errors.md.
""",)

FOLDERS = ("params", "metrics", "predictions", "corpus", "analysis")


def document_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def template_files(campaign_id: str, found: list[dict] | None = None) -> dict[str, bytes]:
    """Every file init writes for this campaign id, with its exact bytes (IV107 compares packages with them).
    `found`: the artifacts already in the folder (found_artifacts), listed instead of the examples."""
    manifest = template_manifest(campaign_id)
    reload_spec = template_reload()
    if found:
        manifest["artifacts"] = [{k: v for k, v in a.items() if k != "loader"} for a in found]
        reload_spec = {"artifacts": {a["id"]: {"loader": a["loader"]} for a in found}}
    files = {
        "manifest.json": document_bytes(manifest),
        "stops.json": document_bytes({"stops": []}),
        "reload.json": document_bytes(reload_spec),
    }
    for run in manifest["runs"]:
        files[run["params"]] = document_bytes(template_params(run["id"]))
    files[TEMPLATE_README] = README.encode("utf-8")
    return files


def template_run_ids() -> list[str]:
    return [run["id"] for run in template_manifest("campaign")["runs"]]


# Folders a renter may have copied in before init: their artifacts are listed, each as what its files are.
ARTIFACT_FOLDERS = ("artifacts", "checkpoints")
BASE_KINDS = ("peft-adapter", "diffusers-lora")  # proven on a pinned base: the manifest names it


def found_artifacts(outdir: Path) -> list[dict]:
    """Each entry directly under OUTDIR/artifacts/ whose files say what it is (format/artifact_kinds.py, the
    reading IV510 and the recorder make): its manifest entry (run and base left to fill in) and loader."""
    from .artifact_identity import on_disk

    folder = outdir / "artifacts"
    found = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        rel = f"artifacts/{entry.name}"
        identity = on_disk(entry, rel)
        if identity is None:
            continue
        path = identity.path or rel
        artifact = {"id": _id_from_name(Path(path).stem if entry.is_file() else entry.name),
                    "run": _fill("the run that produced it: control or variant-1"), "kind": identity.kind,
                    "path": path, "loader": identity.loader}
        if identity.kind in BASE_KINDS:
            artifact["base"] = {"name": _fill("hub id of the base, e.g. org/base-model"),
                                "revision": _fill("40-hex commit of the base, never a branch such as main")}
        found.append(artifact)
    return found


def write_template(outdir, campaign_id: str | None = None) -> list[Path]:
    """Write the template into OUTDIR (created; refused when it holds anything but the artifact folders a renter
    copies in first: artifacts/ and checkpoints/, whose artifacts the template lists). Returns the files."""
    outdir = Path(outdir)
    if outdir.exists() and (not outdir.is_dir() or any(
            not (p.is_dir() and not p.is_symlink() and p.name in ARTIFACT_FOLDERS) for p in outdir.iterdir())):
        raise UsageError(f"{outdir}: exists and is not empty; init writes into a new or empty folder only (or one "
                         f"holding only {' and '.join(f + '/' for f in ARTIFACT_FOLDERS)})")
    campaign_id = campaign_id if campaign_id is not None else _id_from_name(outdir.resolve().name)
    if not RUN_ID.fullmatch(campaign_id):
        raise UsageError(f"campaign id {campaign_id!r}: use letters, digits, '.', '_' and '-' (it names the archive)")
    try:
        found = found_artifacts(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        for folder in FOLDERS:
            (outdir / folder).mkdir(exist_ok=True)
        written = []
        for rel, data in template_files(campaign_id, found).items():
            path = outdir / rel
            path.write_bytes(data)
            written.append(path)
    except OSError as exc:
        raise UsageError(f"{outdir}: cannot write the template ({exc.strerror})") from exc
    return written


def _id_from_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:128]
    return cleaned or "campaign"
