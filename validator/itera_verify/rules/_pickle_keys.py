"""The keys of the dict a `torch.save` file holds, read from its pickle's opcodes: nothing is unpickled.

A torch-resume file is a zip whose `<name>/data.pkl` builds one dict. Walking the opcodes with a symbolic stack
(strings as themselves, dicts as key sets, everything else as an opaque placeholder) gives that dict's keys
without importing or calling anything, so the static phase can tell that `optimizer` or `rng` was never saved.
Anything this walk does not understand gives None: the reload, which loads the file, then decides.
"""
from __future__ import annotations

import os
import pickletools
import zipfile
from typing import BinaryIO

from ..package.pickles.zips import AmbiguousZip, open_checked

MAX_DATA_PKL = 64 << 20  # the object graph of a resume file, tensors excluded: megabytes at most
STRING_OPS = {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"}
DICT_CLASSES = {"collections OrderedDict", "builtins dict"}


class _Dict:
    def __init__(self) -> None:
        self.keys: list = []


class _Global(str):
    """An imported name, `module name`: only compared with DICT_CLASSES, never imported."""


def _data_pkl(fh: BinaryIO) -> bytes | None:
    try:
        size = os.fstat(fh.fileno()).st_size
        with open_checked(fh, size) as archive:
            members = [info for info in archive.infolist() if info.filename.endswith("/data.pkl")
                       and info.filename.count("/") == 1]
            if len(members) != 1 or members[0].file_size > MAX_DATA_PKL:
                return None
            return archive.read(members[0])
    except (OSError, AmbiguousZip, zipfile.BadZipFile, ValueError, EOFError, RuntimeError, NotImplementedError):
        return None


def _pop_to_mark(stack: list, marks: list[int]) -> list:
    start = marks.pop()
    items = stack[start:]
    del stack[start:]
    return items


def top_level_keys(fh: BinaryIO) -> set[str] | None:
    """The string keys of the dict the open file `fh` (a zip-format torch.save file) holds; None when unknown."""
    data = _data_pkl(fh)
    if data is None:
        return None
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    try:
        for opcode, arg, _pos in pickletools.genops(data):
            name = opcode.name
            if name == "STOP":
                break
            if name == "MARK":
                marks.append(len(stack))
            elif name in STRING_OPS:
                stack.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(arg))
            elif name == "EMPTY_DICT":
                stack.append(_Dict())
            elif name == "DICT":
                built = _Dict()
                built.keys = _pop_to_mark(stack, marks)[0::2]
                stack.append(built)
            elif name == "SETITEM":
                key = stack[-2]
                del stack[-2:]
                if isinstance(stack[-1], _Dict):
                    stack[-1].keys.append(key)
            elif name == "SETITEMS":
                items = _pop_to_mark(stack, marks)
                if isinstance(stack[-1], _Dict):
                    stack[-1].keys += items[0::2]
            elif name == "GLOBAL":
                stack.append(_Global(arg))
            elif name == "STACK_GLOBAL":
                module, attribute = stack[-2], stack[-1]
                del stack[-2:]
                stack.append(_Global(f"{module} {attribute}"))
            elif name == "REDUCE":
                callable_ = stack[-2]
                del stack[-2:]
                stack.append(_Dict() if callable_ in DICT_CLASSES else None)  # OrderedDict() then SETITEMS
            else:
                _generic(opcode, stack, marks)
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    result = stack[-1] if stack else None
    if not isinstance(result, _Dict) or not all(isinstance(key, str) for key in result.keys):
        return None
    return set(result.keys)


def _generic(opcode, stack: list, marks: list[int]) -> None:
    """Any other opcode by its declared stack effect: what it consumes goes, opaque placeholders come."""
    before = opcode.stack_before
    if pickletools.markobject in before:
        below = before.index(pickletools.markobject)
        _pop_to_mark(stack, marks)
        count = below
    else:
        count = len(before)
    if count:
        if count > len(stack):
            raise IndexError("stack underflow")
        del stack[-count:]
    stack.extend([None] * len(opcode.stack_after))
