"""Static pickle scanner (IV506): lists every global a pickle would import, without ever unpickling it.

A pickle is a program: GLOBAL / STACK_GLOBAL / INST import any callable and REDUCE / OBJ / NEWOBJ call it.
We walk the opcodes (opcodes.py) and compare each imported name with an allowlist (allowlist.py, docs/format.md).
Everything a reviewer's tools would unpickle is read the way they read it (containers.py, zips.py,
streams.py): every stream of a raw pickle file and what follows it, every member of a zip-format torch file
(whose layout must be unambiguous), every member of a tar (torch's legacy tar format), numpy object arrays by
their header, compressed pickles. Whether a file is a candidate is decided by its bytes, never by its name
alone, and no other reading exempts it: a valid safetensors file (or zip, or tar) is still read as a pickle
from its byte 0, as pickle.load would read it. The whole package's scan draws on one Budget (budget.py). The
scan decides; torch's `weights_only=True` is the second lock, never the first.
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ...format.names import PICKLE_SUFFIXES
from .. import PICKLE_SCAN
from ..files import open_binary
from .allowlist import ALLOWED_GLOBALS, INERT_CONFIG, INERT_CONFIG_FILES, is_allowed
from .budget import DEFAULT_UNITS, Budget, BudgetSpent
from .containers import NPY_MAGIC, ZIP_MAGIC, from_head, scan_container
from .distcp import DISTCP_SUFFIX, scan_distcp
from .opcodes import MAX_ARGUMENT, MAX_LINE, scan_stream
from .zips import AmbiguousZip, read_layout

__all__ = ["ALLOWED_GLOBALS", "INERT_CONFIG", "INERT_CONFIG_FILES", "MAX_ARGUMENT", "MAX_LINE", "NPY_MAGIC",
           "PICKLE_EXTENSIONS", "SCAN_SETTING", "SNIFF_BYTES", "ZIP_MAGIC", "Budget",
           "ScanResult", "category_of", "has_pickle_extension", "is_allowed", "is_pickle_or_torch_zip",
           "is_safetensors", "scan_file", "scan_package", "scan_stream", "sniff", "sniff_head"]

PICKLE_EXTENSIONS = PICKLE_SUFFIXES  # docs/format.md: by extension or by content
SNIFF_BYTES = 16
MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors library's own limit


@dataclass
class ScanResult:
    is_pickle: bool
    globals: set[str] = field(default_factory=set)
    unsafe: list[str] = field(default_factory=list)  # sorted globals outside the allowlist
    error: str | None = None  # the file could not be read whole, or not unambiguously: never load it
    category: str = "weights"  # "inert-config" for training_args.bin: scanned, never loaded

    @property
    def loadable(self) -> bool:
        """May torch.load(weights_only=True) see this file? Only a complete, allowlisted pickle."""
        return self.is_pickle and not self.unsafe and self.error is None and self.category != "inert-config"

    def refusal(self) -> str:
        if self.unsafe:
            return f"names globals outside the allowlist: {', '.join(self.unsafe)}"
        if self.error:
            return f"cannot be scanned ({self.error})"
        if self.category == "inert-config":
            return "is a training-arguments pickle: scanned only, never loaded"
        return "is not a pickle"


def sniff(path: str | os.PathLike) -> str | None:
    """What the first bytes say: 'pickle' (protocol 2+ magic), 'zip', 'npy', a compression ('gzip', 'bz2',
    'lzma', 'zstd', 'zlib'), 'opcode' (begins with a pickle opcode, as protocol 0/1 and headerless pickles
    do) or None. A valid safetensors file gets no exemption: its length bytes may well be a pickle."""
    try:
        with open_binary(path) as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return None
    return sniff_head(head, path)


def sniff_head(head: bytes, path: str | os.PathLike) -> str | None:
    """sniff() on the first SNIFF_BYTES bytes already read."""
    return from_head(head)


def is_safetensors(path: str | os.PathLike, head: bytes) -> bool:
    """An 8-byte little-endian header length, then a JSON header of tensor entries inside the file: only then
    is a file safetensors (a name or a '{' at byte 8 proves nothing)."""
    length = int.from_bytes(head[:8], "little")
    try:
        size = os.stat(path).st_size
        if not 2 <= length <= min(MAX_SAFETENSORS_HEADER, size - 8):
            return False
        with open_binary(path) as fh:
            fh.seek(8)
            header = json.loads(fh.read(length))
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(header, dict):
        return False
    data_size = size - 8 - length
    for key, entry in header.items():
        if key == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                return False
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
                and isinstance(entry.get("shape"), list) and all(type(d) is int and d >= 0 for d in entry["shape"])
                and isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size):
            return False
    return True


def has_pickle_extension(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(PICKLE_EXTENSIONS)


def is_pickle_or_torch_zip(path: str | os.PathLike, head: bytes | None = None) -> bool:
    """Worth scanning: a pickle extension, or the first bytes of a pickle, a zip, a numpy array or compressed
    data. `head`: the first SNIFF_BYTES bytes when already in memory (the file is then not opened)."""
    return has_pickle_extension(path) or (sniff(path) if head is None else sniff_head(head, path)) is not None


def category_of(path: str | os.PathLike) -> str:
    return "inert-config" if Path(path).name in INERT_CONFIG_FILES else "weights"


def scan_file(path: str | os.PathLike, budget: Budget | None = None) -> ScanResult:
    """Scan one file. A file that is neither a pickle nor a container holding one gives is_pickle=False.
    `budget`: the package's scan budget (a fresh default one when None); spent, the file cannot be scanned."""
    budget = budget if budget is not None else Budget()
    result = ScanResult(is_pickle=False, category=category_of(path))
    found: set[str] = set()
    named = has_pickle_extension(path)
    try:
        kind = sniff(path)
        if kind is not None or named:
            size = os.stat(path).st_size
            # Valid safetensors too: its length bytes looking like PROTO prove no intent, and a break is no error.
            other_format = _is_safetensors_file(path)
            with open_binary(path) as fh:
                if kind == "zip" and str(path).endswith(DISTCP_SUFFIX):  # one archive per stored item
                    scan = partial(scan_container, budget=budget)
                    result.is_pickle, result.error = scan_distcp(fh, size, Path(path).name, found, scan)
                else:
                    result.is_pickle, result.error = scan_container(fh, size, Path(path).name, found,
                                                                    named=named and not other_format,
                                                                    budget=budget, other_format=other_format)
                if (not result.is_pickle or result.error) and kind != "zip" and (named or _opens_like_npz(fh)):
                    _refuse_hidden_zip(fh, size)
    except AmbiguousZip as exc:
        # Two readers could see two archives: whatever either would unpickle is unknown. Never loadable.
        result.is_pickle, result.error = True, f"ambiguous zip archive: {exc}"
    except zipfile.BadZipFile as exc:
        result.is_pickle, result.error = True, f"damaged zip archive ({exc})"
    except BudgetSpent as exc:
        result.is_pickle, result.error = True, str(exc)
    except (OSError, EOFError, RuntimeError, ValueError, NotImplementedError, zlib.error) as exc:
        result.is_pickle = True
        result.error = f"{type(exc).__name__}: {exc}"
    result.globals = found
    result.unsafe = sorted(g for g in found if not is_allowed(g, result.category))
    return result


def _opens_like_npz(fh) -> bool:
    """np.load takes a file that starts with an (empty) archive's end record for an .npz."""
    fh.seek(0)
    return fh.read(4) == b"PK\x05\x06"


def _refuse_hidden_zip(fh, size: int) -> None:
    """A zip behind leading bytes: zipfile finds it (it shifts every offset by them), so AmbiguousZip."""
    window = min(size, 22 + 0xFFFF)
    fh.seek(size - window)
    if b"PK\x05\x06" in fh.read(window):
        read_layout(fh, size)  # raises: the first local header is not at offset 0


def _is_safetensors_file(path) -> bool:
    try:
        with open_binary(path) as fh:
            return is_safetensors(path, fh.read(SNIFF_BYTES))
    except OSError:
        return False


SCAN_SETTING = PICKLE_SCAN  # the package cache of {relative path: ScanResult}


def scan_package(ctx) -> dict[str, ScanResult]:
    """Scan each candidate file of a package once (pickle extension or pickle-like first bytes); the results
    stay in ctx.documents' caches so the reload step refuses what the scan refused, without scanning twice. All
    the files draw on one Budget: once it is spent, every file left is "cannot be scanned"."""
    results: dict[str, ScanResult] = ctx.documents.cache(SCAN_SETTING)
    units = ctx.options.scan_budget  # the audit's: its --max-size; None: the package's own size
    budget = Budget(units if units is not None else max(DEFAULT_UNITS, _package_bytes(ctx)))
    for rel in sorted(ctx.inventory.files):
        if rel in results:
            continue
        path = ctx.inventory.os_path(rel)
        # The first bytes of a document the checks already read come from memory: no second open per file.
        if is_pickle_or_torch_zip(path, ctx.documents.cached_head(rel, SNIFF_BYTES)):
            results[rel] = scan_file(path, budget)
    return results


def _package_bytes(ctx) -> int:
    return sum(entry.size for entry in ctx.inventory.files.values())
