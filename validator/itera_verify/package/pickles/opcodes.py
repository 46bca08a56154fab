"""The opcode walk: every global one pickle stream imports, read with `pickletools.genops`, never unpickled.

A small model of the stack, the marks and the memo keeps names pushed as strings and fetched back through the
memo from hiding. The model fails where the real unpickler fails (a stack underflow, a missing MARK or memo
entry), so a stream the scanner calls complete is one the unpickler would also read to its STOP.
"""
from __future__ import annotations

import pickletools
import re
from dataclasses import dataclass, field

MAX_ARGUMENT = 1 << 30  # one opcode argument larger than this is not read: the stream is unscannable
MAX_LINE = 64 << 20  # likewise for a protocol-0 text argument

_STRING_OPS = {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
               "SHORT_BINSTRING"}
_INT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_FRAMING = {"PROTO", "FRAME", "STOP", "MEMOIZE", *_MEMO_PUT}
_EXT = {"EXT1", "EXT2", "EXT4"}
OPCODE_BYTES = frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes)
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
IMPORTABLE = re.compile(rf"{_IDENTIFIER}\.[A-Za-z_][A-Za-z0-9_]*")  # module.name as find_class could resolve


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


def _underflow(name: str, pos) -> ValueError:
    return ValueError(f"{name} at offset {pos} pops more than the stack holds: the unpickler stops there")


def scan_stream(stream, found: set[str]) -> Stream:
    """Add every global one pickle stream imports to `found`; raise ValueError when it does not parse."""
    stack: list = []
    marks: list[int] = []  # stack heights at each MARK: the unpickler's metastack
    memo: dict = {}
    info = Stream()
    for opcode, arg, pos in pickletools.genops(stream):
        name = opcode.name
        above_mark = len(stack) - (marks[-1] if marks else 0)
        if name not in _FRAMING:
            info.values += 1
            if info.values == 1 and name in _INT_OPS:
                info.first_int = arg
        if name in _MEMO_PUT or name == "MEMOIZE":
            if above_mark < 1:
                raise _underflow(name, pos)
            memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in _MEMO_GET:
            if arg not in memo:
                raise ValueError(f"{name} at offset {pos} fetches memo entry {arg}, which was never stored")
            stack.append(memo[arg])
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
                module, _, attr = str(arg).partition(" ")
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
                if len(info.strings) < MAX_STRINGS_KEPT:
                    info.strings.append(arg if isinstance(arg, str) else "")
    return info


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
    """The stream genops reads: tell(), and no argument longer than what is left (a forged length must fail
    here, not allocate gigabytes)."""

    def __init__(self, raw, size: int):
        self.raw, self.size, self.pos = raw, size, 0

    def read(self, n: int) -> bytes:
        if n < 0 or n > self.size - self.pos or n > MAX_ARGUMENT:
            raise ValueError(f"an argument of {n} bytes at offset {self.pos} runs past the end of the data")
        data = self.raw.read(n)
        self.pos += len(data)
        return data

    def readline(self) -> bytes:
        line = self.raw.readline(min(MAX_LINE, max(self.size - self.pos, 0)))
        self.pos += len(line)
        if len(line) >= MAX_LINE and not line.endswith(b"\n"):
            raise ValueError(f"a text argument longer than {MAX_LINE} bytes at offset {self.pos}")
        return line

    def tell(self) -> int:
        return self.pos
