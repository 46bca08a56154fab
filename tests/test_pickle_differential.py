"""The scanner's opcode reader against CPython's two unpicklers, on generated protocol-0..5 streams.

Neither unpickler ever builds anything here: find_class records the name and raises (the recording Unpickler
of test_pickle_red_team), so a stream stops at its first import. Two properties:

- exact: a well-typed stream of values (INT/LONG in every form C reads: `0x`, `0o`, `0b`, `_`, signs, spaces,
  `00`, `01`, a NUL, an L suffix; FLOAT, strings, memo, tuples, lists, dicts) followed by a sentinel GLOBAL: the
  walk reaches the sentinel exactly when the C unpickler does, never earlier, never later. (Numbers are read
  as a Python without the 4300-digit limit reads them, as older ones do; FLOAT forms only the two unpicklers
  read alike: where they differ, the walk goes on where either does.)
- never less: on any byte stream, the first global either unpickler asks for is among the scanner's names.

Both again with the walk's MAX_LINE / MAX_ARGUMENT lowered to a few bytes, so that generated streams hold
arguments the walk reads through without keeping (tests/test_redteam3_pickle_lengths.py covers the real
sizes): the walk still reaches every global the unpicklers reach.
"""
from __future__ import annotations

import io
import pickle
import re
import struct
import sys
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from itera_verify.package.pickles import opcodes
from itera_verify.package.pickles.budget import Budget
from itera_verify.package.pickles.opcodes import Reader, read_ops, scan_stream
from tests.fuzz.binary import pickle_streams
from tests.test_pickle_red_team import _Recorder

SENTINEL = "sentinel.reached"
# Derandomized, as the fuzz test is: CI replays the same 400 draws (make fuzz explores further).
RUNS = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


class _PyRecorder(pickle._Unpickler):
    """pickle.py's unpickler (joblib's), recording like _Recorder."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data), encoding="latin1")
        self.requested: list[str] = []

    find_class = _Recorder.find_class
    persistent_load = _Recorder.persistent_load


def first_requests(data: bytes, unpicklers=(_Recorder, _PyRecorder)) -> list[str]:
    """The first global each unpickler asks for ([] where it stops before any)."""
    out, limit = [], sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        for cls in unpicklers:
            recorder = cls(data)
            try:
                recorder.load()
            except Exception:  # noqa: BLE001 - the recorder raises at the first import; anything else stops it
                pass
            out += recorder.requested[:1]
    finally:
        sys.set_int_max_str_digits(limit)
    return out


def walked_names(data: bytes) -> set[str]:
    found: set[str] = set()
    try:
        scan_stream(Reader(io.BytesIO(data), len(data), Budget(1 << 40)), found)
    except ValueError:
        pass
    return found


def _line(alphabet: str, max_size: int = 8):
    return st.text(alphabet, max_size=max_size).map(lambda s: s.encode("latin-1"))


# INT / LONG forms: structured (prefix, digits, separators) and free text over the characters that matter.
_int_structured = st.builds(
    lambda pre, sign, base, digits, post, nul: pre + sign + base + digits + nul + post,
    st.sampled_from([b"", b" ", b"\t"]), st.sampled_from([b"", b"+", b"-"]),
    st.sampled_from([b"", b"0", b"0x", b"0X", b"0o", b"0b", b"00"]), _line("0123456789abcdefABCDEF_", 6),
    st.sampled_from([b"", b" ", b"\t "]), st.sampled_from([b"", b"\x00", b"\x00junk"]))
_int_text = st.one_of(_int_structured, _line(" +-_0123456789abxoXBOL\x00", 8),
                      st.sampled_from([b"00", b"01", b"0", b"1", b"-0", b"+1", b" 1", b"0_0", b"0x_1", b"010",
                                       b"08", b"9" * 30, b"1" * 5000]))
_float_alike = st.sampled_from([b"1.5", b"inf", b"-Infinity", b"nan", b"1.", b".5", b"1e", b"0x1p3", b"-0", b"",
                                b"1e5", b"e5", b"."])  # C and pickle.py read these alike
_float_any = st.one_of(_float_alike, _line("0123456789.eE+-_ \x00", 8),
                       st.sampled_from([b"1e999", b"1_0", b" 1", b"1 ", b"1.5\x00x"]))


@st.composite
def scalar(draw, floats=_float_alike) -> bytes:
    kind = draw(st.sampled_from(["int", "long", "float", "binint", "long1", "string", "unicode", "binunicode",
                                 "none", "bool"]))
    if kind == "int":
        return b"I" + draw(_int_text) + b"\n"
    if kind == "long":
        return b"L" + draw(_int_text) + draw(st.sampled_from([b"", b"L"])) + b"\n"
    if kind == "float":
        return b"F" + draw(floats) + b"\n"
    if kind == "binint":
        return draw(st.sampled_from([b"K\x07", b"M\x01\x02", b"J\xff\xff\xff\xff", b"G" + struct.pack(">d", 1.5)]))
    if kind == "long1":
        raw = draw(st.binary(max_size=9))
        return draw(st.sampled_from([b"\x8a" + bytes([len(raw)]), b"\x8b" + struct.pack("<i", len(raw))])) + raw
    if kind == "string":
        return b"S" + draw(st.sampled_from([b"'x'", b'"y"', b"'a\\x41'", b"'\\n'", b"'", b"''", b"'q\"",
                                            b"'\\x4'"])) + b"\n"
    if kind == "unicode":
        return b"V" + draw(st.sampled_from([b"abc", b"\\u0041", b"", b"\\u00"])) + b"\n"
    if kind == "binunicode":
        raw = draw(st.text(max_size=4)).encode()
        return b"\x8c" + bytes([len(raw)]) + raw
    return draw(st.sampled_from([b"N", b"\x88", b"\x89"]))


@st.composite
def value(draw, depth: int = 2, floats=_float_alike) -> bytes:
    """A well-typed value: scalars, tuples, lists, dicts with scalar keys, memoised and fetched back."""
    kind = draw(st.sampled_from(["scalar", "scalar", "tuple", "list", "dict", "memo"] if depth else ["scalar"]))
    if kind == "scalar":
        return draw(scalar(floats))
    items = draw(st.lists(value(depth - 1, floats), max_size=3))
    if kind == "tuple":
        return {0: b")", 1: items[0] + b"\x85" if items else b")"}[min(len(items), 1)] if len(items) < 2 \
            else b"(" + b"".join(items) + b"t"
    if kind == "list":
        return b"]" + (b"(" + b"".join(items) + b"e" if items else b"")
    if kind == "dict":
        pairs = [draw(scalar(floats)) + item for item in items]
        return b"}" + (b"(" + b"".join(pairs) + b"u" if pairs else b"")
    slot = draw(st.integers(0, 5))
    put = draw(st.sampled_from([b"p" + str(slot).encode() + b"\n", b"q" + bytes([slot]), b"\x94"]))
    return draw(scalar(floats)) + put + draw(st.sampled_from([b"", b"0g" + str(slot).encode() + b"\n"]))


@st.composite
def typed_streams(draw, floats=_float_alike) -> bytes:
    header = draw(st.sampled_from([b"", b"\x80\x02", b"\x80\x04", b"\x80\x05", b"\x80\x06"]))
    body = b"".join(draw(st.lists(value(floats=floats), min_size=1, max_size=5)))
    return header + body + b"c" + SENTINEL.replace(".", "\n").encode() + b"\n"


@pytest.mark.slow
@RUNS
@given(typed_streams())
def test_the_walk_stops_exactly_where_the_unpicklers_stop(data):
    assume(b"\x94" not in data or b"g" not in data)  # MEMOIZE's index depends on the memo: GET may miss both
    reached_by_cpython = SENTINEL in first_requests(data, (_Recorder,))
    assert (SENTINEL in walked_names(data)) == reached_by_cpython, data


def _memo_indices_small(data: bytes) -> bool:
    """The C unpickler sizes its memo by the largest PUT index: a random 4-byte one would allocate gigabytes."""
    stream = Reader(io.BytesIO(data), len(data), Budget(1 << 40))
    try:
        for op, arg, _ in read_ops(stream):
            if op.name in ("PUT", "LONG_BINPUT") and not 0 <= arg < 1 << 16:
                return False
    except ValueError:
        pass
    return True


@pytest.mark.slow
@RUNS
@given(st.one_of(pickle_streams(), typed_streams(_float_any), st.binary(max_size=64),
                 st.tuples(st.binary(max_size=12), typed_streams(_float_any)).map(b"".join)))
@pytest.mark.slow
def test_every_global_an_unpickler_asks_for_is_named(data):
    assume(_memo_indices_small(data))
    names = walked_names(data)
    for name in first_requests(data):
        if name.startswith("."):
            continue  # an empty module name (pickle.py at the data's end): __import__('') always fails
        assert name in names or "<name computed at load time>" in names or opcodes.FRAME_CROSSED in names, \
            (name, names, data)


@contextmanager
def _short_limits(line: int, argument: int):
    """The walk's kept-argument limits lowered for the block (hypothesis forbids function-scoped fixtures)."""
    saved = opcodes.MAX_LINE, opcodes.MAX_ARGUMENT
    opcodes.MAX_LINE, opcodes.MAX_ARGUMENT = line, argument
    try:
        yield
    finally:
        opcodes.MAX_LINE, opcodes.MAX_ARGUMENT = saved


@pytest.mark.slow
@RUNS
@given(typed_streams(), st.integers(2, 8), st.integers(0, 6))
def test_arguments_read_through_never_stop_the_walk_early(data, line, argument):
    """Where C reaches the sentinel, so does the walk, however many of the arguments it only read through. (Not
    the converse: an invalid INT the walk does not keep is taken as read, so it may go on where C stops.)"""
    assume(b"\x94" not in data or b"g" not in data)
    assume(_memo_indices_small(data))
    reached_by_cpython = SENTINEL in first_requests(data, (_Recorder,))
    with _short_limits(line, argument):
        assert not reached_by_cpython or _named(SENTINEL, walked_names(data), line), data


@RUNS
@given(st.one_of(pickle_streams(), typed_streams(_float_any), st.binary(max_size=64),
                 st.tuples(st.binary(max_size=12), typed_streams(_float_any)).map(b"".join)),
       st.integers(2, 8), st.integers(0, 6))
def test_every_global_is_named_past_arguments_read_through(data, line, argument):
    assume(_memo_indices_small(data))
    requests = first_requests(data)
    with _short_limits(line, argument):
        names = walked_names(data)
    for name in requests:
        if name.startswith("."):
            continue  # an empty module name (pickle.py at the data's end): __import__('') always fails
        assert _named(name, names, line) or "<name computed at load time>" in names \
            or opcodes.FRAME_CROSSED in names, (name, names, data)


def _named(name: str, names: set[str], line: int) -> bool:
    """`name` is among the walk's names, itself or as a GLOBAL line read through: "<head>...<N bytes>" stands for
    a line of N bytes (its newline included) that begins with its first `line` bytes (the lowered MAX_LINE)."""
    for walked in names:
        pieces = re.split(r"\.\.\.<(\d+) bytes>", walked)
        pattern, index = "", 0
        while index < len(pieces):
            head = pieces[index]
            pattern += re.escape(head)
            if index + 1 < len(pieces):
                pattern += f".{{{int(pieces[index + 1]) - 1 - min(line, opcodes.LONG_HEAD)}}}"
            index += 2
        if re.fullmatch(pattern, name, re.S):
            return True
    return False


def test_a_long_line_in_the_red_team_form_is_walked_through():
    """V + a line past MAX_LINE + POP + STACK_GLOBAL builtins.open: C asks for builtins.open, and so the walk."""
    data = b"V" + b"A" * 40 + b"\n0\x8c\x08builtins\x8c\x04open\x93(Vx\nVw\ntR."
    assert first_requests(data) == ["builtins.open", "builtins.open"]
    with _short_limits(16, 16):
        assert "builtins.open" in walked_names(data)


def test_a_global_across_the_end_of_a_frame_is_refused_however_it_is_read():
    """Found by CI's draw of the property above: a FRAME of 8 bytes ending inside `cos\nsystem\n`. pickle.loads
    reads frames as if they were not there (os.system), pickle.py refuses the stream, and the C unpickler reading a
    file (as torch.load and np.load do) drops the frame's rest and reads the name from after it (os.em). The walk
    cannot be all three: such a stream, which no pickler writes, is refused."""
    data = b"\x95\x08\x00\x00\x00\x00\x00\x00\x00cos\nsystem\n."
    assert first_requests(data, (_Recorder,)) == ["os.em"]  # _Recorder reads a file, as torch.load does
    names = walked_names(data)
    assert opcodes.FRAME_CROSSED in names
    # An allowlisted name before the frame's end and another after it: refused all the same.
    torch_name = b"\x95\x10\x00\x00\x00\x00\x00\x00\x00ctorch._utils\n_rebuild_tensor_v2\n."
    assert opcodes.FRAME_CROSSED in walked_names(torch_name)
    # A real framed pickle never reads across a frame's end.
    real = pickle.dumps({"a": list(range(2000)), "b": "x" * 70_000}, protocol=4)
    assert b"\x95" in real and opcodes.FRAME_CROSSED not in walked_names(real)
