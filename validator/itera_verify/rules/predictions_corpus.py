"""IV313–IV314: predictions agree with the frozen corpus across runs, and a stopped run delivers none.

The gold label a predictions record carries beside its prediction (`label`, `gold`, ...: format/facts.py) is the
corpus's, not the run's: it is the same for one eval id in every run. Each predictions file is streamed once, the
state bounded by the number of frozen eval ids.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

from ..format import facts as table
from ..model import Finding, Rule, Severity
from ..package import RunContext
from ..package.campaign import indexed_runs, stopped_by_record
from ..package.linerecords import parsed_lines
from .identity import eval_ids_of

RULES = [
    Rule("IV313", Severity.ERROR, "two runs give one eval id different gold labels",
         explain="A predictions record may carry the example's gold label beside the prediction (`label`, "
                 "`gold`, `gold_label`, `target`, `reference`). The gold label belongs to the frozen corpus, "
                 "not to the run: one eval id has one gold label in every run. Two runs that disagree were "
                 "scored against different corpora (another revision, a shuffled label column, a label map "
                 "applied twice), and their scores cannot be compared whatever their ids say. Write the labels "
                 "from the frozen corpus, the same for every run.",
         bad='predictions/control.jsonl: {"id": "ex-7", "prediction": "pos", "label": "pos"}   '
             'predictions/lora.jsonl: {"id": "ex-7", "prediction": "neg", "label": "neg"}',
         good='predictions/lora.jsonl: {"id": "ex-7", "prediction": "neg", "label": "pos"}', since="0.2.0"),
    Rule("IV314", Severity.ERROR, "a stopped run delivers predictions",
         explain="A stopped run ended before its final model existed: it produced no predictions on the frozen "
                 "corpus, and the format gives it `\"predictions\": null`. A predictions file for it (named by the "
                 "manifest, or `predictions/<run>.jsonl`) is another run's, or an early checkpoint's, or the run "
                 "was not stopped: a reviewer cannot tell which, and a copied file looks like a result. Remove "
                 "it; if the run did complete, correct its status and its stop record.",
         bad='{"id": "lora-r64", "status": "stopped", "predictions": "predictions/lora-r64.jsonl"}',
         good='{"id": "lora-r64", "status": "stopped", "predictions": null}', since="0.2.0"),
]

GOLD = table.fact("gold label")
SHOWN = 3
LONG_LABEL = 256  # a longer label (a reference text) is kept as its digest


def check(ctx: RunContext) -> Iterator[Finding]:
    if not ctx.documents.manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    yield from _stopped_runs_deliver_none(ctx)
    yield from _gold_labels_agree(ctx)


def _predictions_file(ctx: RunContext, run: dict, run_id: str | None) -> str | None:
    ref = run.get("predictions")
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    if rel and ctx.inventory.is_file(rel):
        return rel
    conventional = f"predictions/{run_id}.jsonl" if run_id else None
    return conventional if conventional and ctx.inventory.is_file(conventional) else None


def _stopped_runs_deliver_none(ctx: RunContext) -> Iterator[Finding]:
    records = stopped_by_record(ctx)
    for _, run, run_id in indexed_runs(ctx):
        if run.get("status") != "stopped":
            continue  # a stop record for a run not marked stopped is IV407's
        rel = _predictions_file(ctx, run, run_id)
        if rel is None:
            continue
        stop = records.get(run_id, (None, {}))[1]
        at = f" at step {stop['step']}" if isinstance(stop.get("step"), int) else ""
        rule = f" by rule {stop['rule']}" if isinstance(stop.get("rule"), str) else ""
        yield Finding("IV314", rel, run=run_id,
                      message=f"run {run_id} was stopped{at}{rule}, yet {rel} delivers predictions for it: a stopped "
                              "run has no final model to predict with; remove the file (or, if the run completed, "
                              "correct its status and stop record)")


def _label_key(record: dict) -> str | None:
    return next((key for key in GOLD.keys if key in record and record[key] is not None), None)


def _fingerprint(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError):
        text = repr(type(value))  # a label no run writes: nested past what JSON writes back
    return text if len(text) <= LONG_LABEL else "sha256:" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def _gold_labels_agree(ctx: RunContext) -> Iterator[Finding]:
    eval_ids = eval_ids_of(ctx)
    frozen = set(eval_ids.ids) if eval_ids is not None and eval_ids.ids else None
    first: dict[str, tuple[str, str, str]] = {}  # eval id -> (label fingerprint, key, run) of the first run with one
    for _, run, run_id in indexed_runs(ctx):
        if run.get("status") == "stopped":
            continue  # IV314's
        rel = _predictions_file(ctx, run, run_id)
        if rel is None:
            continue
        differ: list[tuple[str, int, str, str, str]] = []  # (id, line, this label, other label, other run)
        count, opening = 0, True
        for line, record, error in parsed_lines(ctx, rel):
            if error or not isinstance(record, dict) or not isinstance(record.get("id"), str):
                continue  # IV104/IV303 report those
            key = _label_key(record)
            if opening and key is None:
                break  # a file whose first record carries no gold label carries none: not read further
            opening = False
            eval_id = record["id"]
            if key is None or (frozen is not None and eval_id not in frozen):
                continue
            label = _fingerprint(record[key])
            known = first.get(eval_id)
            if known is None:
                if frozen is not None or len(first) < 10_000_000:
                    first[eval_id] = (label, key, run_id or rel)
            elif known[0] != label and known[1] == key:
                count += 1
                if len(differ) < SHOWN:
                    differ.append((eval_id, line, label, known[0], known[2]))
        if differ:
            eval_id, line, label, other, other_run = differ[0]
            more = f" ({count} eval ids in all; also {', '.join(d[0] for d in differ[1:])})" if count > 1 else ""
            yield Finding("IV313", rel, line=line, run=run_id,
                          message=f"eval id {eval_id}: {rel} gives the gold label {_short(label)}, run "
                                  f"{other_run}'s predictions {_short(other)}{more}: the runs were scored against "
                                  "different gold labels; write the labels of the frozen corpus, the same for "
                                  "every run")


def _short(label: str) -> str:
    return label if len(label) <= 60 else label[:57] + "..."
