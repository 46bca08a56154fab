"""The format layer's readers (validator/itera_verify/format/): one reading per fact, shared by every stage."""
from __future__ import annotations

import pytest
import json

import numpy as np
from itera_verify.format import safetensors as header_format
from itera_verify.package.files import read_safetensors_header
from itera_verify.reload.placement import safetensors_bytes, weight_bytes
from itera_verify.rules._tensors import read_header
from safetensors.numpy import save_file


def test_a_header_nested_200000_deep_is_refused_by_every_reader_without_a_traceback(tmp_path):
    # Once a RecursionError traceback (no report) in the GPU placement's own header reader.
    body = b"[" * 200_000 + b"]" * 200_000
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(body).to_bytes(8, "little") + body)
    assert read_safetensors_header(path) is None
    assert read_header(str(path)) is None
    assert safetensors_bytes(path) is None
    assert weight_bytes(path) == path.stat().st_size


def test_every_reader_reads_a_real_file_as_the_library_wrote_it(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": np.zeros((2, 3), np.float32), "b": np.ones(5, np.float16)}, str(path), metadata={"k": "v"})
    header = read_safetensors_header(path)
    assert {n: (e.dtype, e.shape, e.nbytes) for n, e in header.entries.items()} == {
        "a": ("F32", (2, 3), 24), "b": ("F16", (5,), 10)}
    assert header.metadata == {"k": "v"}
    assert {n: (t.shape, t.size) for n, t in read_header(str(path)).items()} == {"a": ((2, 3), 24), "b": ((5,), 10)}
    assert safetensors_bytes(path) == 34
    # The absolute byte ranges really hold the tensors' bytes.
    raw = path.read_bytes()
    assert raw[header.entries["b"].begin:header.entries["b"].end] == np.ones(5, np.float16).tobytes()


def test_what_safetensors_refuses_is_refused_here():
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    def parse(header, data=8):
        raw = json.dumps(header).encode()
        return header_format.parse(len(raw).to_bytes(8, "little"), raw, 8 + len(raw) + data)
    assert parse({"w": entry}) is not None
    assert parse({"w": entry}, data=4) is None  # offsets past the data
    assert parse({"w": {**entry, "shape": [2.0]}}) is None
    assert parse({"w": {**entry, "shape": [True]}}) is None
    assert parse({"w": {**entry, "data_offsets": [8, 0]}}) is None
    assert parse({"__metadata__": {"k": 1}, "w": entry}) is None
    assert parse(["w"]) is None


def test_the_loader_table_is_the_one_every_reader_uses():
    import importlib.util
    from pathlib import Path

    from itera_verify.format import loaders as table
    from itera_verify.record import artifacts as recorder
    from itera_verify.reload import loaders as registry
    from itera_verify.reload.runner import light
    from itera_verify.rules.artifacts import RULES

    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas/reload.schema.json").read_text())
    entry = schema["properties"]["artifacts"]["additionalProperties"]["properties"]
    assert tuple(entry["loader"]["enum"]) == table.NAMES  # the schema's enum is the table's, in its order
    assert registry.LOADERS == table.NAMES
    for name, module in registry.MODULES.items():  # each row's module exists (imported in the child only)
        assert importlib.util.find_spec(f"itera_verify.reload.loaders.{module}") is not None, name
    [iv510] = [rule for rule in RULES if rule.code == "IV510"]
    assert all(f"`{name}`" in iv510.explain for name in table.NAMES)
    assert recorder.KINDS == table.KINDS
    assert [table.recorder_default(kind) for kind in table.KINDS[:4]] == ["safetensors", "transformers", "peft", None]
    assert light(["safetensors", "torch-resume"]) and not light(["safetensors", "peft"]) and light([])
    assert table.file_loader_for(".ckpt") == "lightning-checkpoint" and table.file_loader_for(".bin") is None


def test_an_id_with_a_trailing_newline_is_refused_by_the_recorder(tmp_path):
    # `^...$` with re.match admits "id\n" ($ matches before a final newline); the format's ID is read whole.
    import pytest
    from itera_verify.record import RecordError, open_campaign

    with pytest.raises(RecordError, match="campaign_id"):
        open_campaign(tmp_path / "pkg", "campaign\n", "Q?", "toy", "v1", ["q-0"])


@pytest.mark.slow
def test_a_config_json_nested_past_the_limit_is_one_clear_reload_failure(package_dir, hf_cache):
    # Every JSON file of a package the tool reads goes through one bounded reader (package/jsonread.py): a
    # config.json nested 100,000 deep was a RecursionError crash of the reload child.
    from tests.test_reload import CONTROL_MODEL, reload

    config = package_dir / CONTROL_MODEL / "config.json"
    config.write_text('{"model_type": "gpt2", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    results, findings = reload(package_dir, hf_cache, "control-model")
    [result] = results.values() if isinstance(results, dict) else results
    assert not result.ok and result.failure == "load", (result.failure, result.error)
    assert "nested 100,001 levels deep" in result.error


def test_one_duration_speller_for_the_recorder_and_the_report():
    from itera_verify.format.values import spoken_duration

    assert [spoken_duration(s) for s in (8, 2528, 11520, 183600)] == ["8 s", "42 min", "3 h 12 min", "2 d 3 h"]
    assert spoken_duration(2528, seconds_with_minutes=True) == "42 min 8 s"
    assert spoken_duration(-90) == "-1 min"
