"""IV101–IV106: the package's structure. Required items present, not empty, parsable, valid, references real."""
from __future__ import annotations

import difflib
import json
import math
from pathlib import PurePosixPath
from typing import Iterator

from ..format.layouts import WEIGHT_INDEXES
from ..format.parts import CLOSING_FIELDS
from ..package.jsonpos import line_of, pointer_lines
from ..package.jsonread import validate
from ..package.layout import FIXED_DOCUMENTS, document_kinds, references
from ..model import Finding, Rule, Severity
from ..package import MANIFEST, RELOAD, RunContext, pointer_of
from ..package import readers
from ..package.schemas import validator
from ..package.campaign import numbers_out_of_range

# Relative CPU time on a package of many files; run_checks balances its processes by it.
COST = 100  # parses every JSON document and validates every JSONL line
SPLIT = True  # check(ctx, part=(index, count)): its files are shared over the processes

RULES = [
    Rule("IV101", Severity.ERROR, "required item missing",
         explain="The package must hold manifest.json, stops.json, reload.json, the frozen eval ids, and for every "
                 "run its params and raw metrics, plus predictions for every completed run. A reviewer cannot "
                 "judge a run whose inputs or outputs are not delivered. IV101 is an item not named at all (or a "
                 "fixed document absent); a named file that is not there is IV106.",
         bad='{"id": "control", "status": "completed", "predictions": null}',
         good='{"id": "control", "status": "completed", "predictions": "predictions/control.jsonl"}'),
    Rule("IV102", Severity.ERROR, "empty file (0 bytes)",
         explain="A 0-byte file is almost always a write that never happened: a crashed save, a full disk, "
                 "a copy interrupted before the rental ended. Re-create it or remove it.",
         bad="predictions/lora-r16.jsonl  (0 bytes)", good="predictions/lora-r16.jsonl  (812 KiB, 2000 records)"),
    Rule("IV103", Severity.ERROR, "file empty in substance",
         explain="A document that parses but says nothing: `{}`, `[]`, `null`, whitespace only, a JSONL file "
                 "with no record, a CSV with only its header. `{\"stops\": []}` is a valid stops.json.",
         bad='metrics/control.csv:\n  step,name,value',
         good='metrics/control.csv:\n  step,name,value\n  10,train_loss,2.31'),
    Rule("IV104", Severity.ERROR, "file does not parse",
         explain="A JSON, JSONL, CSV or YAML file that does not parse cannot be read by the reviewer's tools. "
                 "The finding gives the line and column of the first error in the file (per line for JSONL).",
         bad='{"seed": 13,}', good='{"seed": 13}'),
    Rule("IV105", Severity.ERROR, "document violates its schema",
         explain="manifest.json, stops.json, reload.json and each params file follow the JSON Schemas shipped "
                 "with the tool (schemas/*.schema.json). The finding names the JSON pointer of the offending "
                 "value. Unknown extra fields are allowed. A number in the manifest must be finite (NaN and "
                 "Infinity are not JSON) and sane: money at most 10,000,000 USD, hours at most 100,000, a lot "
                 "at most 3,650 days and 100,000 GPUs, a threshold within 1e15; the budget and threshold "
                 "rules cannot judge anything else.",
         bad='{"id": "control", "role": "baseline"}', good='{"id": "control", "role": "control"}'),
    Rule("IV106", Severity.ERROR, "referenced path does not exist",
         explain="The manifest (params, metrics, predictions, eval ids, artifact paths, the error analysis) or "
                 "reload.json names a path that is not in the package. Fix the reference or deliver the file. "
                 "When an entry of the same kind exists under a near name (`lora_r4` for `lora-r4`) that nothing "
                 "else names, the finding suggests it.",
         bad='{"id": "control-model", "path": "artifacts/control-model"}  (no such folder)',
         good='{"id": "control-model", "path": "artifacts/control"}  (the folder exists)'),
]

SCHEMA_OF = {"manifest": "manifest", "stops": "stops", "reload": "reload", "params": "params"}
# Artifact documents whose emptiness or syntax breaks a reload; other JSON files are only parsed.
ARTIFACT_DOCUMENTS = ("config.json", "adapter_config.json", "trainer_state.json", "model.safetensors.index.json",
                      "generation_config.json")
MAX_PARSE_BYTES = 256 << 20
# JSON files some rule reads the values of (ctx.documents.document / json_value across rules/), in any folder, besides
# the documents of a kind: built as Python objects (within jsonread.MAX_VALUES). Any other JSON file (a
# tokenizer.json, an analysis output) is only validated, by simdjson, and never built.
READ_DOCUMENTS = frozenset((*ARTIFACT_DOCUMENTS, *WEIGHT_INDEXES))


def check(ctx: RunContext, part: tuple[int, int] = (0, 1)) -> Iterator[Finding]:
    """`part` (index, count): the package-wide findings go to the first and last parts, each file's to the part
    holding it (files in order, split by their estimated cost): the parts in order give the whole."""
    index, count = part
    if index == 0:
        yield from _missing(ctx)
        for entry in ctx.inventory.files.values():
            if entry.size == 0:
                yield Finding("IV102", entry.path, message="empty file (0 bytes)")
    kinds = document_kinds(ctx)
    for rel in _part_of_files(ctx, index, count):
        if ctx.inventory.files[rel].size == 0:
            continue
        yield from _parse_and_substance(ctx, rel, kinds.get(rel))
    if index == count - 1:
        for rel, kind in sorted(kinds.items()):
            if kind in SCHEMA_OF:
                # A number out of range is said once, with its sane range, not also as the schema's minimum.
                numbers = list(_manifest_numbers(ctx)) if rel == MANIFEST else []
                said = {f.pointer for f in numbers}
                yield from (f for f in _schema(ctx, rel, SCHEMA_OF[kind]) if f.pointer not in said)
                yield from numbers
        yield from _dangling(ctx)


PARSED_SUFFIXES = ("json", "jsonl", "csv", "yaml", "yml")
PER_FILE_COST = 20_000  # parsing a small document costs about as much as validating 20 kB of JSONL


def _part_of_files(ctx: RunContext, index: int, count: int) -> list[str]:
    """The files of part `index` of `count`: consecutive in name order, with about equal parsing costs."""
    files = sorted(ctx.inventory.files)
    if count == 1:
        return files
    weights = [PER_FILE_COST + ctx.inventory.files[rel].size if rel.rsplit(".", 1)[-1].lower() in PARSED_SUFFIXES
               else PER_FILE_COST // 20 for rel in files]
    total, running, bounds = sum(weights), 0, [0]
    for position, weight in enumerate(weights):
        running += weight
        while len(bounds) < count and running * count >= total * len(bounds):
            bounds.append(position + 1)
    bounds += [len(files)] * (count + 1 - len(bounds))
    return files[bounds[index]:bounds[index + 1]]


def _missing(ctx: RunContext) -> Iterator[Finding]:
    for rel in FIXED_DOCUMENTS:
        if not ctx.inventory.exists(rel):
            yield Finding("IV101", rel, message=f"{rel} is missing")
    if not ctx.inventory.is_file(MANIFEST):
        return
    manifest = ctx.documents.manifest
    corpus = manifest.get("corpus")
    if isinstance(corpus, dict) and not isinstance(corpus.get("eval_ids"), str):
        yield Finding("IV101", MANIFEST, pointer="/corpus/eval_ids", message="no frozen eval ids file named")
    runs = manifest.get("runs")
    for index, run in enumerate(runs if isinstance(runs, list) else []):
        if not isinstance(run, dict):
            continue
        run_id = run.get("id") if isinstance(run.get("id"), str) else None
        for key in ("params", "metrics", "predictions"):
            if key == "predictions" and run.get("status") != "completed":
                continue
            if not isinstance(run.get(key), str):
                what = "predictions for a completed run" if key == "predictions" else key
                yield Finding("IV101", MANIFEST, pointer=pointer_of(["runs", index, key]), run=run_id,
                              message=f"run {run_id or index}: no {what} file named")
    for ref in references(ctx):
        rel = ctx.inventory.normalise_ref(ref.value)
        if ref.required and rel is not None and ctx.inventory.exists(rel) and not ctx.inventory.is_file(rel):
            what = "a folder" if rel in ctx.inventory.dirs else "a link or a special file"
            yield Finding("IV101", MANIFEST, pointer=ref.pointer, run=ref.run,
                          message=f"{ref.kind.replace('_', ' ')} file {ref.value} is {what}, not a file in the "
                                  f"package")


SUGGESTED_AT_MOST = 20  # near-name searches per package: each compares with the package's paths


def _dangling(ctx: RunContext) -> Iterator[Finding]:
    """IV106: a named path that is not there (IV101 is for an item not named at all). When an entry of the same
    kind exists under a near name (`lora_r4` for `lora-r4`), the message names it."""
    refs = [(ref, ctx.inventory.normalise_ref(ref.value)) for ref in references(ctx)]
    entries = ctx.documents.reload_spec.get("artifacts")
    reload_refs = [(artifact_id, entry["path"], ctx.inventory.normalise_ref(entry["path"]))
                   for artifact_id, entry in (entries.items() if isinstance(entries, dict) else [])
                   if isinstance(entry, dict) and isinstance(entry.get("path"), str)]
    named = {rel for _, rel in refs if rel} | {rel for _, _, rel in reload_refs if rel}
    near = _NearNames(ctx, named)
    for ref, rel in refs:
        if rel is not None and not ctx.inventory.exists(rel):
            what = f"{ref.kind.replace('_', ' ')} {'file' if ref.required else 'path'}"
            yield Finding("IV106", MANIFEST, pointer=ref.pointer, run=ref.run,
                          message=f"{what} {ref.value} does not exist in the package{near.hint(rel)}")
    for artifact_id, value, rel in reload_refs:
        if rel is not None and not ctx.inventory.exists(rel):
            yield Finding("IV106", RELOAD, pointer=pointer_of(["artifacts", artifact_id, "path"]),
                          artifact=artifact_id,
                          message=f"path {value} does not exist in the package{near.hint(rel)}")


class _NearNames:
    """Entries of the package a missing reference probably meant: the same suffix, the same depth, a close
    spelling (difflib), and not named by another reference already."""

    def __init__(self, ctx: RunContext, named: set[str]):
        self.inventory, self.named, self.searches = ctx.inventory, named, 0

    def hint(self, rel: str) -> str:
        if self.searches >= SUGGESTED_AT_MOST:
            return ""
        self.searches += 1
        suffix, depth = PurePosixPath(rel).suffix, rel.count("/")
        candidates = [p for group in (self.inventory.files, self.inventory.dirs, self.inventory.links) for p in group
                      if p.count("/") == depth and PurePosixPath(p).suffix == suffix and p not in self.named]
        match = difflib.get_close_matches(rel, candidates, n=1, cutoff=0.8)
        return f" (did you mean {match[0]}?)" if match else ""


def _parse_and_substance(ctx: RunContext, rel: str, kind: str | None) -> Iterator[Finding]:
    name = rel.rsplit("/", 1)[-1]
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if kind in ("metrics", "predictions") or (suffix in ("jsonl", "csv") and kind is None):
        yield from _records(ctx, rel, kind, suffix)
    elif suffix == "json" and ctx.inventory.files[rel].size <= MAX_PARSE_BYTES:
        if not (kind or name in READ_DOCUMENTS):
            yield from _validated(ctx, rel)
            return
        doc = ctx.documents.document(rel)
        if doc.error:
            yield _unparsable(rel, doc.error)
        elif doc.value in ({}, [], None):
            yield Finding("IV103", rel, message=f"the document is {json.dumps(doc.value)}: nothing in it")
    elif suffix in ("yaml", "yml") and ctx.inventory.files[rel].size <= MAX_PARSE_BYTES:
        yield from _yaml(ctx, rel)
    elif kind in ("eval_ids", "analysis") and not ctx.documents.read_bytes(rel).strip():
        yield Finding("IV103", rel, message="whitespace only")


def _unparsable(rel: str, error) -> Finding:
    if error.too_large:
        return Finding("IV104", rel, message=f"the document {error.message}")
    return Finding("IV104", rel, line=error.line, column=error.column, message=f"invalid JSON: {error.message}")


def _validated(ctx: RunContext, rel: str) -> Iterator[Finding]:
    """A JSON file whose values no rule reads: simdjson validates it without building anything. What it refuses
    (or cannot check) json.loads decides, which also takes NaN and big integers and places the error: within
    jsonread.MAX_VALUES only; past it, a refused document is said invalid without a position, an unchecked one
    not at all (as a file past MAX_PARSE_BYTES)."""
    doc = ctx.documents.parsed(rel)
    if doc is None:
        why = validate(ctx.documents.path(rel), ctx.inventory.files[rel].size)
        if why is None:
            return
        doc = ctx.documents.document(rel)
        if doc.error and doc.error.too_large:
            if why != "unchecked":
                yield Finding("IV104", rel, message=f"invalid JSON: {why} (no line given: the document "
                                                    f"{doc.error.message})")
            return
    if doc.error:
        yield _unparsable(rel, doc.error)


def _records(ctx: RunContext, rel: str, kind: str | None, suffix: str) -> Iterator[Finding]:
    """JSONL/CSV: parse errors per line, and a file with no record."""
    if kind == "predictions":
        eval_ids = _eval_ids(ctx)
        scan = readers.scan_predictions(ctx, rel, eval_ids)
        header_only = False
    elif kind == "metrics" or suffix in ("jsonl", "csv"):
        scan = readers.scan_metrics(ctx, rel) if kind == "metrics" else readers.scan_generic(ctx, rel)
        header_only = getattr(scan, "header_only", False)
    for error in scan.errors[:20]:
        yield Finding("IV104", rel, line=error.line, column=error.column, message=error.message)
    total = getattr(scan, "error_count", len(scan.errors))  # readers keep a bounded sample of the errors
    if total > 20:
        yield Finding("IV104", rel, message=f"{total - 20} more lines do not parse")
    if scan.records == 0 and not scan.errors:
        what = "a CSV header and no record" if header_only else "no record"
        yield Finding("IV103", rel, message=f"{what}: the file says nothing")


def _eval_ids(ctx: RunContext):
    corpus = ctx.documents.manifest.get("corpus")
    ref = corpus.get("eval_ids") if isinstance(corpus, dict) else None
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    return readers.read_eval_ids(ctx, rel) if rel and ctx.inventory.is_file(rel) else None


def _yaml(ctx: RunContext, rel: str) -> Iterator[Finding]:
    import yaml  # here, not at import: beside a seal the checks' child pays it, not the command's start

    try:
        text = ctx.documents.read_bytes(rel).decode("utf-8")
        yaml.safe_load(text)
    except UnicodeDecodeError as exc:
        yield Finding("IV104", rel, message=f"not UTF-8 text (byte {exc.start})")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        yield Finding("IV104", rel, line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None,
                      message=f"invalid YAML: {exc.problem or exc.context}")
    except yaml.YAMLError as exc:
        yield Finding("IV104", rel, message=f"invalid YAML: {exc}")


def _schema(ctx: RunContext, rel: str, schema: str) -> Iterator[Finding]:
    doc = ctx.documents.document(rel)
    if doc is None or not doc.ok or doc.value in ({}, [], None):
        return  # IV103/IV104 already say why
    from jsonschema.exceptions import best_match  # as yaml in _yaml

    lines: dict | None = None
    for error in sorted(validator(schema).iter_errors(doc.value), key=lambda e: list(e.absolute_path)):
        if schema == "manifest" and ctx.options.part and _closing_field(error):
            continue  # a lot's part: the close writes it on the assembling machine
        if error.context:
            error = best_match(error.context)  # anyOf/oneOf: the branch that explains the problem
        pointer = pointer_of(error.absolute_path)
        lines = lines if lines is not None else pointer_lines(doc.text)
        message = _in_words(error) or error.message
        message = message if len(message) <= 300 else message[:297] + "..."
        yield Finding("IV105", rel, pointer=pointer, line=line_of(doc.text, pointer, lines),
                      message=f"{schema} schema: {message}")


def _closing_field(error) -> bool:
    """A required key that only the campaign's close writes (format/parts.py CLOSING_FIELDS) is missing."""
    return error.validator == "required" and any(
        list(error.absolute_path) == [section] and f"'{key}' is a required property" in error.message
        for section, key in CLOSING_FIELDS)


def _in_words(error) -> str | None:
    """A pattern error as the form expected, not the regex: `'2026-11-20' is not an RFC 3339 time such as ...`."""
    defs = validator("manifest").schema.get("$defs", {})
    if error.validator == "not" and error.validator_value == defs.get("text", {}).get("not"):
        return f"{_shown(error.instance)} is still a template placeholder: fill it in"
    if error.validator != "pattern":
        return None
    for name, expected in PATTERN_WORDS.items():
        if isinstance(defs.get(name), dict) and defs[name].get("pattern") == error.validator_value:
            return f"{_shown(error.instance)} is not {expected}"
    return None


# The manifest schema's patterns ($defs, read from the schema, never copied) in words.
PATTERN_WORDS = {
    "timestamp": "an RFC 3339 time such as 2026-11-20T08:00:00Z (with Z or an offset such as +02:00)",
    "id": "an id of letters, digits, '.', '_' and '-' that starts with a letter or a digit (at most 128)",
    "sha256": "a SHA-256 digest: 64 lowercase hex digits",
    "text": "a text that says something (not blank)",
}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _manifest_numbers(ctx: RunContext) -> Iterator[Finding]:
    """The one place that decides which manifest numbers are usable: not NaN or Infinity (Python's JSON reader
    takes those tokens; the schema's range checks compare false on NaN and let it through), and within the
    sane bounds of package/campaign.NUMBER_FIELDS. The budget and threshold rules then never meet such a value
    unannounced."""
    doc = ctx.documents.document(MANIFEST)
    if doc is None or not doc.ok:
        return
    lines: dict | None = None
    for path, value, sane in numbers_out_of_range(doc.value):
        pointer = pointer_of(path)
        lines = lines if lines is not None else pointer_lines(doc.text)
        nonfinite = isinstance(value, float) and not math.isfinite(value)
        what = "not a finite number (JSON has no NaN or Infinity)" if nonfinite else "beyond any sane value"
        expected = f"give {sane}" if sane else "give a finite number"
        yield Finding("IV105", MANIFEST, pointer=pointer, line=line_of(doc.text, pointer, lines),
                      message=f"{pointer.lstrip('/').replace('/', '.')} is {_number_text(value)}, {what}: "
                              f"{expected}")


def _number_text(value: int | float) -> str:
    if isinstance(value, int):
        return str(value) if abs(value) < 10 ** 20 else "an integer beyond 1e20"  # str() of 10**5000 raises
    return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(repr(value), f"{value:g}")
