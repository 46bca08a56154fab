"""GGUF headers walked with limits before gguf.GGUFReader runs (issue 35): real files written by the `gguf`
package's own GGUFWriter, then the one field of each hostile form set as an attacker would (the writer keeps its
counts honest). Each hostile file is IV504 naming its key, found in milliseconds with bounded memory, in the static
walk (format/gguf.py) and through a real reload; the clean file still reloads."""
from __future__ import annotations

import os
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from fixtures.extra_loaders import copy_artifact, reload_package, write_gguf, write_package
from itera_verify.format.gguf import HeaderProblem, walk
from tests.conftest import built_once

pytestmark = pytest.mark.filterwarnings("ignore")


def _write(path: Path, add) -> Path:
    """A small GGUF by GGUFWriter: llama's architecture key, what `add(writer)` adds, one F32 tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    add(writer)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _set(path: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(bytes(data))
    return path


def _string_length_at(path: Path, key: bytes) -> int:
    """Where the length of string key `key`'s value sits (after the key, its length and the value type)."""
    data = path.read_bytes()
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 8  # a STRING value
    return at + 4


WRITTEN, GGUF_STRING, GGUF_ARRAY = 4, 8, 9


def _empty_strings(path: Path, counts: dict[str, int]) -> Path:
    """GGUFWriter's file with arrays of `counts[key]` empty strings: written with WRITTEN strings each, then grown
    in place (each more one 8-byte zero length): the bytes GGUFWriter writes itself, without its Python call per
    string (seconds for millions). The growth is a multiple of 32 bytes: the tensor data stays aligned."""
    _write(path, lambda w: [w.add_array(key, [b""] * WRITTEN) for key in counts])
    data = path.read_bytes()
    for key, count in counts.items():
        head = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<II", GGUF_ARRAY, GGUF_STRING)
        at = data.index(head + struct.pack("<Q", WRITTEN)) + len(head)
        grown = (count - WRITTEN) * 8
        assert grown % 32 == 0, count
        data = data[:at] + struct.pack("<Q", count) + bytes(grown) + data[at + 8:]
    path.write_bytes(data)
    return path


# form -> (builder(folder) -> path, the key the finding names)
def _four_million_strings(folder: Path) -> Path:
    # The issue's file: 4,000,000 empty strings are 32 MB; gguf.GGUFReader took the reload child to its limit.
    return _empty_strings(folder / "four-million.gguf", {"tokenizer.ggml.tokens": 4_000_000})


def _huge_kv_count(folder: Path) -> Path:
    return _set(write_gguf(folder / "kv-count.gguf"), 16, "<Q", 1 << 40)


def _absurd_tensor_count(folder: Path) -> Path:
    return _set(write_gguf(folder / "tensor-count.gguf"), 8, "<Q", 1 << 33)


def _string_past_the_end(folder: Path) -> Path:
    path = write_gguf(folder / "long-string.gguf")
    return _set(path, _string_length_at(path, b"general.architecture"), "<Q", 3 * path.stat().st_size)


def _nested_arrays(folder: Path) -> Path:
    return _write(folder / "nested.gguf", lambda w: w.add_array("tokenizer.ggml.merges", [[1, 2], [3, 4, 5]]))


def _over_the_memory_limit(folder: Path) -> Path:
    # Within the caps (three arrays of a million empty strings, 24 MB), but gguf.GGUFReader would hold ~4 GiB of
    # views: twice what a reload of a 24 MB file is given (2 GiB for the libraries + 4 x the file).
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.added_tokens")
    return _empty_strings(folder / "memory.gguf", dict.fromkeys(keys, 1_000_000))


def test_the_grown_arrays_are_the_bytes_gguf_writer_writes(tmp_path):
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
    grown = _empty_strings(tmp_path / "grown.gguf", dict.fromkeys(keys, 1_000))
    written = _write(tmp_path / "written.gguf", lambda w: [w.add_array(key, [b""] * 1_000) for key in keys])
    assert grown.read_bytes() == written.read_bytes()


FORMS = {
    "four_million_string_array": (_four_million_strings, "tokenizer.ggml.tokens"),
    "huge_kv_count": (_huge_kv_count, "GGUF.kv_count"),
    "absurd_tensor_count": (_absurd_tensor_count, "GGUF.tensor_count"),
    "string_longer_than_the_file": (_string_past_the_end, "general.architecture"),
    "array_of_arrays": (_nested_arrays, "tokenizer.ggml.merges"),
}


def _large_forms(folder: Path) -> dict:
    return {"four_million_string_array": str(_four_million_strings(folder)),
            "over_the_memory_limit": str(_over_the_memory_limit(folder))}


@pytest.fixture(scope="session")
def large_forms(tmp_path_factory) -> dict:
    """The two files of millions of strings (32 and 24 MB): written once for every worker.
    Read only: a module copies them."""
    return built_once(tmp_path_factory, "itera-gguf-large-forms", _large_forms, version="2")[1]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, request):
    """name -> the form's file, a private one; the 4,000,000 strings are copied from the session's file when a
    test first asks for them."""
    folder = tmp_path_factory.mktemp("gguf-hostile")
    written = {name: build(folder) for name, (build, _) in FORMS.items() if name != "four_million_string_array"}

    def form(name: str) -> Path:
        if name not in written:
            shared = Path(request.getfixturevalue("large_forms")[name])
            written[name] = copy_artifact(shared, folder / shared.name)
        return written[name]
    return form


# Walking 4,000,000 strings to the cap takes seconds.
STATIC = [pytest.param(name, marks=[pytest.mark.slow] if name == "four_million_string_array" else [])
          for name in FORMS]


def _walk(path: Path):
    with open(path, "rb") as fh:
        return walk(lambda offset, n: os.pread(fh.fileno(), n, offset), path.stat().st_size)


@pytest.mark.parametrize("name", STATIC)
def test_hostile_header_is_refused_naming_its_key_in_milliseconds(name, hostile):
    path = hostile(name)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(HeaderProblem) as refused:
            _walk(path)
        seconds, peak = time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.key == FORMS[name][1] and str(refused.value).startswith(FORMS[name][1]), refused.value
    assert seconds < 1 and peak < 8 << 20, (seconds, peak)


@pytest.mark.parametrize("name", [n for n in FORMS if n != "four_million_string_array"])
def test_each_hostile_file_is_still_a_gguf_the_library_starts_to_read(name, hostile):
    """The forms are real GGUF files: the magic and version gguf's reader checks first, the writer's layout."""
    for path in [hostile(name)]:
        head = path.read_bytes()[:8]
        assert head[:4] == b"GGUF" and struct.unpack("<I", head[4:])[0] == 3


def test_clean_gguf_header_walks_to_the_reader_s_own_data_offset(tmp_path):
    import gguf

    path = write_gguf(tmp_path / "clean.gguf")
    header = _walk(path)
    reader = gguf.GGUFReader(str(path))
    assert header.data_start == reader.data_offset
    assert (header.kv_count, header.tensor_count) == (len(reader.fields) - 3, len(reader.tensors))
    assert header.elements == sum(len(f.data) for f in reader.fields.values() if f.types[:1] == [
        gguf.GGUFValueType.ARRAY])


@pytest.mark.slow
def test_a_real_tokenizer_s_arrays_walk_in_well_under_a_second(tmp_path):
    """300,000 strings (a large tokenizer's merges) beside 300,000 integers: admitted, and walked fast."""
    path = _write(tmp_path / "big-vocab.gguf", lambda w: (
        w.add_array("tokenizer.ggml.merges", [b"a%d b%d" % (i, i) for i in range(300_000)]),
        w.add_array("tokenizer.ggml.token_type", [1] * 300_000)))
    started = time.monotonic()
    header = _walk(path)
    assert time.monotonic() - started < 1 and header.elements == 600_000


@pytest.fixture(scope="module")
def reloaded(hostile, large_forms, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-caps") / "package"
    (root / "artifacts").mkdir(parents=True)
    write_gguf(root / "artifacts/clean.gguf")
    artifacts = [("clean", "gguf", "artifacts/clean.gguf", {"loader": "gguf"})]
    for name in FORMS:
        own = hostile(name)  # copied: the static tests still read it
        path = copy_artifact(own, root / "artifacts" / own.name)
        artifacts.append((name.replace("_", "-"), "gguf", f"artifacts/{path.name}", {"loader": "gguf"}))
    copy_artifact(Path(large_forms["over_the_memory_limit"]), root / "artifacts/memory.gguf")
    artifacts.append(("over-the-memory-limit", "gguf", "artifacts/memory.gguf", {"loader": "gguf"}))
    write_package(root, artifacts)
    return reload_package(root)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*FORMS, "over_the_memory_limit"])
def test_hostile_gguf_reload_is_IV504_naming_the_key_before_the_reader_runs(name, reloaded):
    results, findings = reloaded
    artifact = name.replace("_", "-")
    key = FORMS[name][1] if name in FORMS else "tokenizer.ggml.tokens"
    [finding] = [f for f in findings if f.artifact == artifact]
    assert finding.code == "IV504" and key in finding.message, finding.message
    assert "crashed" not in finding.message and "without a result" not in finding.message
    result = results[artifact]
    assert not result.ok and result.seconds < 30, (result.seconds, result.error)


@pytest.mark.slow
def test_clean_gguf_beside_them_still_reloads(reloaded):
    results, findings = reloaded
    assert results["clean"].ok, results["clean"].error
    assert not [f for f in findings if f.artifact == "clean"]
