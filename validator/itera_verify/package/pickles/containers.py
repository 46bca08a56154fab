"""What holds a pickle: zip archives (torch files, .npz), numpy arrays, compressed files, raw streams.

`scan_container` reads the first bytes and dispatches; containers nest (a pickle in a zip in a gzip) up to
MAX_DEPTH. Every member of a zip is scanned except torch's tensor storages (`<archive>/data/<n>`, raw bytes
torch never unpickles), whatever its name: torch unpickles data.pkl and constants.pkl, and a reviewer's tool
may unpickle anything else. Every member of a tar is scanned too: torch.load tries its legacy tar format
(`storages`, `tensors` and `pickle` members, each a pickle) before anything else. And whatever container a
file is, it is also read as a pickle from its byte 0: a consumer that calls pickle.load on it reads it so.
All the work is paid from one Budget (budget.py).
"""
from __future__ import annotations

import ast
import bz2
import gzip
import io
import lzma
import re
import tarfile
import tempfile
import zlib

from .budget import Budget, BudgetSpent
from .opcodes import IMPORTABLE, OPCODE_BYTES, Reader, scan_stream
from .streams import scan_raw
from .zips import open_checked

ZIP_MAGIC = b"PK\x03\x04"
NPY_MAGIC = b"\x93NUMPY"
SEVEN_ZIP_MAGIC = b"7z\xbc\xaf\x27\x1c"
# nullifAI (2025) hid pickles in 7z-compressed PyTorch files that scanners passed because they could not open them.
# No reader here opens 7z (neither does torch, numpy or pickle), so what one holds is never judged "not a pickle":
# it cannot be scanned, whatever its name (docs/format.md, "What the pickle scan refuses").
SEVEN_ZIP_REFUSAL = ("a 7z archive: the scanner has no 7z reader, so a pickle inside it cannot be judged; ship it "
                     "as a zip, tar or gzip/xz/zstd file, which the scanner opens")
MAX_DEPTH = 3
MAX_NPY_HEADER = 1 << 20  # numpy reads up to 10,000 characters unless allow_pickle=True; we read this far
MAX_DECOMPRESSED = 1 << 30
_STORAGE = re.compile(r"[^/]+/(\.data/|data/)\d+")  # torch's storage records, as torch names them
_PICKLE_NAMES = (".pkl", ".pickle")
_LEGACY_TAR_PICKLES = ("storages", "tensors", "pickle")  # torch's legacy tar: each member a pickle
TAR_BLOCK = 512


def compression_of(head: bytes) -> str | None:
    """The compression format the first bytes announce (gzip, bz2, xz / lzma, zstd, zlib)."""
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"BZh") and head[3:4].isdigit() and head[3:4] != b"0":
        return "bz2"
    if head.startswith(b"\xfd7zXZ\x00") or (head[:1] == b"\x5d" and head[1:3] == b"\x00\x00" and len(head) >= 13):
        return "lzma"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    if len(head) >= 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return None


class _ZlibReader(io.RawIOBase):
    """A zlib stream (joblib's "zlib" compression) as a readable file."""

    def __init__(self, raw):
        self.raw, self.inflate, self.left, self.at = raw, zlib.decompressobj(), b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.at == len(self.left) and not self.inflate.eof:
            chunk = self.raw.read(1 << 16)
            if not chunk:
                raise zlib.error("the zlib stream ends early")
            self.left, self.at = self.inflate.decompress(chunk), 0
        data = memoryview(self.left)[self.at:self.at + len(buffer)]
        buffer[:len(data)] = data
        self.at += len(data)
        return len(data)


def _decompressor(kind: str, raw):
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw)
    if kind == "bz2":
        return bz2.BZ2File(raw)
    if kind == "lzma":
        return lzma.LZMAFile(raw)
    if kind == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
        return io.BufferedReader(reader)
    return io.BufferedReader(_ZlibReader(raw))


def _scan_compressed(kind, fh, name, found, depth, certain, budget) -> tuple[bool, str | None]:
    """Decompress (bounded) and scan what is inside; a head that no pickle could start with is skipped. Data
    that stops decompressing part way is scanned as far as it goes (pickle.load runs opcodes as it reads
    them), then refused."""
    inner_name = re.sub(r"\.(gz|bz2|xz|lzma|zst|zstd|z)$", "", name, flags=re.IGNORECASE)
    certain = certain or inner_name.lower().endswith(PICKLE_LIKE)
    inner_kind = from_head(_decompressed(kind, fh, 16, budget=budget)[0])
    if not (certain or inner_kind is not None):
        return False, None
    if not certain and inner_kind == "opcode" and not _first_stream_may_be_pickle(kind, fh, budget):
        return False, None  # compressed text that merely begins with an opcode byte: not decompressed whole
    with tempfile.SpooledTemporaryFile(max_size=32 << 20) as spool:
        _, error = _decompressed(kind, fh, MAX_DECOMPRESSED + 1, spool, budget)
        size = spool.tell()
        if size > MAX_DECOMPRESSED:
            return True, f"{kind} data decompresses to more than {MAX_DECOMPRESSED} bytes"
        is_pickle, scan_error = scan_container(spool, size, inner_name, found, depth + 1, certain, budget=budget)
    if error:
        return True, f"{kind} data does not decompress to its end ({error})"
    return is_pickle, scan_error


def _decompressed(kind: str, fh, limit: int, into=None, budget: Budget | None = None) -> tuple[bytes, str | None]:
    """Up to `limit` decompressed bytes (written to `into` when given), and why decompressing stopped early.
    Each byte is paid from `budget` (BudgetSpent propagates)."""
    fh.seek(0)
    head, done = b"", 0
    try:
        with _decompressor(kind, fh) as inner:
            while done < limit and (chunk := inner.read(min(1 << 16, limit - done))):
                if budget is not None:
                    budget.spend(len(chunk))
                done += len(chunk)
                if into is None:
                    head += chunk
                else:
                    into.write(chunk)
    except BudgetSpent:
        raise
    except Exception as exc:  # noqa: BLE001 - each decompressor raises its own types for damaged data
        return head, f"{type(exc).__name__}: {exc}"
    return head, None


def _first_stream_may_be_pickle(kind: str, fh, budget: Budget) -> bool:
    """Read the first stream straight from the decompressor: does it parse, or import before it breaks?"""
    fh.seek(0)
    names: set[str] = set()
    try:
        with _decompressor(kind, fh) as inner:
            scan_stream(Reader(inner, MAX_DECOMPRESSED, budget), names)
    except BudgetSpent:
        raise
    except Exception:  # noqa: BLE001 - a broken stream, or damaged data whatever the decompressor raises
        return any(IMPORTABLE.fullmatch(n) for n in names)
    return True


PICKLE_LIKE = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".npy", ".npz", ".joblib")


def from_head(head: bytes) -> str | None:
    """The container the first bytes announce: 'zip', 'npy', '7z', a compression, 'pickle' (PROTO), 'opcode'."""
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(NPY_MAGIC):
        return "npy"
    if head.startswith(SEVEN_ZIP_MAGIC):
        return "7z"
    if (kind := compression_of(head)) is not None:
        return kind
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if head[:1] and head[0] in OPCODE_BYTES:
        return "opcode"
    return None


def scan_container(fh, size: int, name: str, found: set[str], depth: int = 1, certain: bool = False,
                   named: bool = False, budget: Budget | None = None,
                   other_format: bool = False) -> tuple[bool, str | None]:
    """(holds a pickle, why it cannot be scanned) for `size` bytes of a seekable file named `name`.

    `budget`: the package's scan budget; without one, a fresh default one, and a scan that spends it is an
    error here. `other_format`: the bytes are also a valid file of another format (safetensors), so a PROTO-like
    first byte proves no intent."""
    if budget is None:
        try:
            return scan_container(fh, size, name, found, depth, certain, named, Budget(), other_format)
        except BudgetSpent as exc:
            return True, str(exc)
    if depth > MAX_DEPTH:
        return True, f"containers nested more than {MAX_DEPTH} deep ({name})"
    fh.seek(0)
    kind = from_head(fh.read(16))
    result = None
    if kind == "zip":
        result = _scan_zip(fh, size, name, found, depth, budget)
    elif kind == "npy":
        result = _scan_npy(fh, size, found, budget)
    elif kind == "7z":
        result = True, SEVEN_ZIP_REFUSAL
    elif kind in ("gzip", "bz2", "lzma", "zstd", "zlib"):
        result = _scan_compressed(kind, fh, name, found, depth, certain, budget)
        if result == (False, None):
            result = None  # not compressed data after all (lzma-alone and zlib have weak magic): read as it is
    elif is_tar(fh, size):
        result = _scan_tar(fh, size, name, found, depth, budget)
    if result is None:
        return scan_raw(fh, 0, size, found, certain, named, budget=budget, other_format=other_format)
    # Whatever container it is, pickle.load reads it from byte 0 too: what that reading imports counts.
    raw_pickle, _ = scan_raw(fh, 0, size, found, budget=budget, other_format=True, alongside=True)
    return result[0] or raw_pickle, result[1]


def _scan_zip(fh, size, name, found, depth, budget) -> tuple[bool, str | None]:
    any_pickle, error = False, None
    with open_checked(fh, size) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            if _STORAGE.fullmatch(info.filename):
                # Raw tensor bytes torch never unpickles; only an array or archive (np.load reads an .npz
                # member whatever its name) is looked into, by a magic no tensor plausibly starts with.
                with archive.open(info) as member:
                    if not member.read(8).startswith((NPY_MAGIC, ZIP_MAGIC)):
                        continue
            certain = info.filename.lower().endswith(_PICKLE_NAMES)
            with archive.open(info) as member:
                is_pickle, member_error = scan_container(member, info.file_size, info.filename, found, depth + 1,
                                                         certain, budget=budget)
            any_pickle = any_pickle or is_pickle
            if member_error and error is None:
                error = f"{info.filename}: {member_error}"
    return any_pickle, error


def is_tar(fh, size: int) -> bool:
    """Does Python's tarfile (torch.load's first try) take the first block for a member header? It checks the
    header's checksum, not a magic: a v7 header has none."""
    if size < TAR_BLOCK:
        return False
    fh.seek(0)
    try:
        tarfile.TarInfo.frombuf(fh.read(TAR_BLOCK), "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def _scan_tar(fh, size, name, found, depth, budget) -> tuple[bool, str | None]:
    """Every regular member of a tar, as tarfile reads it (links resolve to members scanned in their turn)."""
    any_pickle, error = False, None
    fh.seek(0)
    try:
        with tarfile.open(fileobj=fh, mode="r:") as archive:
            for info in archive:
                budget.spend(TAR_BLOCK)
                if not info.isreg():
                    continue
                if info.offset_data + info.size > size:
                    return True, f"tar member {info.name!r} runs past the end of the file"
                certain = info.name in _LEGACY_TAR_PICKLES or info.name.lower().endswith(_PICKLE_NAMES)
                member = archive.extractfile(info)
                is_pickle, member_error = scan_container(member, info.size, info.name, found, depth + 1, certain,
                                                         budget=budget)
                any_pickle = any_pickle or is_pickle
                if member_error and error is None:
                    error = f"{info.name}: {member_error}"
    except tarfile.TarError as exc:
        return True, f"a tar archive tarfile cannot read whole ({exc})"
    return any_pickle, error


def _filter_header():
    """numpy's own filter for Python 2 headers (1L, u'...'), wherever this numpy keeps it."""
    try:
        from numpy.lib._format_impl import _filter_header as filter_header
    except ImportError:
        from numpy.lib.format import _filter_header as filter_header
    return filter_header


def _scan_npy(fh, size, found, budget) -> tuple[bool, str | None]:
    """A .npy holding an object array (numpy's own reading of its header) carries a pickle after it."""
    import numpy as np

    fh.seek(0)
    head = fh.read(8)
    version = (head[6], head[7]) if len(head) == 8 else None
    if version not in ((1, 0), (2, 0), (3, 0)):
        return True, f"numpy format version {version} (numpy reads 1.0, 2.0 and 3.0 only)"
    width = 2 if version == (1, 0) else 4
    length = int.from_bytes(fh.read(width), "little")
    if length > MAX_NPY_HEADER or 8 + width + length > size:
        return True, f"a numpy header of {length} bytes"
    raw = fh.read(length)
    try:
        header = raw.decode("utf8" if version == (3, 0) else "latin1")
        try:
            fields = ast.literal_eval(header)
        except SyntaxError:
            if version > (2, 0):
                raise
            fields = ast.literal_eval(_filter_header()(header))
        if not isinstance(fields, dict) or "descr" not in fields:
            raise ValueError("the header is not a dictionary with a descr")
        dtype = np.lib.format.descr_to_dtype(fields["descr"])
    except (SyntaxError, ValueError, TypeError, UnicodeDecodeError, MemoryError, RecursionError,
            AttributeError) as exc:
        return True, f"a numpy header numpy may read otherwise ({type(exc).__name__}: {exc})"
    if not dtype.hasobject:
        return False, None
    consumed = 8 + width + length
    return scan_raw(fh, consumed, size - consumed, found, certain=True, budget=budget)


__all__ = ["NPY_MAGIC", "SEVEN_ZIP_MAGIC", "ZIP_MAGIC", "compression_of", "from_head", "is_tar", "scan_container"]
