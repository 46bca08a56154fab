"""Hypothesis strategies for the text readers: JSON documents, near-valid mutations of the real fixture
documents, metrics (JSONL/CSV), predictions, eval ids and TOML configuration tables.

Every strategy yields the *bytes* a user (or an attacker) could put in the file, because readers meet bytes:
BOMs, CRLF, truncation and invalid UTF-8 matter as much as the JSON values. Binary formats (safetensors,
pickle, tar+zstd) live in `binary.py`.
"""
from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import math
import re

from hypothesis import strategies as st

BOM = b"\xef\xbb\xbf"

# Strings that mean something to some layer: paths the path rules judge, ids the identity rules match,
# markup the renderers must escape (rich, HTML, XML, GitHub workflow commands), terminal escapes,
# lone surrogates (legal in JSON escapes, illegal in UTF-8 output), and sizes that stress a formatter.
INTERESTING_STRINGS = [
    "", " ", "\t", "\n", "\x00", "\x0b", "\x1b[31mred\x1b[0m", "\ud800", "a\udfffb", "\u202eevil", "\ufeff",
    "/tmp/run3", "/var/tmp/x", "/dev/shm/y", "C:\\Users\\x\\AppData\\Local\\Temp\\z", "$TMPDIR/x",
    "../../etc/passwd", "..", ".", "/", "/etc/shadow", "//server/share", "C:", "a/../../b", "artifacts/../..",
    "control", "lora-r16", "lora-r64", "control-model", "ex-0001", "nonfinite-loss", "f1-floor",
    "0" * 40, "f" * 64, "main", "2026-11-20T08:00:00Z", "2026-13-40T99:99:99Z", "2026-11-20T08:00:00+25:00",
    "9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "1e999", "NaN", "-Infinity",
    "[bold]x[/bold]", "[/]", "[link=file:///etc/passwd]x[/link]", "<script>alert(1)</script>", "]]>",
    "&amp;", "::error file=x::pwned", "%0A::error::x", "{0}", "%s%n", "'; DROP TABLE x; --",
    "a" * 5000, "é" * 2000, "😀" * 500,
]

INTERESTING_NUMBERS = [0, -0.0, 1, -1, 0.5, 1e-320, 1e308, -1e308, math.inf, -math.inf, math.nan,
                       2**31, 2**63, -(2**63) - 1, 2**64, 10**30, 10**400, 47.14, 24.32, 0.1 + 0.2]

text = st.one_of(st.sampled_from(INTERESTING_STRINGS), st.text(max_size=40))
numbers = st.one_of(st.sampled_from(INTERESTING_NUMBERS), st.integers(), st.floats())
scalars = st.one_of(st.none(), st.booleans(), numbers, text)


@functools.lru_cache(maxsize=None)
def json_values(max_leaves: int = 20):
    """Arbitrary JSON values, NaN and Infinity included (Python writes them as bare tokens). One strategy per size,
    built once: a composite that builds it again at every draw spends a third of its example on that."""
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(text, inner, max_size=5)), max_leaves=max_leaves)


# ---------------------------------------------------------------------------------------------- serialising

# Placeholders replaced after json.dumps, which would recurse on deep nesting and refuses > 4300-digit ints.
DEEP = "__itera_fuzz_deep_{}__"
DIGITS = "__itera_fuzz_digits_{}__"
_PLACEHOLDER = re.compile(r'"__itera_fuzz_(deep|digits)_(\d+)__"')


def _expand(match: re.Match) -> str:
    size = int(match.group(2))
    return "[" * size + "]" * size if match.group(1) == "deep" else "9" * size


def dump_json(value) -> str:
    return _PLACEHOLDER.sub(_expand, json.dumps(value, allow_nan=True))


@st.composite
def byte_noise(draw, data: bytes) -> bytes:
    """Maybe damage serialised bytes the way transfers and editors do: BOM, CRLF, truncation, garbage."""
    ops = draw(st.lists(st.sampled_from(["bom", "crlf", "truncate", "insert", "flip", "trailing", "none"]),
                        max_size=2))
    for op in ops:
        if op == "bom":
            data = BOM + data
        elif op == "crlf":
            data = data.replace(b"\n", b"\r\n")
        elif op == "truncate" and data:
            data = data[: draw(st.integers(0, len(data) - 1))]
        elif op == "insert":
            at = draw(st.integers(0, len(data)))
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif op == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
        elif op == "trailing":
            data = data + draw(st.sampled_from([b"\x00", b"}", b"\n{}", b" garbage", b"\xff\xfe"]))
    return data


# ---------------------------------------------------------------------------------------------- JSON documents

def _locations(value, path=()):
    """Every (container path, key or index) inside a JSON value, the root as (None, None)."""
    yield path, None
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _locations(child, path + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _locations(child, path + (index,))


def _get(value, path):
    for part in path:
        value = value[part]
    return value


def _wrong_type(value):
    """A value of another JSON type that still looks plausible."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        return list(value.values())
    return 0


@st.composite
def mutated_json(draw, base):
    """A near-valid document: the real one with one to four targeted mutations."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        locations = [loc for loc, _ in _locations(doc)]
        path = draw(st.sampled_from(locations))
        op = draw(st.sampled_from(["drop", "replace", "wrong_type", "huge", "nonfinite", "deep", "string",
                                   "duplicate", "swap", "negate"]))
        if not path:
            if op in ("replace", "wrong_type"):
                doc = draw(json_values()) if op == "replace" else _wrong_type(doc)
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        current = parent[key]
        if op == "drop":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(json_values())
        elif op == "wrong_type":
            parent[key] = _wrong_type(current)
        elif op == "huge":
            parent[key] = draw(st.sampled_from([10**400, 1e308, -(10**30), 2**64, 9.99e307, DIGITS.format(5000)]))
        elif op == "nonfinite":
            parent[key] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        elif op == "deep":
            parent[key] = DEEP.format(draw(st.sampled_from([2, 50, 500, 990, 5000, 100_000])))
        elif op == "string":
            parent[key] = draw(text)
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(current))
        elif op == "swap":
            other = draw(st.sampled_from(locations))
            if other and not _is_prefix(path, other) and not _is_prefix(other, path):
                parent[key] = copy.deepcopy(_get(doc, other))
        elif op == "negate" and isinstance(current, (int, float)) and not isinstance(current, bool):
            parent[key] = -current
    return doc


def _is_prefix(a, b) -> bool:
    return len(a) <= len(b) and tuple(b[: len(a)]) == tuple(a)


def json_document(base):
    """Bytes of a JSON document: mostly mutations of `base`, sometimes any JSON, sometimes damaged bytes."""
    value = st.one_of(mutated_json(base), mutated_json(base), mutated_json(base), json_values(40))
    return value.map(lambda v: dump_json(v).encode("utf-8", "surrogatepass")).flatmap(byte_noise)


# ---------------------------------------------------------------------------------------------- line files

LINE_ENDINGS = st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"\r", b""])
GARBAGE_LINES = st.one_of(st.binary(max_size=30), st.sampled_from([
    b"{", b"}", b"[]", b"null", b"\x00\x00", b"\xff\xfe{}", b"\xc3\x28", b"NaN", b'"\\ud800"', b"\t  \t",
    b"[" * 5000, b"{\"a\":" * 3000, b"1" * 5000, b"1e99999", b"-", b"\x1b[2J"]))


def join_lines(lines: list[bytes], endings: list[bytes], bom: bool) -> bytes:
    body = b"".join(line + (endings[i % len(endings)] if endings else b"\n") for i, line in enumerate(lines))
    return (BOM if bom else b"") + body


@st.composite
def line_file(draw, line_strategy, max_lines: int = 30) -> bytes:
    lines = draw(st.lists(st.one_of(line_strategy, line_strategy, line_strategy, GARBAGE_LINES),
                          max_size=max_lines))
    endings = draw(st.lists(LINE_ENDINGS, min_size=1, max_size=3))
    return join_lines(lines, endings, draw(st.booleans()))


METRIC_NAMES = st.one_of(st.sampled_from(["train_loss", "eval_macro_f1", "", " ", "train_loss "]), text)
NONFINITE_TOKENS = ["NaN", "Infinity", "-Infinity", "nan", "inf", "-inf", "1e999", "-1e999", "+1", "0x10",
                    "1_000", "  7 ", "", "null", "true"]


@st.composite
def metrics_jsonl_line(draw) -> bytes:
    record = {"step": draw(st.one_of(st.integers(-5, 10**6), numbers, st.booleans(), text)),
              "name": draw(st.one_of(METRIC_NAMES, json_values(3))),
              "value": draw(st.one_of(numbers, json_values(3)))}
    for key in draw(st.lists(st.sampled_from(["step", "name", "value"]), max_size=1)):
        del record[key]
    if draw(st.integers(0, 9)) == 0:
        record[draw(st.sampled_from(["step", "value"]))] = DIGITS.format(draw(st.sampled_from([400, 4301, 20000])))
    line = dump_json(record)
    if draw(st.booleans()):  # the bare tokens the spec makes legal, and the ones it does not
        line = line.replace(json.dumps(record.get("value")), draw(st.sampled_from(NONFINITE_TOKENS)), 1) \
            if "value" in record else line
    return line.encode("utf-8", "surrogatepass")


def _csv_cell(value: str) -> str:
    return '"' + value.replace('"', '""') + '"' if any(c in value for c in ',"\n\r') else value


CSV_HEADERS = st.sampled_from([b"step,name,value", b"STEP,Name,VALUE", b"name,value,step", b"step,name",
                               b"step,name,value,extra", b"step;name;value", b"", b'"step","name","value"',
                               b"step,step,value", b"\xef\xbb\xbfstep,name,value"])


@st.composite
def metrics_csv_row(draw) -> bytes:
    cells = [draw(st.one_of(st.integers(-5, 10**6).map(str), text)),
             draw(st.one_of(METRIC_NAMES, text)),
             draw(st.one_of(st.sampled_from(NONFINITE_TOKENS), numbers.map(repr), text))]
    cells = cells[: draw(st.integers(0, 3))] + draw(st.lists(text, max_size=1))
    quoted = draw(st.booleans())
    return ",".join(_csv_cell(c) if quoted else c for c in cells).encode("utf-8", "surrogatepass")


@st.composite
def metrics_csv(draw) -> bytes:
    rows = draw(st.lists(st.one_of(metrics_csv_row(), metrics_csv_row(), GARBAGE_LINES,
                                   st.just(b'"' + b"x" * 140_000 + b'"')), max_size=25))
    endings = draw(st.lists(LINE_ENDINGS, min_size=1, max_size=3))
    return join_lines([draw(CSV_HEADERS)] + rows, endings, draw(st.booleans()))


@st.composite
def predictions_line(draw, eval_ids: list[str]) -> bytes:
    record = {"id": draw(st.one_of(st.sampled_from(eval_ids), st.sampled_from(eval_ids), json_values(2))),
              "prediction": draw(json_values(5))}
    if draw(st.booleans()):
        record.update(draw(st.dictionaries(text, json_values(3), max_size=3)))
    for key in draw(st.lists(st.sampled_from(["id", "prediction"]), max_size=1)):
        record.pop(key, None)
    return dump_json(record).encode("utf-8", "surrogatepass")


def predictions_file(eval_ids: list[str]):
    """Mostly near-complete coverage (a sample of the real ids, duplicates, strays), sometimes garbage."""
    near = st.lists(st.sampled_from(eval_ids), max_size=len(eval_ids) + 5).map(
        lambda ids: [json.dumps({"id": i, "prediction": "positive"}).encode() for i in ids])
    mixed = st.lists(predictions_line(eval_ids), max_size=30)
    return st.tuples(st.one_of(near, mixed), st.lists(LINE_ENDINGS, min_size=1, max_size=2), st.booleans()) \
        .map(lambda t: join_lines(*t))


@st.composite
def eval_ids_file(draw, eval_ids: list[str]) -> bytes:
    line = st.one_of(st.sampled_from(eval_ids), text, st.sampled_from(["ex-0001 ", " ex-0001", "ex-0001\x00"]))
    lines = [s.encode("utf-8", "surrogatepass") for s in draw(st.lists(line, max_size=60))]
    lines += draw(st.lists(GARBAGE_LINES, max_size=3))
    order = draw(st.permutations(range(len(lines))))
    endings = draw(st.lists(LINE_ENDINGS, min_size=1, max_size=2))
    return join_lines([lines[i] for i in order], endings, draw(st.booleans()))


# ---------------------------------------------------------------------------------------------- TOML tables

CONFIG_KEYS = ["select", "ignore", "levels", "tmp-patterns", "tariffs", "device", "timeout"]
CODES = ["IV1", "IV101", "IV303", "IV5", "IV506", "IV999", "iv101", "", "IV", "I", "X1", "IV1,IV2"]
LEVELS = ["error", "warning", "info", "off", "ERROR", "fatal", "", "none"]

toml_scalars = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), text.filter(lambda s: "\ud800" not in s
                                                                                and "\udfff" not in s),
    st.sampled_from(CODES + LEVELS + ["auto", "cuda", "cpu", "gpu"]),
    st.datetimes(timezones=st.just(dt.timezone.utc)), st.dates(), st.times())
toml_values = st.recursive(toml_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=10)


def config_tables():
    """Configuration tables: near-valid (real keys, plausible values) and arbitrary."""
    near = st.fixed_dictionaries({}, optional={
        "select": st.one_of(st.lists(st.sampled_from(CODES)), st.sampled_from(CODES), toml_values),
        "ignore": st.one_of(st.lists(st.sampled_from(CODES)), toml_values),
        "levels": st.one_of(st.dictionaries(st.sampled_from(CODES), st.sampled_from(LEVELS)), toml_values),
        "tmp-patterns": st.one_of(st.lists(st.sampled_from(INTERESTING_STRINGS[:30])), toml_values),
        "tariffs": st.one_of(st.dictionaries(text, toml_values, max_size=3), toml_values),
        "device": st.one_of(st.sampled_from(["auto", "cuda", "cpu", "gpu", ""]), toml_values),
        "timeout": st.one_of(st.sampled_from([1, 0, -1, 0.001, math.nan, math.inf, -math.inf, 1e308, True]),
                             toml_values),
    })
    wild = st.dictionaries(st.one_of(st.sampled_from(CONFIG_KEYS), st.text(max_size=8)), toml_values, max_size=5)
    return st.one_of(near, near, wild, toml_values)


def toml_value(value) -> str:
    """A TOML 1.0 inline rendering (tomllib reads; nothing in the standard library writes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


@st.composite
def config_files(draw) -> tuple[str, bytes]:
    """(file name, bytes): an itera-verify.toml or a pyproject.toml, sometimes with a misplaced `tool`."""
    table = draw(config_tables())
    body = "\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()) \
        if isinstance(table, dict) else f"x = {toml_value(table)}"
    layout = draw(st.sampled_from(["own", "own-tool", "pyproject", "tool-scalar", "tool-table-scalar"]))
    if layout == "own":
        name, text_ = "itera-verify.toml", body
    elif layout == "own-tool":
        name, text_ = "itera-verify.toml", "[tool.itera-verify]\n" + body
    elif layout == "pyproject":
        name, text_ = "pyproject.toml", '[project]\nname = "x"\n[tool.itera-verify]\n' + body
    elif layout == "tool-scalar":  # `tool` is not a table at all
        name, text_ = draw(st.sampled_from(["itera-verify.toml", "pyproject.toml"])), \
            f"tool = {toml_value(draw(toml_scalars))}\n"
    else:  # `tool.itera-verify` is a scalar
        name, text_ = draw(st.sampled_from(["itera-verify.toml", "pyproject.toml"])), \
            f"[tool]\n\"itera-verify\" = {toml_value(draw(toml_scalars))}\n"
    return name, draw(byte_noise(text_.encode("utf-8", "surrogatepass")))
