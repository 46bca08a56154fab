"""One property per reader: put a hostile input where the tool reads it, run the real path, and check that it
ended in findings or a clean verdict — no traceback, no hang, no unpickling, no process, no stray write, and
exit code 2 only where the contract says the tool could not run.

`READERS` lists them for both the CI test (`tests/test_fuzz.py`) and `python -m tests.fuzz_all`.
"""
from __future__ import annotations

import io
import json
import math
import os
import pickle
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hypothesis import strategies as st

from . import binary, strategies, tar_differential
from .workspace import Outcome, Workspace, time_limit, watch
from tests.helpers import context

CSV_METRICS = "metrics/control.csv"


# ---------------------------------------------------------------------------------------------- shared checks

def assert_survived(outcome: Outcome, allowed_exits=(0, 1)) -> dict | None:
    """The common property. Returns the JSON report when the tool ran."""
    assert outcome.error is None, f"uncaught exception or hang:\n{outcome.error}"
    assert not outcome.events, f"the tool did what a check must never do: {outcome.events}"
    assert outcome.exit_code in allowed_exits, \
        f"exit code {outcome.exit_code}: {outcome.stderr.strip().splitlines()[-1:]} {outcome.stdout[-1000:]}"
    if outcome.exit_code == 2:
        return None
    report = json.loads(outcome.stdout)
    from itera_verify.package.schemas import validator

    problems = [e.message for e in validator("report").iter_errors(report)]
    assert not problems, f"--format json breaks its schema: {problems[:3]}"
    if "junit" in outcome.reports:
        ET.fromstring(outcome.reports["junit"].encode("utf-8"))  # a JUnit file CI cannot parse is a crash there
    return report


def _findings(report: dict, code: str, path: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == code and (path is None or f.get("path") == path)]


# ---------------------------------------------------------------------------------------------- documents

def plan_reloads(ws: Workspace) -> None:
    """The reload runner's planning (which artifact, which loader, which path) over the same documents: it runs
    in the tool's own process before any child starts, so it must survive them too."""
    from itera_verify.model import ReloadResult
    from itera_verify.reload.jobs import plan

    package = context(ws.root, hf_cache=ws.hf_cache)
    with time_limit():
        for artifact in package.documents.artifacts():
            job = plan(package, artifact, "cpu", 0)
            assert isinstance(job, (dict, ReloadResult)), job
            if isinstance(job, dict):
                json.dumps(job)  # what the child is handed


def document_property(rel: str, plan: bool = False) -> Callable[[Workspace, bytes], None]:
    def check(ws: Workspace, data: bytes) -> None:
        with ws.replaced({rel: data}):
            assert_survived(ws.verify_static())
            if plan:
                plan_reloads(ws)

    check.__name__ = f"check_{rel.replace('/', '_').replace('.', '_')}"
    return check


def metrics_csv_property(ws: Workspace, data: bytes) -> None:
    """A CSV metrics file, referenced by the control run instead of its JSONL."""
    manifest = ws.document("manifest.json")
    manifest["runs"][0]["metrics"] = CSV_METRICS
    with ws.replaced({"manifest.json": json.dumps(manifest).encode(), CSV_METRICS: data}):
        assert_survived(ws.verify_static())


# ---------------------------------------------------------------------------------------------- configuration

def config_property(ws: Workspace, example: tuple[str, bytes]) -> None:
    """A configuration file ends in a Config with sane values, or in exit 2 with one line (the documented case)."""
    from itera_verify.flows.config import load_config
    from itera_verify.model import UsageError

    name, data = example
    folder = ws.scratch / "config"
    folder.mkdir(exist_ok=True)
    for stale in folder.iterdir():
        stale.unlink()
    path = folder / name
    path.write_bytes(data)
    for how in ({"explicit": path}, {"start": folder}):
        try:
            with time_limit():
                config = load_config(**how)
        except UsageError:
            continue
        if config.timeout is not None:
            assert math.isfinite(config.timeout) and config.timeout > 0, f"accepted timeout {config.timeout!r}"
        assert config.device in (None, "auto", "cuda", "cpu"), f"accepted device {config.device!r}"
    outcome = ws.cli(str(ws.root), "--no-reload", "--no-seal", "--format", "json", "--config", str(path))
    assert_survived(outcome, allowed_exits=(0, 1, 2))
    if outcome.exit_code == 2:
        last = outcome.stderr.strip().splitlines()[-1:] or [""]
        assert last[0].startswith("itera-verify: error: "), f"exit 2 without its one-line reason: {last}"


# ---------------------------------------------------------------------------------------------- pickles

class _Stub:
    """What the recording unpickler hands out instead of any real global: absorbs every call and attribute."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Stub()

    def __getattr__(self, name):
        return _Stub()

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass


class _Recorder(pickle.Unpickler):
    """Runs a pickle with every import replaced by a stub, recording the globals it asks for: what a real
    `pickle.load` would import (and so execute) on the reviewer's machine."""

    def __init__(self, stream):
        super().__init__(stream)
        self.requested: list[str] = []

    def find_class(self, module, name):
        self.requested.append(f"{module}.{name}")
        return _Stub

    def persistent_load(self, pid):
        return _Stub()


def globals_requested(path: Path) -> list[str]:
    """Every global a real unpickler would import from this file, following consecutive streams as torch's
    legacy loader does (each `load` continues where the previous one stopped). A real file, as a reviewer
    loads it: CPython's unpickler reads FRAMEs differently from an io.BytesIO (see the report)."""
    data = path.read_bytes()
    with open(path, "rb") as stream:
        return _requested(stream, len(data))


def _requested(stream, size: int) -> list[str]:
    names: list[str] = []
    while stream.tell() < size:
        recorder = _Recorder(stream)
        try:
            recorder.load()
        except Exception:  # noqa: BLE001 — where the real load would fail too; what it imported stays imported
            names += recorder.requested
            break
        names += recorder.requested
    return names


SUFFIXES = [".pkl", ".pt", ".bin", ".pth", ".txt", ""]


def pickle_property(ws: Workspace, example: tuple[bytes, str]) -> None:
    """The scanner never unpickles, never crashes, and names every non-allowlisted global a real unpickler
    would import (IV506 through the command line too)."""
    from itera_verify.package.pickles import category_of, is_allowed

    data, suffix = example
    rel = f"analysis/blob{suffix}"
    probe = ws.scratch / f"probe{suffix}"
    probe.write_bytes(data)
    # A module whose first dotted part is no identifier (".(ctorch" from a GLOBAL's bytes) imports nothing:
    # CPython's find_class raises ModuleNotFoundError before any code runs, so the scanner need not name it.
    dangerous = sorted({g for g in globals_requested(probe)
                        if g.split(".")[0].isidentifier() and not is_allowed(g, category_of(rel))})
    with ws.replaced({rel: data}):
        report = assert_survived(ws.verify_static())
    flagged = _findings(report, "IV506", rel)
    if dangerous:
        assert flagged, f"IV506 missed: a real unpickler would import {dangerous}"
        missing = [g for g in dangerous if g not in flagged[0]["message"]]
        assert not missing or "more" in flagged[0]["message"], f"IV506 does not name {missing}"


def direct_scan_property(ws: Workspace, data: bytes) -> None:
    """The scanner alone, on a file outside any package (its own contract: a ScanResult, never an exception)."""
    from itera_verify.package.pickles import scan_file

    path = ws.scratch / "direct.pkl"
    path.write_bytes(data)
    with watch().armed_for(ws.scratch) as events, time_limit():
        scan_file(path)
    assert not events, events


def safetensors_loader_property(ws: Workspace, data: bytes) -> None:
    """The reload child's safetensors loader, in-process: never a hang; and a file that the safetensors library
    itself loads must end in a result or the loader's own Stop — an unforeseen exception there would report a
    valid artifact as broken (IV504). A file the library refuses may fail any way: the child reports it."""
    import torch
    from safetensors.torch import load as library_load

    from itera_verify.reload.common import Outcome, Stop
    from itera_verify.reload.loaders.safetensors import load_file

    path = ws.scratch / "fuzzed.safetensors"
    path.write_bytes(data)
    try:
        library_load(data)
        valid = True
    except Exception:  # noqa: BLE001 — any refusal by the library makes the file invalid
        valid = False
    with time_limit():
        try:
            load_file(path, torch.device("cpu"), None, Outcome({"package_root": str(ws.scratch)}))
        except Stop:
            pass
        except Exception:
            if valid:
                raise



def safetensors_header_property(ws: Workspace, data: bytes) -> None:
    """The one safetensors header reader (format/safetensors.py, read by the untrained-model rule, GPU placement
    and the reload's size checks alike): never an exception, whatever the bytes; and every file the safetensors
    library itself opens is read with the library's names, dtypes and shapes."""
    from safetensors import safe_open

    from itera_verify.package.files import read_safetensors_header
    from itera_verify.reload.placement import weight_bytes

    path = ws.scratch / "fuzzed-header.safetensors"
    path.write_bytes(data)
    with time_limit():
        header = read_safetensors_header(path)
        weight_bytes(path)
    try:
        with safe_open(str(path), framework="numpy") as handle:
            library = {name: handle.get_slice(name) for name in handle.keys()}
            library = {name: (piece.get_dtype(), tuple(piece.get_shape())) for name, piece in library.items()}
    except Exception:  # noqa: BLE001 — any refusal by the library: the reload reports the file
        return
    assert header is not None, "the safetensors library opens a file the tool's reader refuses"
    assert {name: (e.dtype, e.shape) for name, e in header.entries.items()} == library



def ssh_signature_property(ws: Workspace, data: bytes) -> None:
    """The SSH signature reader and verifier (format/sshsig.py, the audit's pure-Python OpenSSH): any bytes end
    in a verified signature or SshSigError, never another exception, in bounded time."""
    from itera_verify.format.sshsig import SshSigError, verify

    with time_limit():
        try:
            verify(data, "itera-verify-seal@v1", message=b"the archive's bytes")
        except SshSigError:
            pass


def allowed_signers_property(ws: Workspace, text: str) -> None:
    """The allowed_signers reader: every line is an entry or a problem with its line number, never an exception."""
    from itera_verify.format.sshsig import parse_allowed_signers

    with time_limit():
        entries, problems = parse_allowed_signers(text)
    lines = len(text.splitlines())
    assert all(1 <= number <= lines for number, _ in problems)
    assert len(entries) + len(problems) <= lines


# ---------------------------------------------------------------------------------------------- archives

def tar_reader_property(ws: Workspace, data: bytes) -> None:
    """The audit's streaming member reader alone: members and their bytes, or an ArchiveError — nothing else,
    and never more bytes for a member than its header announced."""
    from itera_verify.archive.reader import ArchiveError, ArchiveReader

    with time_limit(), watch().armed_for(ws.scratch) as events:
        try:
            with ArchiveReader(io.BytesIO(data), max_expanded=16 << 20) as reader:
                for member in reader:
                    delivered = sum(len(piece) for piece in reader.data(member))
                    assert delivered <= max(member.size, 0), f"{member.name}: {delivered} > {member.size} bytes"
        except ArchiveError:
            pass
    assert not events, events


def audit_property(ws: Workspace, data: bytes) -> None:
    """`itera-verify audit` on a hostile archive: findings or a pass, exit 0 or 1; its private folder removed;
    nothing written outside it; no canary created where absolute names and links point."""
    outcome, damage = ws.audit(data)
    assert_survived(outcome)
    assert not damage, damage
    assert not os.path.lexists(binary.CANARY), f"the audit wrote {binary.CANARY}"


def audit_strategy(ws: Workspace):
    tar, cid = ws.sealed_base()
    return st.one_of(binary.sealed_archive_mutations(tar, cid), binary.sealed_archive_mutations(tar, cid),
                     binary.tar_zst_archives(cid))


# ---------------------------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Reader:
    name: str  # as the survival table shows it
    strategy: Callable[[Workspace], st.SearchStrategy]
    check: Callable[[Workspace, Any], None]
    # An outside program the property compares with (GNU tar): its absence skips the reader. A module of the
    # tool that cannot be imported is never a skip: the import fails the test (a moved module must not hide).
    tools_present: Callable[[], bool] = lambda: True


READERS: list[Reader] = [
    Reader("manifest.json", lambda ws: strategies.json_document(ws.document("manifest.json")),
           document_property("manifest.json", plan=True)),
    Reader("stops.json", lambda ws: strategies.json_document(ws.document("stops.json")),
           document_property("stops.json")),
    Reader("reload.json", lambda ws: strategies.json_document(ws.document("reload.json")),
           document_property("reload.json", plan=True)),
    Reader("params (JSON)", lambda ws: strategies.json_document(ws.document("params/control.json")),
           document_property("params/control.json")),
    Reader("metrics (JSONL)", lambda ws: strategies.line_file(strategies.metrics_jsonl_line()),
           document_property("metrics/control.jsonl")),
    Reader("metrics (CSV)", lambda ws: strategies.metrics_csv(), metrics_csv_property),
    Reader("predictions", lambda ws: strategies.predictions_file(ws.eval_ids),
           document_property("predictions/control.jsonl")),
    Reader("eval ids", lambda ws: strategies.eval_ids_file(ws.eval_ids), document_property("corpus/eval_ids.txt")),
    Reader("config (TOML)", lambda ws: strategies.config_files(), config_property),
    Reader("safetensors header", lambda ws: binary.safetensors_files(),
           document_property("artifacts/control-model/model.safetensors")),
    Reader("safetensors loader (reload child)", lambda ws: binary.safetensors_files(), safetensors_loader_property),
    Reader("safetensors header (format layer)", lambda ws: binary.safetensors_files(), safetensors_header_property),
    Reader("SSH signature (format layer)", lambda ws: binary.ssh_signatures(), ssh_signature_property),
    Reader("allowed_signers (format layer)", lambda ws: binary.allowed_signers_files(), allowed_signers_property),
    Reader("pickle scanner", lambda ws: binary.pickle_streams(), direct_scan_property),
    Reader("pickle scanner (IV506)", lambda ws: st.tuples(binary.pickle_streams(), st.sampled_from(SUFFIXES)),
           pickle_property),
    Reader("tar member reader", lambda ws: binary.tar_zst_archives(), tar_reader_property),
    Reader("audit (archive)", audit_strategy, audit_property),
    Reader("tar differential (GNU tar 1.34)", lambda ws: tar_differential.tar_streams(),
           tar_differential.differential_property, tools_present=tar_differential.available),
]
