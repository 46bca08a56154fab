"""IV301–IV308: who is who. Run ids, the control, the frozen corpus, and what each run's files are bound to."""
from __future__ import annotations

import re
from collections import Counter
from typing import Iterator

from ..package import readers
from ..model import Finding, Rule, Severity
from ..package import MANIFEST, STOPS, RunContext, pointer_of
from ..package.campaign import (accepted_entries, filled_text, fmt_ids, indexed_runs, listed, runs_by_id, section,
                                shown, stop_records)
from ._records import file_size

RULES = [
    Rule("IV301", Severity.ERROR, "duplicate run id",
         explain="Every run has its own id: params, metrics, predictions, artifacts, stops and the decision all "
                 "point at runs by id. Two runs with one id make every one of those references ambiguous. Give "
                 "the repeat its own id (a rerun is a new run).",
         bad='"runs": [{"id": "lora-r16", ...}, {"id": "lora-r16", ...}]',
         good='"runs": [{"id": "lora-r16", ...}, {"id": "lora-r16-rerun", ...}]'),
    Rule("IV302", Severity.ERROR, "not exactly one control run",
         explain="A campaign compares one control with its variants. Without a control there is nothing to compare "
                 "with; with two, the comparison is ambiguous. Mark exactly one run `\"role\": \"control\"`.",
         bad='[{"id": "a", "role": "variant"}, {"id": "b", "role": "variant"}]',
         good='[{"id": "a", "role": "control"}, {"id": "b", "role": "variant"}]'),
    Rule("IV303", Severity.ERROR, "predictions do not cover exactly the frozen eval ids",
         explain="Every predictions file holds one record per frozen eval id: no id missing, none twice, none "
                 "that is not in corpus/eval_ids.txt. Otherwise the runs were not scored on the same examples and "
                 "their scores cannot be compared. The finding says how many ids are missing, duplicated or "
                 "unexpected and shows the first few of each.",
         bad='eval_ids.txt: ex-1 ex-2 ex-3   predictions: {"id": "ex-1"} {"id": "ex-1"} {"id": "ex-9"}',
         good='eval_ids.txt: ex-1 ex-2 ex-3   predictions: {"id": "ex-1"} {"id": "ex-2"} {"id": "ex-3"}'),
    Rule("IV304", Severity.ERROR, "params file does not match config_sha256",
         explain="`config_sha256` is the SHA-256 of the run's params file as the run used it. A mismatch means "
                 "the configuration changed after the run: the results belong to a configuration nobody can "
                 "see. A changed configuration needs a new run id; record the hash when the run starts "
                 "(`sha256sum params/<run>.json`).",
         bad='"config_sha256": "9f86d0…" (params/control.json now hashes to 60303a…)',
         good='"config_sha256": "60303a…" (sha256sum params/control.json → 60303a…)'),
    Rule("IV305", Severity.ERROR, "reference to an unknown run id",
         explain="An artifact, a stop record, the decision's accepted list, or a per-run file "
                 "(params/<run>.json, metrics/<run>.jsonl, predictions/<run>.jsonl) names a run that the "
                 "manifest does not list. Usually a typo or a renamed run: fix the id or add the run.",
         bad='"accepted": ["control", "lora-16"]   (the run is "lora-r16")',
         good='"accepted": ["control", "lora-r16"]'),
    Rule("IV306", Severity.ERROR, "corpus not frozen",
         explain="Scores mean something only on a frozen corpus: `corpus.revision` names the corpus version and "
                 "`corpus.eval_ids_sha256` is the SHA-256 of the eval ids file, so a reviewer can prove the "
                 "runs were scored on the same examples. Record both when the corpus is frozen, before the "
                 "first run.",
         bad='"corpus": {"name": "reviews-fr", "eval_ids": "corpus/eval_ids.txt"}',
         good='"corpus": {"name": "reviews-fr", "revision": "v3", "eval_ids": "corpus/eval_ids.txt", '
              '"eval_ids_sha256": "<sha256sum corpus/eval_ids.txt>"}'),
    Rule("IV307", Severity.WARNING, "control run not indispensable",
         explain="The control, the data check and the resume check are what the conclusion cannot do without. A "
                 "control in the `useful` or `exploratory` category is the first thing cut when time runs short, "
                 "and then nothing is left to compare with. Put the control in `indispensable`.",
         bad='{"id": "control", "role": "control", "category": "useful"}',
         good='{"id": "control", "role": "control", "category": "indispensable"}'),
    Rule("IV308", Severity.WARNING, "two runs' predictions are identical",
         explain="Each run's predictions are what its own model said on the frozen eval ids. Two runs whose "
                 "predictions files are byte for byte the same (or that name the same file) look like a copy: "
                 "a copied file proves nothing about the second run, and its scores are the first run's. "
                 "Write the predictions the second run's model made. Two different models that agree on every "
                 "example and write every field alike are possible on a tiny corpus: then say so in the "
                 "analysis (and disable the rule for this package).",
         bad='sha256sum predictions/*  ->  2c4e57… control.jsonl, 2c4e57… lora-r16.jsonl',
         good='sha256sum predictions/*  ->  2c4e57… control.jsonl, 8f73ac… lora-r16.jsonl'),
]

SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
# Per-run files: folder -> suffixes; a file there is named after its run.
RUN_FILES = {"params": (".json",), "metrics": (".jsonl", ".csv"), "predictions": (".jsonl",)}


def check(ctx: RunContext) -> Iterator[Finding]:
    if not ctx.documents.manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    yield from _duplicate_ids(ctx)
    yield from _one_control(ctx)
    yield from _predictions_cover_eval_ids(ctx)
    yield from _params_match_hash(ctx)
    yield from _unknown_run_ids(ctx)
    yield from _corpus_frozen(ctx)
    yield from _control_indispensable(ctx)
    yield from _identical_predictions(ctx)


def _duplicate_ids(ctx: RunContext) -> Iterator[Finding]:
    first_index: dict[str, int] = {}
    for index, _, run_id in indexed_runs(ctx):
        if run_id is None:
            continue
        if run_id in first_index:
            yield Finding("IV301", MANIFEST, pointer=pointer_of(["runs", index, "id"]), run=run_id,
                          message=f"runs {first_index[run_id]} and {index} share the id {run_id!r}: give the "
                                  f"repeat its own id (a rerun is a new run)")
        else:
            first_index[run_id] = index


def _one_control(ctx: RunContext) -> Iterator[Finding]:
    if not isinstance(ctx.documents.manifest.get("runs"), list):
        return
    controls = [(index, run_id) for index, run, run_id in indexed_runs(ctx) if run.get("role") == "control"]
    if not controls and not ctx.options.part:  # a lot's part: the control may have run on another lot
        yield Finding("IV302", MANIFEST, pointer="/runs",
                      message='no control run: mark the run the variants are compared with "role": "control"')
    elif len(controls) > 1:
        names = ", ".join(str(run_id or f"#{index}") for index, run_id in controls)
        yield Finding("IV302", MANIFEST, pointer=pointer_of(["runs", controls[1][0], "role"]),
                      message=f"{len(controls)} control runs ({names}): keep one control and make the others "
                              f'"role": "variant"')


def eval_ids_of(ctx: RunContext) -> readers.EvalIds | None:
    ref = section(ctx.documents.manifest, "corpus").get("eval_ids")
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    return readers.read_eval_ids(ctx, rel) if rel else None


def _predictions_cover_eval_ids(ctx: RunContext) -> Iterator[Finding]:
    eval_ids = eval_ids_of(ctx)
    if eval_ids is None or not eval_ids.ids:
        return  # no frozen ids to compare with: IV101/IV103 say why
    for index, run, run_id in indexed_runs(ctx):
        ref = run.get("predictions")
        rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
        scan = readers.scan_predictions(ctx, rel, eval_ids) if rel else None
        if scan is None or scan.records == 0 or scan.covers_exactly:
            continue  # missing, empty or unparsable files are IV101/IV103/IV104
        problems = []
        if scan.missing_count:
            problems.append(f"{scan.missing_count} missing ({fmt_ids(scan.missing, scan.missing_count)})")
        if scan.duplicate_count:
            ids = [s[0] for s in scan.duplicates]
            problems.append(f"{scan.duplicate_count} duplicate ({fmt_ids(ids, scan.duplicate_count)})")
        if scan.unexpected_count:
            ids = [s[0] for s in scan.unexpected]
            problems.append(f"{scan.unexpected_count} unexpected ({fmt_ids(ids, scan.unexpected_count)})")
        if scan.without_id_count:
            lines = [f"line {n}" for n in scan.without_id_lines]
            problems.append(f"{scan.without_id_count} without an id ({fmt_ids(lines, scan.without_id_count)})")
        yield Finding("IV303", rel, line=scan.first_problem_line, run=run_id,
                      message=f"run {run_id or index}: the predictions do not cover exactly the "
                              f"{eval_ids.unique_count} frozen eval ids of {eval_ids.path}: "
                              + "; ".join(problems) + ". Write one prediction per eval id, each once")


def _params_match_hash(ctx: RunContext) -> Iterator[Finding]:
    for index, run, run_id in indexed_runs(ctx):
        ref = run.get("params")
        rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
        if rel is None or not ctx.inventory.is_file(rel):
            continue  # IV101/IV205 say why
        pointer = pointer_of(["runs", index, "config_sha256"])
        recorded = run.get("config_sha256")
        name = run_id or f"#{index}"
        if not isinstance(recorded, str) or not SHA256.match(recorded.strip()):
            yield Finding("IV304", MANIFEST, pointer=pointer, run=run_id,
                          message=f"run {name}: no SHA-256 of {rel} recorded in config_sha256: record "
                                  f"`sha256sum {rel}` when the run starts")
            continue
        actual = ctx.documents.sha256(rel)
        if recorded.strip().lower() != actual:
            yield Finding("IV304", MANIFEST, pointer=pointer, run=run_id,
                          message=f"run {name}: {rel} hashes to {actual[:12]}… but config_sha256 records "
                                  f"{recorded.strip()[:12]}…: the configuration changed after the run; a changed "
                                  f"configuration needs a new run id")


def _unknown_run_ids(ctx: RunContext) -> Iterator[Finding]:
    known = runs_by_id(ctx)
    if not known:
        return  # no run ids to compare with: the schema reports the runs
    hint = "known runs: " + ", ".join(sorted(known))
    for index, artifact in enumerate(listed(ctx.documents.manifest, "artifacts")):
        if isinstance(artifact, dict) and isinstance(artifact.get("run"), str) and artifact["run"] not in known:
            yield Finding("IV305", MANIFEST, pointer=pointer_of(["artifacts", index, "run"]),
                          artifact=artifact.get("id") if isinstance(artifact.get("id"), str) else None,
                          message=f"artifact {shown(artifact.get('id'), str(index))} belongs to run "
                                  f"{artifact['run']!r}, "
                                  f"which the manifest does not list ({hint})")
    for index, record in stop_records(ctx):
        if isinstance(record.get("run"), str) and record["run"] not in known:
            yield Finding("IV305", STOPS, pointer=pointer_of(["stops", index, "run"]),
                          message=f"stop record {index} names run {record['run']!r}, which the manifest does "
                                  f"not list ({hint})")
    for index, name in accepted_entries(ctx):
        if name not in known:
            yield Finding("IV305", MANIFEST, pointer=pointer_of(["decision", "accepted", index]), run=name,
                          message=f"decision.accepted names run {name!r}, which the manifest does not list "
                                  f"({hint})")
    yield from _orphan_run_files(ctx, known, hint)


def _orphan_run_files(ctx: RunContext, known: dict, hint: str) -> Iterator[Finding]:
    # A file a run references is that run's, whatever its name (and even when the run has no usable id).
    referenced = {ctx.inventory.normalise_ref(run.get(key)) for _, run, _ in indexed_runs(ctx) for key in RUN_FILES
                  if isinstance(run.get(key), str)}
    for folder, suffixes in RUN_FILES.items():
        for rel in ctx.inventory.files_under(folder):
            name = rel[len(folder) + 1:]
            if "/" in name or rel in referenced or not name.endswith(suffixes):
                continue
            stem = name.rsplit(".", 1)[0]
            if stem not in known:
                yield Finding("IV305", rel,
                              message=f"{rel} is named after run {stem!r}, which the manifest does not list "
                                      f"({hint}): add the run or remove the file")


def _corpus_frozen(ctx: RunContext) -> Iterator[Finding]:
    corpus = ctx.documents.manifest.get("corpus")
    if not isinstance(corpus, dict):
        return  # the schema reports a missing corpus section
    if filled_text(corpus.get("revision")) is None:
        yield Finding("IV306", MANIFEST, pointer="/corpus/revision" if "revision" in corpus else "/corpus",
                      message="the corpus has no revision: name the frozen version (a tag, a commit, a dated "
                              "snapshot) in corpus.revision")
    recorded = corpus.get("eval_ids_sha256")
    pointer = "/corpus/eval_ids_sha256" if "eval_ids_sha256" in corpus else "/corpus"
    ref = corpus.get("eval_ids")
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    if not isinstance(recorded, str) or not SHA256.match(recorded.strip()):
        target = rel or "the eval ids file"
        yield Finding("IV306", MANIFEST, pointer=pointer,
                      message=f"no SHA-256 of the eval ids recorded in corpus.eval_ids_sha256: record "
                              f"`sha256sum {target}` when the corpus is frozen")
        return
    if rel is None or not ctx.inventory.is_file(rel):
        return  # IV101 reports the missing eval ids file
    actual = ctx.documents.sha256(rel)
    if recorded.strip().lower() != actual:
        yield Finding("IV306", MANIFEST, pointer=pointer,
                      message=f"{rel} hashes to {actual[:12]}… but corpus.eval_ids_sha256 records "
                              f"{recorded.strip()[:12]}…: the eval ids changed after the corpus was frozen")
    eval_ids = readers.read_eval_ids(ctx, rel)
    if eval_ids is not None and eval_ids.duplicate_count:
        # A frozen corpus names each example once: a repeated id weighs that example twice in every score.
        yield Finding("IV306", rel, message=f"{eval_ids.duplicate_count} eval ids listed more than once "
                                            f"(first: {', '.join(eval_ids.duplicates[:5])}): each example once")


def _control_indispensable(ctx: RunContext) -> Iterator[Finding]:
    for index, run, run_id in indexed_runs(ctx):
        if run.get("role") == "control" and isinstance(run.get("category"), str) \
                and run["category"] != "indispensable":
            yield Finding("IV307", MANIFEST, pointer=pointer_of(["runs", index, "category"]),
                          message=f"control run {run_id or index} is in the {run['category']!r} category: the "
                                  f"control is what the conclusion cannot do without; make it indispensable")


def _identical_predictions(ctx: RunContext) -> Iterator[Finding]:
    """Byte-identical predictions of two runs: files of equal size only are hashed (most packages hash none)."""
    files: list[tuple[int, str, str]] = []  # (run index, run name, predictions path)
    for index, run, run_id in indexed_runs(ctx):
        ref = run.get("predictions")
        rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
        if rel is not None and ctx.inventory.is_file(rel):
            files.append((index, run_id or f"#{index}", rel))
    sizes = Counter(_size(ctx, rel) for _, _, rel in files)
    first_by_digest: dict[str, tuple[str, str]] = {}
    for _index, name, rel in files:
        size = _size(ctx, rel)
        if size == 0 or sizes[size] < 2:
            continue  # an empty file is IV102
        digest = ctx.documents.sha256(rel)
        if digest not in first_by_digest:
            first_by_digest[digest] = (name, rel)
            continue
        other, other_rel = first_by_digest[digest]
        same = (f"run {name} names the same predictions file as run {other} ({rel})" if other_rel == rel else
                f"run {name}'s predictions ({rel}) are byte-identical to run {other}'s ({other_rel})")
        yield Finding("IV308", rel, run=None if name.startswith("#") else name,
                      message=f"{same}: a copied file proves nothing about the second run; write the predictions "
                              f"run {name}'s own model made")


def _size(ctx: RunContext, rel: str) -> int:
    return file_size(ctx, rel) or 0  # 0: not there, compared as such
