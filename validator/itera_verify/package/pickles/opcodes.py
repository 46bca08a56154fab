"""The opcode walk: every global one pickle stream imports, read as CPython's unpicklers read it, never unpickled.

`read_ops` reads each opcode and its argument the way the C unpickler (`pickle.load`, torch.load) and the
pure-Python one (`pickle._Unpickler`, joblib's) read them, and stops only where both stop: INT takes C's base-0
`strtol` forms (`0x1`, `010`, a NUL ending the number), FLOAT C's or `float()`'s, GLOBAL names are bytes decoded
without escapes. `pickletools.genops` reads INT and LONG in base 10 and GLOBAL lines with escapes: a stream it
gave up on at byte 0 could still run. tests/test_pickle_differential.py compares the two with `pickle.loads`.

An argument longer than the walk keeps (MAX_LINE, MAX_ARGUMENT) is read through in chunks, paid from the
package's scan budget, and stands for an UNKNOWN value: CPython reads a line of any length and a counted
argument of any length the data holds, then runs what follows, so the walk goes on where it does.

A small model of the stack, the marks and the memo keeps names pushed as strings and fetched back through the
memo from hiding. The model fails where the real unpickler fails (a stack underflow, a missing MARK or memo
entry), so a stream the scanner calls complete is one the unpickler would also read to its STOP. It keeps
which values are imported objects themselves, so state set on a class or function (BUILD, SETITEM(S),
APPEND(S), ADDITEMS on it) is named as unsafe: it would re-point that object for the whole loading process.
"""
from __future__ import annotations

import codecs
import pickletools
import re
import struct
from dataclasses import dataclass, field

from .budget import OPCODE_UNITS, Budget

MAX_ARGUMENT = 1 << 20  # a counted argument longer than this is read through, never kept: its value is UNKNOWN
MAX_LINE = 1 << 20  # likewise for a protocol-0 text argument (a line)
SKIP_CHUNK = 1 << 20  # what one read takes while streaming past a long argument
LONG_HEAD = 256  # bytes of a long line kept for naming it (a GLOBAL's long name)
HIGHEST_PROTOCOL = 5

_STRING_OPS = {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
               "SHORT_BINSTRING"}
_INT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_FRAMING = {"PROTO", "FRAME", "STOP", "MEMOIZE", *_MEMO_PUT}
_EXT = {"EXT1", "EXT2", "EXT4"}
# Opcodes that set state on the value below their arguments: on an imported object they change it for everyone.
_STATE_SETTERS = {"BUILD": 2, "SETITEM": 3, "APPEND": 2}  # depth of the target below the top of the stack
_MARKED_SETTERS = {"SETITEMS", "APPENDS", "ADDITEMS"}  # the target lies right below the MARK
_OPS = {op.code.encode("latin-1")[0]: op for op in pickletools.opcodes}
OPCODE_BYTES = frozenset(_OPS)
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
IMPORTABLE = re.compile(rf"{_IDENTIFIER}\.[A-Za-z_][A-Za-z0-9_]*")  # module.name as find_class could resolve

# PyLong_FromString's grammar (int(s, 0) / int(s, 10)): C whitespace, a sign, digits with single underscores.
_WS = rb"[ \t\n\r\x0b\x0c]*"
_PYLONG0 = re.compile(_WS + rb"[+-]?(0[xX](_?[0-9a-fA-F])+|0[oO](_?[0-7])+|0[bB](_?[01])+|0(_?0)*|[1-9](_?[0-9])*)"
                      + _WS)
_PYLONG10 = re.compile(_WS + rb"[+-]?[0-9](_?[0-9])*" + _WS)
# _Py_dg_strtod / _Py_parse_inf_or_nan: what C's load_float accepts before a newline or NUL.
_C_FLOAT = re.compile(rb"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|(?i:infinity|inf|nan))")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


MAX_STRINGS_KEPT = 1 << 20


@dataclass
class Stream:
    """What one complete stream held, for recognising torch's legacy layout without unpickling it."""
    values: int = 0  # opcodes other than framing and memo bookkeeping
    first_int: int | None = None  # the first value's integer, when it is one (the legacy magic number)
    strings: list[str] = field(default_factory=list)  # strings pushed (the legacy storage-key list)
    storage_types: dict[str, str] = field(default_factory=dict)  # legacy ('storage', type, key, ...) ids


class _Global(str):
    """An imported object on the stack: never a usable module or attribute name for STACK_GLOBAL."""


class _Unknown:
    """The value of an argument read through but not kept: never a usable name, never a memo index."""

    def __repr__(self) -> str:
        return f"<an argument longer than {MAX_ARGUMENT} bytes>"


UNKNOWN = _Unknown()


class Long(bytes):
    """A line longer than MAX_LINE, read through: its first LONG_HEAD bytes (and its newline when it has one)."""

    length: int = 0


class _LongValue(Exception):
    """An argument read through: its value is UNKNOWN (read_ops catches it)."""


class CutGlobal(ValueError):
    """A GLOBAL or INST whose last line the data cuts short: pickle.py imports what it names, then stops."""

    def __init__(self, name: str | None, pos: int):
        super().__init__(f"a global name at offset {pos} runs past the end of the data")
        self.name, self.pos = name, pos


# A pseudo-global: an opcode or its argument runs across the end of a FRAME (never on the allowlist).
FRAME_CROSSED = "<a read across the end of a FRAME, which CPython's unpicklers read three ways>"


# ---------------------------------------------------------------------------------------------- arguments

def _exact(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ValueError(f"an argument of {n} bytes runs past the end of the data")
    return data


def _line(stream) -> bytes:
    line = stream.readline()
    if not line.endswith(b"\n"):
        raise ValueError("a text argument has no newline before the end of the data")
    if isinstance(line, Long):
        raise _LongValue
    return line


def _pylong(text: bytes, pattern: re.Pattern) -> int:
    """int(text, base) as PyLong_FromString reads it, without Python's digit limit (an older Python has none)."""
    if not pattern.fullmatch(text):
        raise ValueError(f"{text[:40]!r} is not an integer")
    try:
        return int(text, 0 if pattern is _PYLONG0 else 10)
    except ValueError:  # past sys.get_int_max_str_digits(): valid all the same
        return 0


def _strtol0(text: bytes) -> int | None:
    """C strtol(text, &end, 0) when `end` reaches the end of `text` without overflow, else None."""
    i, n = 0, len(text)
    while i < n and text[i] in b" \t\n\r\x0b\x0c":
        i += 1
    negative = i < n and text[i] == 0x2D
    i += i < n and text[i] in b"+-"
    if text[i:i + 2] in (b"0x", b"0X") and i + 2 < n and chr(text[i + 2]) in "0123456789abcdefABCDEF":
        base, i = 16, i + 2
    else:
        base = 8 if text[i:i + 1] == b"0" else 10
    start = i
    while i < n and chr(text[i]).lower() in "0123456789abcdef"[:base]:
        i += 1
    if i == start:
        return 0 if n == 0 else None  # no digits: `end` is the string's start, fine only for an empty one
    digits = text[start:i].lstrip(b"0") or b"0"
    if len(digits) > 22:  # past any C long (and past int()'s digit limit): strtol overflows
        return None
    value = int(digits, base) * (-1 if negative else 1)
    if i != n and text[i:] != b"\n" or not _LONG_MIN <= value <= _LONG_MAX:
        return None
    return value


def _int_arg(stream) -> int:
    """INT: C's load_int, strtol(s, 0) ending at the newline or a NUL, else PyLong_FromString(s, 0)."""
    line = _line(stream)
    if len(line) < 2:
        raise ValueError("an empty INT argument")
    text = line.split(b"\0", 1)[0]  # C reads the line as a C string
    value = _strtol0(text)
    return _pylong(text, _PYLONG0) if value is None else value


def _long_arg(stream) -> int:
    line = _line(stream)
    if len(line) < 2:
        raise ValueError("an empty LONG argument")
    text = line[:-2] if line[-2:-1] == b"L" else line
    return _pylong(text.split(b"\0", 1)[0], _PYLONG0)


def _float_arg(stream) -> float:
    """FLOAT: what either unpickler accepts (C: a float ending at the newline or a NUL, no overflow; pickle.py:
    float() of the line, spaces and underscores allowed)."""
    line = _line(stream)
    match = _C_FLOAT.match(line)
    if len(line) >= 2 and match and line[match.end():match.end() + 1] in (b"\n", b"\0"):
        value = float(match.group())
        if value not in (float("inf"), float("-inf")) or b"n" in match.group().lower():
            return value
    return float(line[:-1])  # pickle.py's reading; raises ValueError where it stops too


def _decimal_arg(stream) -> int:
    """GET / PUT: a base-10 index."""
    line = _line(stream)
    return _pylong(line.split(b"\0", 1)[0], _PYLONG10)


def _string_arg(stream) -> str:
    """STRING: quoted, with escapes; decoded as latin-1, the most lenient `encoding` a loader passes."""
    text = _line(stream)[:-1]
    if not (len(text) >= 2 and text[0] == text[-1] and text[:1] in (b"'", b'"')):
        raise ValueError("a STRING argument without quotes")
    return codecs.escape_decode(text[1:-1])[0].decode("latin-1")


def _names(stream, encoding: str, pos: int) -> tuple[str, str]:
    """GLOBAL / INST: two lines, no escapes. A last line cut short is still imported by pickle.py."""
    first = stream.readline()
    second = stream.readline() if first.endswith(b"\n") else b""
    if not second.endswith(b"\n"):
        try:
            name = f"{_name_part(first, encoding)}.{_name_part(second, encoding)}" if first else None
        except UnicodeDecodeError:
            name = None
        raise CutGlobal(None if isinstance(first, Long) else name, pos)  # a long module name never imports
    return _name_part(first, encoding), _name_part(second, encoding)


def _name_part(line: bytes, encoding: str) -> str:
    """One line of a GLOBAL / INST name; a long one is named by its head (never on the allowlist)."""
    text = line.rstrip(b"\n").decode(encoding, "replace" if isinstance(line, Long) else "strict")
    return f"{text}...<{line.length} bytes>" if isinstance(line, Long) else text


def _counted(width: int, fmt: str, kind: str):
    def read(stream):
        (n,) = struct.unpack(fmt, _exact(stream, width))
        if n < 0:
            raise ValueError(f"a negative length ({n})")
        if n > MAX_ARGUMENT:
            stream.skip(n)
            raise _LongValue
        data = _exact(stream, n)
        if kind == "str":
            return data.decode("latin-1")
        if kind == "unicode":
            return data.decode("utf-8", "surrogatepass")
        if kind == "long":
            return int.from_bytes(data, "little", signed=True)
        return data
    return read


def _fixed(fmt: str):
    size = struct.calcsize(fmt)
    return lambda stream: struct.unpack(fmt, _exact(stream, size))[0]


def _proto(stream) -> int:
    (version,) = _exact(stream, 1)
    if version > HIGHEST_PROTOCOL:
        raise ValueError(f"unsupported pickle protocol {version}")
    return version


def _persid(stream) -> str:
    return _line(stream)[:-1].decode("ascii")  # both unpicklers want an ASCII persistent id


_ARGUMENTS = {
    "INT": _int_arg, "LONG": _long_arg, "FLOAT": _float_arg, "STRING": _string_arg,
    "UNICODE": lambda s: _line(s)[:-1].decode("raw-unicode-escape"), "GET": _decimal_arg, "PUT": _decimal_arg,
    "PERSID": _persid, "BININT": _fixed("<i"), "BININT1": _fixed("<B"), "BININT2": _fixed("<H"),
    "LONG1": _counted(1, "<B", "long"), "LONG4": _counted(4, "<i", "long"),
    "BINSTRING": _counted(4, "<i", "str"), "SHORT_BINSTRING": _counted(1, "<B", "str"),
    "BINBYTES": _counted(4, "<I", "bytes"), "SHORT_BINBYTES": _counted(1, "<B", "bytes"),
    "BINBYTES8": _counted(8, "<Q", "bytes"), "BYTEARRAY8": _counted(8, "<Q", "bytes"),
    "BINUNICODE": _counted(4, "<I", "unicode"), "SHORT_BINUNICODE": _counted(1, "<B", "unicode"),
    "BINUNICODE8": _counted(8, "<Q", "unicode"), "BINFLOAT": _fixed(">d"),
    "BINGET": _fixed("<B"), "BINPUT": _fixed("<B"), "LONG_BINGET": _fixed("<I"), "LONG_BINPUT": _fixed("<I"),
    "EXT1": _fixed("<B"), "EXT2": _fixed("<H"), "EXT4": _fixed("<i"), "PROTO": _proto, "FRAME": _fixed("<Q"),
}


def read_ops(stream):
    """(opcode, argument, offset) of each opcode up to its STOP; ValueError where no CPython unpickler reads on.

    FRAME is a hint: C checks its length, pickle.py does not, so it never stops the walk."""
    while True:
        pos = stream.tell()
        code = stream.read(1) if stream.size - stream.pos >= 1 else b""
        if not code:
            raise ValueError(f"the data ends at offset {pos} before a STOP opcode")
        op = _OPS.get(code[0])
        if op is None:
            raise ValueError(f"byte {code[0]:#04x} at offset {pos} is no pickle opcode")
        if op.name in ("GLOBAL", "INST"):
            arg = _names(stream, "utf-8" if op.name == "GLOBAL" else "ascii", pos)
        else:
            reader = _ARGUMENTS.get(op.name)
            try:
                arg = reader(stream) if reader else None
            except _LongValue:
                arg = UNKNOWN
        yield op, arg, pos
        if op.name == "STOP":
            return


# ---------------------------------------------------------------------------------------------- the walk

def _underflow(name: str, pos) -> ValueError:
    return ValueError(f"{name} at offset {pos} pops more than the stack holds: the unpickler stops there")


def scan_stream(stream, found: set[str]) -> Stream:
    """Add every global one pickle stream imports to `found`; raise ValueError when it does not parse.

    `stream` is a Reader: its budget pays for every opcode walked."""
    stack: list = []
    marks: list[int] = []  # stack heights at each MARK: the unpickler's metastack
    memo: dict = {}
    memo_unknown = False  # a PUT at an index read through: any later GET may fetch what it stored
    info = Stream()
    budget: Budget = stream.budget
    walked = 0
    frame_end = None  # where the current FRAME's bytes end
    ops = read_ops(stream)
    while True:
        try:
            opcode, arg, pos = next(ops)
        except StopIteration:
            break
        except CutGlobal as exc:
            if exc.name:
                found.add(exc.name)
            if frame_end is not None and exc.pos < frame_end < stream.tell():
                found.add(FRAME_CROSSED)
            raise
        end = stream.tell()
        if frame_end is not None and pos < frame_end < end:
            # pickle.loads reads frames as if they were not there, pickle.py refuses the stream, and the C
            # unpickler reading a file (torch.load, np.load) drops the frame's rest and reads the line from after
            # it: three readings of one stream, so it is refused whatever the names (the pickler never writes it).
            found.add(FRAME_CROSSED)
        if opcode.name == "FRAME" and isinstance(arg, int):
            frame_end = end + arg
        elif frame_end is not None and end >= frame_end:
            frame_end = None
        walked += 1
        if walked & 1023 == 0:
            budget.spend(1024 * OPCODE_UNITS)
        name = opcode.name
        above_mark = len(stack) - (marks[-1] if marks else 0)
        if name not in _FRAMING:
            info.values += 1
            if info.values == 1 and name in _INT_OPS:
                info.first_int = arg
        if name in _STATE_SETTERS and above_mark >= _STATE_SETTERS[name]:
            _refuse_state_on_global(stack[-_STATE_SETTERS[name]], name, found)
        elif name in _MARKED_SETTERS and marks and marks[-1] >= 1:
            _refuse_state_on_global(stack[marks[-1] - 1], name, found)
        if name in _MEMO_PUT or name == "MEMOIZE":
            if above_mark < 1:
                raise _underflow(name, pos)
            if arg is UNKNOWN:
                memo_unknown = True
            elif name == "PUT" and arg < 0:
                raise ValueError(f"PUT at offset {pos} has a negative index")
            else:
                memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in _MEMO_GET:
            if arg in memo:
                stack.append(memo[arg])
            elif arg is UNKNOWN or memo_unknown:  # an older Python reads "000…01" as 1: it may fetch anything
                stack.append(_Global("<a memo entry at an index the walk did not keep>"))
            else:
                raise ValueError(f"{name} at offset {pos} fetches memo entry {arg}, which was never stored")
        elif name == "DUP":
            if above_mark < 1:
                raise _underflow(name, pos)
            stack.append(stack[-1])
        elif name == "MARK":
            marks.append(len(stack))
        elif name == "POP" and marks and marks[-1] == len(stack):
            marks.pop()  # POP of a mark drops the mark
        elif name == "STACK_GLOBAL":
            if above_mark < 2:
                raise _underflow(name, pos)
            attr, module = stack.pop(), stack.pop()
            # The unpickler takes exact str operands only; anything else was computed at load time and
            # cannot be judged, so it is unsafe by construction.
            known = type(module) is str and type(attr) is str
            value = _Global(f"{module}.{attr}" if known else "<name computed at load time>")
            found.add(str(value))
            stack.append(value)
        else:
            if name in ("GLOBAL", "INST"):  # the unpickler imports before it builds anything
                module, attr = arg
                found.add(f"{module}.{attr}")
            elif name in _EXT:
                found.add(f"<copyreg extension code {arg}>")  # resolved through a registry at load time
            elif name == "TUPLE" and marks:
                _note_storage(stack[marks[-1]:], info)
            _apply_stack_effect(stack, marks, opcode, name, pos, above_mark)
            if name == "GLOBAL":
                stack[-1] = _Global(f"{module}.{attr}")
            elif name in _STRING_OPS:
                stack[-1] = arg
                if type(arg) is str and len(info.strings) < MAX_STRINGS_KEPT:
                    info.strings.append(arg)
    budget.spend((walked & 1023) * OPCODE_UNITS)
    return info


def _refuse_state_on_global(target, name: str, found: set[str]) -> None:
    if isinstance(target, _Global):
        found.add(f"<{name} setting state on {target}>")


def _note_storage(items: list, info: Stream) -> None:
    """A legacy persistent id ('storage', torch.<Type>Storage, key, location, numel): the key's type."""
    if len(items) >= 3 and items[0] == "storage" and isinstance(items[1], _Global) and type(items[2]) is str:
        info.storage_types[items[2]] = str(items[1])


def _apply_stack_effect(stack: list, marks: list[int], opcode, name: str, pos, above_mark: int) -> None:
    """Pop what the opcode consumes and push placeholders for what it produces (pickletools' own metadata)."""
    before = opcode.stack_before
    if pickletools.markobject in before:
        if not marks:
            raise ValueError(f"{name} at offset {pos} needs a MARK and there is none")
        del stack[marks.pop():]
        below_mark = before.index(pickletools.markobject)
        if len(stack) - (marks[-1] if marks else 0) < below_mark:
            raise _underflow(name, pos)
        del stack[len(stack) - below_mark:]
    else:
        if above_mark < len(before):
            raise _underflow(name, pos)
        del stack[len(stack) - len(before):]
    stack.extend([None] * len(opcode.stack_after))


class Reader:
    """The stream the walk reads: tell(), and no argument longer than what is left (a forged length must fail
    here, not allocate gigabytes). An argument longer than the walk keeps is read through in SKIP_CHUNK pieces,
    each byte paid from `budget`: the package's scan budget (a fresh default one when None)."""

    def __init__(self, raw, size: int, budget: Budget | None = None):
        self.raw, self.size, self.pos = raw, size, 0
        self.budget = budget if budget is not None else Budget()

    def read(self, n: int) -> bytes:
        if n < 0 or n > self.size - self.pos:
            raise ValueError(f"an argument of {n} bytes at offset {self.pos} runs past the end of the data")
        data = self.raw.read(n)
        self.pos += len(data)
        return data

    def skip(self, n: int) -> None:
        """Read `n` bytes through without keeping them (the unpickler reads them all)."""
        if n > self.size - self.pos:
            raise ValueError(f"an argument of {n} bytes at offset {self.pos} runs past the end of the data")
        while n:
            self.budget.spend(min(n, SKIP_CHUNK))
            chunk = self.raw.read(min(n, SKIP_CHUNK))
            if not chunk:
                raise ValueError(f"the data ends at offset {self.pos}, inside an argument")
            self.pos += len(chunk)
            n -= len(chunk)

    def readline(self) -> bytes:
        """A line with its newline (without one: the data ended); a Long for a line longer than MAX_LINE."""
        line = self.raw.readline(min(MAX_LINE, max(self.size - self.pos, 0)))
        self.pos += len(line)
        if len(line) < MAX_LINE or line.endswith(b"\n"):
            return line
        length, chunk = len(line), b""
        self.budget.spend(length)
        while not chunk.endswith(b"\n"):
            chunk = self.raw.readline(min(SKIP_CHUNK, max(self.size - self.pos, 0)))
            if not chunk:
                break
            self.budget.spend(len(chunk))
            self.pos += len(chunk)
            length += len(chunk)
        long = Long(line[:LONG_HEAD] + (b"\n" if chunk.endswith(b"\n") else b""))
        long.length = length
        return long

    def tell(self) -> int:
        return self.pos
