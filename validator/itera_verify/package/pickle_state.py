"""The plain fields of an object a pickle builds, read from its opcodes: nothing is imported, called or unpickled.

The Trainer pickles its TrainingArguments into every checkpoint's training_args.bin (a zip-format torch.save file):
a dataclass built by NEWOBJ, then BUILD with a dict of its fields. Walking the opcodes with a symbolic stack (plain
values as themselves, containers as containers, every import a label and every call an opaque object) gives those
fields without running anything, so the static checks compare the run's own record of its learning rate, seed and
steps with what the package declares (format/facts.py). The same walk gives the keys of the dict a resume file
holds (`top_level_keys`, for rules/_resume_files.py). The scanner (package/pickles) decides whether a file may be
loaded; this reads values, and loads nothing either way.
"""
from __future__ import annotations

import os
import pickletools
import zipfile
from dataclasses import dataclass
from typing import Any, BinaryIO

from .pickles.zips import AmbiguousZip, open_checked

MAX_ARGS_PICKLE = 8 << 20  # a pickled TrainingArguments is ~4 KB, ~100 KB with a DeepSpeed configuration
MAX_DATA_PKL = 64 << 20  # the object graph of a resume file, tensors excluded: megabytes at most
MAX_OPCODES = 500_000


class _Global(str):
    """An imported name, `module name`: a label, never imported."""


@dataclass(eq=False)  # hashable by identity: a dict keyed by an opaque object still reads
class _Object:
    cls: Any
    state: Any = None


def _pop_mark(stack: list, marks: list[int]) -> list:
    start = marks.pop()
    items = stack[start:]
    del stack[start:]
    return items


PLAIN = (str, int, float, bool, type(None))
DICT_CLASSES = ("collections OrderedDict", "builtins dict")


def _plain(value: Any) -> Any:
    """A value of the state as JSON would hold it: scalars, lists of scalars; anything else is left out."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, PLAIN) for v in value):
        return list(value)
    return _Object


class _Unread(Exception):
    """The walk met what it does not follow (or went past its opcode bound)."""


def built_value(data: bytes, max_opcodes: int | None = MAX_OPCODES) -> Any:
    """What a pickle builds, walked on a symbolic stack: plain values as themselves, dicts, lists and tuples as
    such, every import a label and every other call or object an opaque `_Object`. An enum member (`REDUCE` of
    a class with one plain argument) reads as that argument: `SchedulerType('linear')` is 'linear'. _Unread
    when the opcodes are not followed."""
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    try:
        for count, (opcode, arg, _pos) in enumerate(pickletools.genops(data)):
            if max_opcodes is not None and count > max_opcodes:
                raise _Unread(f"more than {max_opcodes} opcodes")
            name = opcode.name
            if name == "STOP":
                break
            if name == "MARK":
                marks.append(len(stack))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
                stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
            elif opcode.stack_after == [pickletools.pyunicode] or opcode.stack_after == [pickletools.pystring] \
                    or opcode.stack_after in ([pickletools.pyint], [pickletools.pylong], [pickletools.pyfloat],
                                              [pickletools.pybool], [pickletools.pyinteger_or_bool]):
                stack.append(arg)
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "DICT":
                items = _pop_mark(stack, marks)
                stack.append(dict(zip(items[0::2], items[1::2])))
            elif name == "SETITEM":
                key, value = stack[-2], stack[-1]
                del stack[-2:]
                if isinstance(stack[-1], dict):
                    stack[-1][key] = value
            elif name == "SETITEMS":
                items = _pop_mark(stack, marks)
                if isinstance(stack[-1], dict):
                    stack[-1].update(zip(items[0::2], items[1::2]))
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "APPEND":
                item = stack.pop()
                if isinstance(stack[-1], list):
                    stack[-1].append(item)
            elif name == "APPENDS":
                items = _pop_mark(stack, marks)
                if isinstance(stack[-1], list):
                    stack[-1].extend(items)
            elif name == "LIST":
                stack.append(_pop_mark(stack, marks))
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                size = int(name[-1])
                items = tuple(stack[-size:])
                del stack[-size:]
                stack.append(items)
            elif name == "TUPLE":
                stack.append(tuple(_pop_mark(stack, marks)))
            elif name == "GLOBAL":
                stack.append(_Global(arg))
            elif name == "STACK_GLOBAL":
                module, attribute = stack[-2], stack[-1]
                del stack[-2:]
                stack.append(_Global(f"{module} {attribute}"))
            elif name == "REDUCE":
                callable_, args = stack[-2], stack[-1]
                del stack[-2:]
                plain = isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], PLAIN)
                if callable_ in DICT_CLASSES:
                    stack.append({})  # OrderedDict(), then SETITEMS
                else:
                    stack.append(args[0] if plain and isinstance(callable_, _Global) else _Object(callable_))
            elif name in ("NEWOBJ", "NEWOBJ_EX"):
                size = 2 if name == "NEWOBJ" else 3
                cls = stack[-size]
                del stack[-size:]
                stack.append(_Object(cls))
            elif name == "BUILD":
                state = stack.pop()
                if isinstance(stack[-1], _Object):
                    stack[-1].state = state
            else:
                _generic(opcode, stack, marks)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:
        raise _Unread(str(exc)) from None
    if not stack:
        raise _Unread("nothing built")
    return stack[-1]


def object_state(data: bytes) -> dict[str, Any] | None:
    """The plain fields of the object a pickle builds (a dataclass such as TrainingArguments: NEWOBJ, then BUILD
    with a dict); None when the pickle is not one such object."""
    try:
        built = built_value(data)
    except _Unread:
        return None
    state = built.state if isinstance(built, _Object) else None
    if isinstance(state, tuple) and state and isinstance(state[0], dict):
        state = state[0]  # (dict, slots)
    if not isinstance(state, dict):
        return None
    values = {key: _plain(value) for key, value in state.items() if isinstance(key, str)}
    return {key: value for key, value in values.items() if value is not _Object}


def _generic(opcode, stack: list, marks: list[int]) -> None:
    """Any other opcode by its declared stack effect: what it consumes goes, opaque placeholders come."""
    before = opcode.stack_before
    if pickletools.markobject in before:
        _pop_mark(stack, marks)
        count = before.index(pickletools.markobject)
    else:
        count = len(before)
    if count:
        if count > len(stack):
            raise IndexError("stack underflow")
        del stack[-count:]
    stack.extend([_Object(None)] * len(opcode.stack_after))


def data_pkl(fh: BinaryIO, max_bytes: int) -> bytes | None:
    """The one `<name>/data.pkl` of a zip-format torch.save file (the zip read as package/pickles/zips.py reads
    it); None when there is not exactly one, or it is larger than `max_bytes`."""
    try:
        size = os.fstat(fh.fileno()).st_size
        with open_checked(fh, size) as archive:
            members = [info for info in archive.infolist() if info.filename.endswith("/data.pkl")
                       and info.filename.count("/") == 1]
            if len(members) != 1 or members[0].file_size > max_bytes:
                return None
            return archive.read(members[0])
    except (OSError, AmbiguousZip, zipfile.BadZipFile, ValueError, EOFError, RuntimeError, NotImplementedError):
        return None


def training_args(fh: BinaryIO) -> dict[str, Any] | None:
    """The plain fields of the TrainingArguments a Trainer pickled into training_args.bin (a zip-format
    torch.save file), from its data.pkl's opcodes; None when the file is not that."""
    data = data_pkl(fh, MAX_ARGS_PICKLE)
    return None if data is None else object_state(data)


def top_level_keys(fh: BinaryIO) -> set[str] | None:
    """The string keys of the dict the open file `fh` (a zip-format torch.save file, such as a resume checkpoint)
    holds, so the static phase can tell that `optimizer` or `rng` was never saved; None when unknown (the
    reload, which loads the file, then decides). Every opcode of the object graph is followed: it is bounded by
    MAX_DATA_PKL, tensors excluded."""
    data = data_pkl(fh, MAX_DATA_PKL)
    if data is None:
        return None
    try:
        built = built_value(data, max_opcodes=None)
    except _Unread:
        return None
    if not isinstance(built, dict) or not all(isinstance(key, str) for key in built):
        return None
    return set(built)


__all__ = ["built_value", "data_pkl", "object_state", "top_level_keys", "training_args"]
