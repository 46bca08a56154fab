"""Static pickle scanner (IV506): lists every global a pickle would import, without ever unpickling it.

A pickle is a program: GLOBAL / STACK_GLOBAL / INST import any callable and REDUCE / OBJ / NEWOBJ call it.
We walk the opcodes with `pickletools.genops`, keep a small model of the stack and the memo (so names pushed
as strings and fetched back through the memo cannot hide), and compare each imported name with an allowlist
(SPEC §6). Raw pickle streams, zip-format torch files (every `.pkl` member, nested zips too) and numpy object
arrays are covered. The scan decides; torch's `weights_only=True` is the second lock, never the first.
"""
from __future__ import annotations

import os
import pickle
import pickletools
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .files import open_binary

PICKLE_EXTENSIONS = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")
ZIP_MAGIC = b"PK\x03\x04"
NPY_MAGIC = b"\x93NUMPY"
MAX_ZIP_DEPTH = 3
MAX_ARGUMENT = 1 << 30  # one opcode argument larger than this is not read: the stream is unscannable
MAX_LINE = 64 << 20  # likewise for a protocol-0 text argument

# --- the allowlist (SPEC §6) ----------------------------------------------------------------------------
_TORCH_DTYPES = {
    "float16", "float32", "float64", "bfloat16", "half", "float", "double", "complex32", "complex64",
    "complex128", "cfloat", "cdouble", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "short", "int", "long", "bool", "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
    *(f"uint{n}" for n in range(1, 8)), *(f"int{n}" for n in range(1, 8)),
}
# Layouts and quantisation schemes are arguments of the sparse / quantised tensor rebuilds.
_TORCH_TENSOR_ARGS = {"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc",
                      "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
                      "per_channel_affine_float_qparams"}
_TORCH_REBUILDS = {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
                   "_rebuild_parameter_with_state", "_rebuild_sparse_tensor", "_rebuild_nested_tensor",
                   "_rebuild_qtensor", "_rebuild_wrapper_subclass", "_rebuild_meta_tensor_no_storage",
                   "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_device_tensor_from_numpy"}
ALLOWED_GLOBALS = frozenset({
    "collections.OrderedDict", "_codecs.encode",
    "torch.Size", "torch.device", "torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter",
    "torch._tensor._rebuild_from_type_v2", "torch.serialization._get_layout",
    "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    *(f"torch.{name}" for name in _TORCH_DTYPES | _TORCH_TENSOR_ARGS),
    *(f"torch._utils.{name}" for name in _TORCH_REBUILDS),
})
_ALLOWED_PATTERNS = (
    re.compile(r"torch\.(cuda\.)?[A-Za-z0-9]+Storage"),  # legacy typed storages (torch.FloatStorage, ...)
    re.compile(r"numpy\.dtypes\.[A-Za-z0-9]+DType"),  # numpy 2 dtype classes in RNG states
)
# training_args.bin (scan only, never loaded): TrainingArguments and the transformers/accelerate enums and
# dataclasses it holds: a CamelCase class right under a lowercase module path, never a function or attribute.
INERT_CONFIG_FILES = ("training_args.bin",)
_INERT_CONFIG = re.compile(r"(transformers|accelerate)(\.[a-z_][a-z0-9_]*)*\.[A-Z][A-Za-z0-9]*")

_STRING_OPS = {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
               "SHORT_BINSTRING"}
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_EXT = {"EXT1", "EXT2", "EXT4"}
_OPCODE_BYTES = {bytes([op.code.encode("latin-1")[0]]) for op in pickletools.opcodes}
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_IMPORTABLE = re.compile(rf"{_IDENTIFIER}\.[A-Za-z_][A-Za-z0-9_]*")  # module.name as find_class could resolve


def is_allowed(name: str, category: str = "weights") -> bool:
    if name in ALLOWED_GLOBALS or any(p.fullmatch(name) for p in _ALLOWED_PATTERNS):
        return True
    return category == "inert-config" and bool(_INERT_CONFIG.fullmatch(name))


@dataclass
class ScanResult:
    is_pickle: bool
    globals: set[str] = field(default_factory=set)
    unsafe: list[str] = field(default_factory=list)  # sorted globals outside the allowlist
    error: str | None = None  # the stream could not be read to its end: never load it
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


class _Mark:
    """The MARK opcode's place on the stack."""


_MARK = _Mark()


class _Global(str):
    """An imported object on the stack: never a usable module or attribute name for STACK_GLOBAL."""


def scan_stream(stream, found: set[str]) -> None:
    """Add every global one pickle stream imports to `found`; raise ValueError when it does not parse."""
    stack: list = []
    memo: dict = {}
    for opcode, arg, _pos in pickletools.genops(stream):
        name = opcode.name
        if name in _MEMO_PUT:
            memo[arg] = stack[-1] if stack else None
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else None
        elif name in _MEMO_GET:
            stack.append(memo.get(arg))
        elif name == "DUP":
            stack.append(stack[-1] if stack else None)
        elif name == "MARK":
            stack.append(_MARK)
        elif name == "STACK_GLOBAL":
            attr, module = (stack.pop() if stack else None), (stack.pop() if stack else None)
            # The unpickler takes exact str operands only; anything else was computed at load time and
            # cannot be judged, so it is unsafe by construction.
            known = type(module) is str and type(attr) is str
            value = _Global(f"{module}.{attr}" if known else "<name computed at load time>")
            found.add(str(value))
            stack.append(value)
        else:
            _apply_stack_effect(stack, opcode, name)
            if name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                found.add(f"{module}.{attr}")
                if name == "GLOBAL":
                    stack[-1] = _Global(f"{module}.{attr}")
            elif name in _EXT:
                found.add(f"<copyreg extension code {arg}>")  # resolved through a registry at load time
            elif name in _STRING_OPS:
                stack[-1] = arg


def _apply_stack_effect(stack: list, opcode, name: str) -> None:
    """Pop what the opcode consumes and push placeholders for what it produces (pickletools' own metadata)."""
    before = opcode.stack_before
    if pickletools.markobject in before or (name == "POP" and stack and stack[-1] is _MARK):
        while stack and stack[-1] is not _MARK:
            stack.pop()
        if stack:
            stack.pop()
        below_mark = before.index(pickletools.markobject) if pickletools.markobject in before else 0
        del stack[max(len(stack) - below_mark, 0):]
    else:
        del stack[max(len(stack) - len(before), 0):]
    stack.extend([None] * len(opcode.stack_after))


class _Reader:
    """The stream genops reads: tell(), one-chunk push-back, and no argument longer than what is left (a forged
    length must fail here, not allocate gigabytes)."""

    def __init__(self, raw, size: int):
        self.raw, self.size, self.pos, self.pending = raw, size, 0, b""

    def read(self, n: int) -> bytes:
        if n < 0 or n > self.size - self.pos or n > MAX_ARGUMENT:
            raise ValueError(f"an argument of {n} bytes at offset {self.pos} runs past the end of the data")
        head, self.pending = self.pending[:n], self.pending[n:]
        rest = self.raw.read(n - len(head)) if len(head) < n else b""
        self.pos += len(head) + len(rest)
        return head + rest

    def readline(self) -> bytes:
        line = b""
        while self.pending and not line.endswith(b"\n"):
            cut = self.pending.find(b"\n")
            line += self.read(cut + 1 if cut >= 0 else len(self.pending))
        if not line.endswith(b"\n"):
            rest = self.raw.readline(MAX_LINE)
            self.pos += len(rest)
            line += rest
        if len(line) >= MAX_LINE and not line.endswith(b"\n"):
            raise ValueError(f"a text argument longer than {MAX_LINE} bytes at offset {self.pos}")
        return line

    def tell(self) -> int:
        return self.pos


def _scan_raw(raw, size: int, found: set[str]) -> str | None:
    """Scan consecutive pickle streams (torch's legacy format unpickles several in a row).

    Returns why the first stream could not be read to its end, None when it could. The unpickler runs opcodes
    as it reads them, so the names a broken stream imported before it broke still count; in a stream that
    never parsed they count only when they could be imported at all (junk bytes are not names)."""
    reader = _Reader(raw, size)
    first = True
    while reader.pos < size:
        names: set[str] = set()
        try:
            scan_stream(reader, names)
        except ValueError as exc:
            found |= {n for n in names if _IMPORTABLE.fullmatch(n)}
            return str(exc) if first else None  # after a complete stream: raw storage bytes, never unpickled
        found |= names
        first = False
    return "no data" if first else None


def _scan_npy(raw, size: int, found: set[str]) -> str | None:
    """A .npy holding an object array carries a pickle after its header: scan it. "" when there is none."""
    head = raw.read(10)
    if not head.startswith(NPY_MAGIC) or len(head) < 10:
        return ""
    length = head[8:10] if head[6] == 1 else head[8:10] + raw.read(2)
    header = raw.read(int.from_bytes(length, "little"))
    if not re.search(rb"'descr':\s*'\|?O'", header):
        return ""
    consumed = 8 + len(length) + len(header)  # magic and version, header length, header
    return _scan_raw(raw, size - consumed, found)


def _scan_zip(zf: zipfile.ZipFile, found: set[str], depth: int) -> tuple[bool, str | None]:
    """Scan every pickle inside a zip (torch's data.pkl, constants.pkl, nested archives): (any pickle, error)."""
    any_pickle, error = False, None
    for info in zf.infolist():
        if info.is_dir():
            continue
        with zf.open(info) as member:
            head = member.read(len(ZIP_MAGIC))
        if info.filename.lower().endswith((".pkl", ".pickle")):
            with zf.open(info) as member:
                error = error or _scan_raw(member, info.file_size, found)
            any_pickle = True
        elif head == ZIP_MAGIC:
            if depth >= MAX_ZIP_DEPTH:
                return True, f"archives nested more than {MAX_ZIP_DEPTH} deep ({info.filename})"
            # Read in place (zip members are seekable): a large nested archive is never held in memory.
            with zf.open(info) as member, zipfile.ZipFile(member) as inner:
                inner_pickle, inner_error = _scan_zip(inner, found, depth + 1)
            any_pickle, error = any_pickle or inner_pickle, error or inner_error
        elif head == NPY_MAGIC[:4]:
            with zf.open(info) as member:
                npy_error = _scan_npy(member, info.file_size, found)
            any_pickle, error = any_pickle or npy_error != "", error or npy_error or None
    return any_pickle, error


def sniff(path: str | os.PathLike) -> str | None:
    """What the first bytes say: 'pickle' (protocol 2+ magic), 'zip', 'npy', 'opcode' (begins with a pickle
    opcode, as protocol 0/1 and headerless pickles do) or None."""
    try:
        with open_binary(path) as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return None
    return sniff_head(head, path)


SNIFF_BYTES = 16


def sniff_head(head: bytes, path: str | os.PathLike) -> str | None:
    """sniff() on the first SNIFF_BYTES bytes already read."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= pickle.HIGHEST_PROTOCOL:
        return "pickle"
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(NPY_MAGIC):
        return "npy"
    if head[:1] in _OPCODE_BYTES and not _other_format(head, path):
        return "opcode"
    return None


def _other_format(head: bytes, path) -> bool:
    """Formats that merely start with an opcode byte: safetensors (8-byte length, then a JSON header)."""
    return str(path).endswith(".safetensors") or head[8:10] == b'{"'


def has_pickle_extension(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(PICKLE_EXTENSIONS)


def is_pickle_or_torch_zip(path: str | os.PathLike, head: bytes | None = None) -> bool:
    """Worth scanning: a pickle extension, or the first bytes of a pickle, a zip or a numpy array. `head`: the
    first SNIFF_BYTES bytes when already in memory (the file is then not opened)."""
    return has_pickle_extension(path) or (sniff(path) if head is None else sniff_head(head, path)) is not None


def category_of(path: str | os.PathLike) -> str:
    return "inert-config" if Path(path).name in INERT_CONFIG_FILES else "weights"


def scan_file(path: str | os.PathLike) -> ScanResult:
    """Scan one file. A file that is neither a pickle nor an archive holding one gives is_pickle=False."""
    result = ScanResult(is_pickle=False, category=category_of(path))
    kind = sniff(path)
    found: set[str] = set()
    try:
        size = os.stat(path).st_size
        if kind == "zip":
            with open_binary(path) as fh, zipfile.ZipFile(fh) as zf:
                result.is_pickle, result.error = _scan_zip(zf, found, 1)
        elif kind == "npy":
            with open_binary(path) as fh:
                error = _scan_npy(fh, size, found)
            result.is_pickle, result.error = error != "", error or None
        elif kind in ("pickle", "opcode") or has_pickle_extension(path):
            with open_binary(path) as fh:
                error = _scan_raw(fh, size, found)
            # A stream that breaks at once is not a pickle (an image named .pt), unless it had the magic or
            # already imported something.
            result.is_pickle = error is None or kind == "pickle" or bool(found)
            result.error = error if result.is_pickle else None
    except zipfile.BadZipFile as exc:
        # A torch file cut short no longer opens as a zip: still a pickle container, and never loadable.
        result.is_pickle = has_pickle_extension(path) or bool(found)
        result.error = f"damaged zip archive ({exc})"
    except (OSError, EOFError, RuntimeError, ValueError, NotImplementedError, zlib.error) as exc:
        result.is_pickle = True
        result.error = f"{type(exc).__name__}: {exc}"
    result.globals = found
    result.unsafe = sorted(g for g in found if not is_allowed(g, result.category))
    return result


SCAN_SETTING = "pickle_scan"  # package.settings key: {relative path: ScanResult}


def scan_package(package) -> dict[str, ScanResult]:
    """Scan each candidate file of a package once (pickle extension or pickle-like first bytes); the results
    stay on the package so the reload step refuses what the scan refused, without scanning twice."""
    results: dict[str, ScanResult] = package.settings.setdefault(SCAN_SETTING, {})
    for rel in sorted(package.files):
        if rel in results:
            continue
        path = package.os_path(rel)
        # The first bytes of a document the checks already read come from memory: no second open per file.
        if is_pickle_or_torch_zip(path, package.cached_head(rel, SNIFF_BYTES)):
            results[rel] = scan_file(path)
    return results
