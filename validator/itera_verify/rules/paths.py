"""IV201–IV206: paths that only worked on the rented machine, links that leave the package, escaping references,
names that one disk keeps apart and another merges."""
from __future__ import annotations

import json
import re
from typing import Any, Iterator

from ..archive.links import MAX_HOPS, TOO_MANY, real_path
from ..package.jsonpos import line_of, pointer_lines
from ..package.layout import references
from ..format import names
from ..format.names import folded
from ..format.parts import PROVENANCE
from ..format.names import NAME_OR_PATH, snapshot_repo
from ..model import Finding, Rule, Severity, UsageError
from ..package import MANIFEST, RELOAD, RunContext, pointer_of
from ..package.pickles.strings import pickled_strings
from ._paths_search import TmpMatcher, search_lines

# Relative CPU time on a package of many files; run_checks balances its processes by it.
COST = 25  # searches every text file and pickle; parses only the JSON documents that could hold a path

RULES = [
    Rule("IV201", Severity.ERROR, "temporary-directory path",
         explain="A path under /tmp/, /var/tmp/, /dev/shm/, /run/user/, /private/var/folders/, /var/folders/, "
                 "$TMPDIR or Windows' \\AppData\\Local\\Temp\\ inside a file or a config value points at "
                 "something that vanished with the rental. Checked in text files, JSON and YAML values, "
                 "config.json, adapter_config.json, safetensors metadata and pickled strings. Write paths "
                 "relative to the package, or hub ids.",
         bad='{"output_dir": "/tmp/run3"}', good='{"output_dir": "runs/3"}'),
    Rule("IV202", Severity.WARNING, "absolute path outside the package",
         explain="An absolute path in a config value that points outside the package will not exist on the "
                 "reviewer's machine. Prefer a path relative to the package root, or a hub id at a revision.",
         bad='{"base_model_name_or_path": "/home/alice/models/base"}',
         good='{"base_model_name_or_path": "org/base-model"}'),
    Rule("IV203", Severity.ERROR, "symbolic link leaves the package",
         explain="A link that resolves outside the package (or into a temporary directory) delivers nothing: the "
                 "archive would hold a link to a file the reviewer does not have. A link that stays inside the "
                 "package is fine wherever the package itself lives. Copy the target in instead.",
         bad="artifacts/base -> /home/alice/.cache/huggingface/hub/...", good="artifacts/latest -> checkpoint-400"),
    Rule("IV204", Severity.ERROR, "broken symbolic link",
         explain="A link whose target does not exist: the file it stood for was moved or never written. A link "
                 f"that needs more than {MAX_HOPS} links on its way (a long chain, or a loop) is broken too: the "
                 f"kernel refuses to follow it ({TOO_MANY}, ELOOP).",
         bad="checkpoints/best -> checkpoint-900  (missing)", good="checkpoints/best -> checkpoint-400"),
    Rule("IV205", Severity.ERROR, "referenced path escapes the package",
         explain="Every path in manifest.json and reload.json is relative to the package root and stays inside "
                 "it: no absolute path, no `..` that climbs out.",
         bad='{"params": "../params/control.json"}', good='{"params": "params/control.json"}'),
    Rule("IV206", Severity.ERROR, "two files whose names differ only in case or Unicode normalisation",
         explain="Linux keeps `Model.safetensors` and `model.safetensors` apart, and `é` written as one character "
                 "or as `e` plus an accent. A reviewer's disk on macOS or Windows does not: extracting the "
                 "archive writes the second over the first, so the reviewer sees other content than was checked. "
                 "Folders count too. Rename one of the two.",
         bad="artifacts/control.safetensors and artifacts/Control.safetensors",
         good="artifacts/control.safetensors and artifacts/control-ema.safetensors", since="0.2.0"),
]

TEXT_SUFFIXES = {"jsonl", "csv", "tsv", "txt", "md", "rst", "log", "py", "sh", "cfg", "ini", "toml", "ipynb", ""}
PICKLE_SUFFIXES = {suffix[1:] for suffix in names.PICKLE_SUFFIXES}
MAX_BINARY_SCAN = 64 << 20  # pickled configs are small; weights files are not searched byte by byte
MAX_DOCUMENT = 256 << 20
PER_FILE = 5  # findings shown per file before a count
_ABSOLUTE_POSIX = re.compile(r"^/[^/\s]+(/[^/\s]*)+$")
_ABSOLUTE_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")


def check(ctx: RunContext) -> Iterator[Finding]:
    matcher = TmpMatcher(ctx)
    text_pattern = matcher.text
    root = real_path(ctx.inventory.root)
    for rel in sorted(ctx.inventory.files):
        entry = ctx.inventory.files[rel]
        if entry.size == 0 or rel.startswith(PROVENANCE + "/"):
            continue  # provenance/: the lots' own records of their machines (format/parts.py), bound as signed
        name = rel.rsplit("/", 1)[-1]
        suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
        if suffix in ("json", "yaml", "yml") and entry.size <= MAX_DOCUMENT:
            yield from _document_values(ctx, rel, suffix, matcher, root)
        elif suffix == "safetensors":
            yield from _safetensors_metadata(ctx, rel, text_pattern)
        elif suffix in PICKLE_SUFFIXES and entry.size <= MAX_BINARY_SCAN:
            yield from _binary(ctx, rel, matcher)
        elif suffix in TEXT_SUFFIXES:
            yield from _text_lines(ctx, rel, matcher)
    yield from _links(ctx, text_pattern)
    yield from _escaping_references(ctx)
    yield from _case_twins(ctx)


def _limited(findings: Iterator[Finding], rel: str, what: str) -> Iterator[Finding]:
    count = 0
    for finding in findings:
        count += 1
        if count <= PER_FILE:
            yield finding
    if count > PER_FILE:
        yield Finding("IV201", rel, message=f"{count - PER_FILE} more {what} in this file")


def _strings(value: Any, path: list) -> Iterator[tuple[list, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, [*path, key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, [*path, index])


def _document_values(ctx: RunContext, rel: str, suffix: str, matcher: TmpMatcher, root: str) -> Iterator[Finding]:
    pattern = matcher.text
    if suffix == "json":
        if ctx.documents.parsed(rel) is None and ctx.inventory.is_file(rel):
            raw = ctx.documents.document_bytes(rel)  # kept for the family that parses it (structure), if any
            if not _holds_any(raw, matcher.path_byte_leads):
                return  # no character a path needs: not even parsed (most of many small documents)
        doc = ctx.documents.document(rel)
        if doc is None or not doc.ok:
            return
        text = doc.text
        if not _may_hold_paths(text, matcher):
            return  # most documents name no path at all: skip walking their values
        value = doc.value
    else:
        import yaml  # only for a YAML document (rules/structure.py says why here)

        try:
            text = ctx.documents.read_bytes(rel).decode("utf-8")
            value = yaml.safe_load(text)
        except (UnicodeDecodeError, yaml.YAMLError):
            return  # IV104 reports it
    tmp_hits, outside_hits = [], []
    for path, string in _strings(value, []):
        if pattern.search(string):
            tmp_hits.append((path, string))
        elif _points_outside(string, root):
            outside_hits.append((path, string))
    line_cache: list[dict] = []  # pointer -> line, computed once and only when a JSON document has a finding

    def located(path: list) -> tuple[str, int | None]:
        pointer = pointer_of(path)
        if suffix != "json":
            return pointer, None
        if not line_cache:
            line_cache.append(pointer_lines(text))
        return pointer, line_of(text, pointer, line_cache[0])

    for path, string in tmp_hits[:PER_FILE]:
        pointer, line = located(path)
        yield Finding("IV201", rel, pointer=pointer, line=line,
                      message=f"temporary-directory path {_short(string)}{_tmp_fix(path, string)}")
    if len(tmp_hits) > PER_FILE:
        yield Finding("IV201", rel, message=f"{len(tmp_hits) - PER_FILE} more temporary-directory paths in this file")
    for path, string in outside_hits[:PER_FILE]:
        pointer, line = located(path)
        yield Finding("IV202", rel, pointer=pointer, line=line,
                      message=_hub_snapshot_words(ctx, path, string)
                      or f"absolute path outside the package: {_short(string)}")


def _hub_snapshot_words(ctx: RunContext, path: list, value: str) -> str | None:
    """IV202's message for the hub-cache snapshot a library loaded the base from (diffusers records it as each
    component's `_name_or_path`): what it is, and whether the manifest pins that base; None for another path."""
    snapshot = snapshot_repo(value)
    if snapshot is None:
        return None
    repo, revision, sub = snapshot
    key = path[-1] if path else None
    recorded = " recorded by diffusers/transformers as `_name_or_path`" if key == "_name_or_path" else ""
    pinned = {(b.get("name"), b.get("revision")) for a in ctx.documents.artifacts()
              if isinstance(b := a.get("base"), dict)}
    if (repo, revision) in pinned:
        tail = "the manifest's pinned base: harmless, a reviewer resolves it by hub id and revision in their own cache"
    elif any(name == repo for name, _ in pinned):
        other = next(rev for name, rev in pinned if name == repo)
        tail = f"but the manifest pins {repo} at {other}: the run loaded another revision than it declares"
    else:
        tail = f"name the base in the manifest (artifact `base`: {repo!r} and its revision) so a reviewer can load it"
    return (f"the base's hub-cache snapshot on the training machine, {repo} at {revision}"
            + (f" ({sub})" if sub else "") + f",{recorded}: {tail} ({_short(value)})")

def _tmp_fix(path: list, value: str) -> str:
    """What wrote a temporary path IV201 found, and how to fix it, where the key says it: `_name_or_path` is
    where save_pretrained (diffusers, transformers) records the folder the model was loaded from."""
    if not path or path[-1] != NAME_OR_PATH:
        return ""
    snapshot = snapshot_repo(value)
    if snapshot is not None:
        return (f": save_pretrained recorded the hub-cache snapshot the base was loaded from ({snapshot[0]} at "
                f"{snapshot[1]}) as `{NAME_OR_PATH}`; write \"{snapshot[0]}\" there (the recorder's run.artifact "
                "and callbacks do), or keep the hub cache outside the temporary folder")
    return (f": save_pretrained recorded the folder the model was loaded from as `{NAME_OR_PATH}`; write the "
            "model's hub id there instead")


_VALUE_MAY_BE_ABSOLUTE = re.compile(r'"(?:/|\\/|[A-Za-z]:(?:\\\\|/|\\/))')


def _may_hold_paths(text: str, matcher: TmpMatcher) -> bool:
    """A cheap look at the raw JSON text: could any string value be a temporary or absolute path?

    JSON may escape "/" as "\\/" and may escape any character as \\uXXXX, so those texts are always walked."""
    if not _holds_any(text, matcher.path_leads):
        return False  # two or three scans at memory speed, where the regex below walks the text in Python's re
    if "\\u" in text:
        return True
    return bool(_VALUE_MAY_BE_ABSOLUTE.search(text) or matcher.may_match_text(text))


def _holds_any(data, leads) -> bool:
    for lead in leads:  # a plain loop: any() over a generator costs more than the scans on a small document
        if lead in data:
            return True
    return False


def _points_outside(value: str, root: str) -> bool:
    if _ABSOLUTE_WINDOWS.match(value):
        return True
    if not _ABSOLUTE_POSIX.match(value):
        return False
    return not (value == root or value.startswith(root.rstrip("/") + "/"))


def _short(value: str) -> str:
    return json.dumps(value if len(value) <= 120 else value[:117] + "...")


def _text_lines(ctx: RunContext, rel: str, matcher: TmpMatcher) -> Iterator[Finding]:
    def hits() -> Iterator[Finding]:
        for number, column, snippet in search_lines(ctx, rel, matcher):
            yield Finding("IV201", rel, line=number, column=column,
                          message=f"temporary-directory path in text: …{snippet.decode('utf-8', 'replace')}…")
    yield from _limited(hits(), rel, "temporary-directory paths")


def _binary(ctx: RunContext, rel: str, matcher: TmpMatcher) -> Iterator[Finding]:
    """Pickled configs (training_args.bin) keep their strings as plain bytes: an output_dir under /tmp shows."""
    data = ctx.documents.read_bytes(rel)
    if not matcher.may_match_bytes(data):
        return
    strings = pickled_strings(data)
    if strings is not None:  # a pickle: the exact strings it holds, not bytes that run into the next opcode
        hits = dict.fromkeys(s for s in strings if matcher.may_match_text(s) and matcher.text.search(s))
        yield from _limited((Finding("IV201", rel, message=f"temporary-directory path stored in the pickle: "
                                     f"{_short(text)}; the file is a record of the run, so fix the run: train "
                                     "with a relative output_dir (and relative paths elsewhere), or leave the "
                                     "file out of the package") for text in hits), rel, "temporary-directory paths")
        return
    seen = set()
    for match in matcher.bytes.finditer(data):
        end = match.end()
        while end < len(data) and end - match.start() < 120 and 32 <= data[end] < 127 and data[end] not in b"\"'":
            end += 1
        text = data[match.start():end].decode("ascii", "replace")
        if text not in seen:
            seen.add(text)
            if len(seen) <= PER_FILE:
                yield Finding("IV201", rel, message=f"temporary-directory path stored in the file: {_short(text)}")


def _safetensors_metadata(ctx: RunContext, rel: str, pattern: re.Pattern[str]) -> Iterator[Finding]:
    try:  # the one header reader (format/safetensors.py)
        header = ctx.documents.safetensors_header(rel, unreadable_is_none=False)
    except OSError as exc:  # a file that cannot be read is unreadable input, with or without --no-reload
        raise UsageError(f"{rel}: cannot read ({exc.strerror or exc})") from exc
    if header is None:
        return  # the reload reports a header that does not parse
    for key, value in (header.metadata or {}).items():
        if pattern.search(value):
            yield Finding("IV201", rel, pointer=pointer_of(["__metadata__", key]),
                          message=f"temporary-directory path in safetensors metadata {key}: {_short(value)}")


def _links(ctx: RunContext, pattern: re.Pattern[str]) -> Iterator[Finding]:
    for rel, link in sorted(ctx.inventory.links.items()):
        if link.looped:
            yield Finding("IV204", rel, message=f"{TOO_MANY}: more than {MAX_HOPS} links on its way, or a loop "
                                                f"(the kernel refuses it, ELOOP) -> {link.target}")
        elif link.broken:
            yield Finding("IV204", rel, message=f"broken symbolic link -> {link.target}")
        if not link.inside:
            into_tmp = bool(pattern.search(link.resolved) or pattern.search(link.target))
            where = "into a temporary directory" if into_tmp else "outside the package"
            yield Finding("IV203", rel, message=f"symbolic link {where}: -> {link.target}")


def _escaping_references(ctx: RunContext) -> Iterator[Finding]:
    for ref in references(ctx):
        if ctx.inventory.normalise_ref(ref.value) is None:
            yield Finding("IV205", MANIFEST, pointer=ref.pointer, run=ref.run,
                          message=f"{ref.kind} path {ref.value!r} is absolute or climbs out of the package")
    entries = ctx.documents.reload_spec.get("artifacts")
    for artifact_id, entry in (entries.items() if isinstance(entries, dict) else []):
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and ctx.inventory.normalise_ref(path) is None:
            yield Finding("IV205", RELOAD, pointer=pointer_of(["artifacts", artifact_id, "path"]), artifact=artifact_id,
                          message=f"path {entry['path']!r} is absolute or climbs out of the package")


def _case_twins(ctx: RunContext) -> Iterator[Finding]:
    """Entries whose names a case-insensitive, normalisation-insensitive disk takes for one (the folders' entries are
    listed too, so `Data/x` and `data/y` are two folders `data` there)."""
    inventory = ctx.inventory
    first: dict[str, str] = {folded(names.SEAL_DIR): names.SEAL_DIR}  # the folder the sealed archive adds
    for rel in sorted((*inventory.dirs, *inventory.files, *inventory.links, *inventory.specials)):
        earlier = first.setdefault(folded(rel), rel)
        if earlier != rel:
            whose = " (the folder the sealed archive adds)" if earlier == names.SEAL_DIR else ""
            yield Finding("IV206", rel, message=f"differs from {earlier}{whose} only in case or Unicode "
                                                "normalisation: on macOS or Windows one is written over the other")
