"""The `gguf` and `onnx` loaders (docs/format.md, loaders): real files written by each library's own save call, reloaded in one
run (one child per artifact, as `verify` does); each planted defect is its own artifact of the same package."""
from __future__ import annotations

import pytest

from fixtures.artifacts import truncate
from fixtures.extra_loaders import copy_artifact, reload_package, write_gguf, write_onnx, write_package

pytestmark = pytest.mark.filterwarnings("ignore")


def messages(findings, artifact) -> list[str]:
    return [f"{f.code} {f.message}" for f in findings if f.artifact == artifact]


@pytest.fixture(scope="module")
def reloaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("loaders-files") / "package"
    art = root / "artifacts"
    art.mkdir(parents=True)
    write_gguf(art / "clean.gguf")
    truncated = copy_artifact(art / "clean.gguf", art / "truncated.gguf")
    truncate(truncated, 900)
    write_gguf(art / "no-vocabulary.gguf", tokenizer=False)
    write_gguf(art / "overflow.gguf", overflow=True)
    write_gguf(art / "other-source.gguf", block_count=7)
    write_gguf(art / "wrong-shape.gguf", feed_forward=96)
    (art / "source").mkdir()
    (art / "source/config.json").write_text('{"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 32, '
                                            '"vocab_size": 64}')
    write_onnx(art / "onnx-clean")
    write_onnx(art / "onnx-nan", nan=True)
    copy_artifact(art / "onnx-clean", art / "onnx-no-data")
    (art / "onnx-no-data/model.onnx.data").unlink()
    copy_artifact(art / "onnx-clean", art / "onnx-short-data")
    truncate(art / "onnx-short-data/model.onnx.data", 100)
    gguf_entry, onnx_entry = {"loader": "gguf"}, {"loader": "onnx"}
    write_package(root, [
        ("gguf-clean", "gguf", "artifacts/clean.gguf", {"loader": "gguf", "config": "artifacts/source"}),
        ("gguf-truncated", "gguf", "artifacts/truncated.gguf", gguf_entry),
        ("gguf-no-vocabulary", "gguf", "artifacts/no-vocabulary.gguf", gguf_entry),
        ("gguf-overflow", "gguf", "artifacts/overflow.gguf", gguf_entry),
        ("gguf-other-source", "gguf", "artifacts/other-source.gguf", {"loader": "gguf", "config": "artifacts/source"}),
        ("gguf-wrong-shape", "gguf", "artifacts/wrong-shape.gguf", gguf_entry),
        ("onnx-clean", "onnx", "artifacts/onnx-clean", onnx_entry),
        ("onnx-file", "onnx", "artifacts/onnx-clean/model.onnx", onnx_entry),
        ("onnx-nan", "onnx", "artifacts/onnx-nan", onnx_entry),
        ("onnx-no-data", "onnx", "artifacts/onnx-no-data", onnx_entry),
        ("onnx-short-data", "onnx", "artifacts/onnx-short-data", onnx_entry),
    ])
    return reload_package(root)


@pytest.mark.slow
def test_clean_gguf_is_read_dequantized_and_passes(reloaded):
    results, findings = reloaded
    result = results["gguf-clean"]
    assert result.ok, result.error
    assert not messages(findings, "gguf-clean")
    assert result.facts["tensors"] == 12 and result.facts["tensor_types"] == {"F16": 2, "Q8_0": 7, "F32": 3}
    assert result.facts["tokenizer"] == "llama, 64 tokens" and result.facts["architecture"] == "llama"


def test_llama_gguf_loads_in_transformers_and_runs_a_forward_pass(reloaded):
    results, _ = reloaded
    result = results["gguf-clean"]
    assert result.facts["class"] == "LlamaForCausalLM"
    assert result.forward == "finite output (1, 8, 64) float32 (transformers, gguf_file=)"


def test_gguf_whose_tensor_transformers_cannot_place_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "gguf-wrong-shape")
    assert message.startswith("IV504") and "transformers does not load it (gguf_file=)" in message


def test_truncated_gguf_is_IV504_naming_the_truncation(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "gguf-truncated")
    assert message.startswith("IV504") and "truncated" in message and "truncated.gguf" in message


def test_gguf_without_a_vocabulary_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "gguf-no-vocabulary")
    assert message.startswith("IV504") and "no tokenizer" in message


def test_gguf_whose_f16_conversion_overflowed_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "gguf-overflow")
    assert "token_embd.weight (F16) holds 1 non-finite value" in message


def test_gguf_converted_from_another_model_than_its_source_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "gguf-other-source")
    assert "llama.block_count is 7" in message and "says 1" in message


def test_clean_onnx_export_runs_in_onnxruntime(reloaded):
    results, findings = reloaded
    for artifact in ("onnx-clean", "onnx-file"):
        assert results[artifact].ok, results[artifact].error
        assert results[artifact].forward == "finite output logits (1, 3) (onnxruntime, CPU)"
        assert results[artifact].facts["external_data_files"] == ["model.onnx.data"]
        assert not messages(findings, artifact)


def test_every_reload_of_the_gguf_and_onnx_package_is_forked_from_its_zygote(reloaded):
    """onnxruntime starts threads at its import: the zygote leaves it to the children, and forks (a zygote that
    imported it could not, and every child would start a fresh interpreter)."""
    results, _ = reloaded
    assert {artifact: result.facts.get("isolation") for artifact, result in results.items()} == \
        {artifact: "fork" for artifact in results}


def test_onnx_with_a_nan_weight_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "onnx-nan")
    assert "non-finite weights" in message and "2.weight" in message


def test_onnx_missing_its_external_data_is_IV504_naming_the_file(reloaded):
    _, findings = reloaded
    found = messages(findings, "onnx-no-data")
    assert found and all("model.onnx.data is missing" in m for m in found)


def test_onnx_whose_external_data_is_cut_short_is_IV504(reloaded):
    _, findings = reloaded
    found = messages(findings, "onnx-short-data")
    assert found and all("truncated" in m for m in found)


def test_the_recorder_registers_each_new_kind_with_its_loader_and_the_schemas_know_them(tmp_path):
    import json
    from pathlib import Path

    from itera_verify.format import loaders as table
    from itera_verify.record import open_campaign

    schemas = Path(__file__).resolve().parents[1] / "schemas"
    manifest_schema = json.loads((schemas / "manifest.schema.json").read_text())
    kinds = manifest_schema["properties"]["artifacts"]["items"]["properties"]["kind"]["enum"]
    assert tuple(kinds) == table.KINDS
    campaign = open_campaign(tmp_path / "pkg", "loaders", "Does it reload?", "toy", "v1", ["q-0"])
    campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}], reserved_hours=2)
    campaign.declare_stop_rules([{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"}])
    run = campaign.start_run("control", "control", params={"seed": 1})
    (tmp_path / "pkg/artifacts").mkdir()
    write_gguf(tmp_path / "pkg/artifacts/model.gguf")
    write_onnx(tmp_path / "pkg/artifacts/onnx")
    (tmp_path / "pkg/artifacts/sd").mkdir()
    assert run.artifact("artifacts/model.gguf", kind="gguf") == "control-gguf"
    assert run.artifact("artifacts/onnx", kind="onnx") == "control-onnx"
    assert run.artifact("artifacts/sd", kind="diffusers-pipeline") == "control-pipeline"
    entries = json.loads((tmp_path / "pkg/reload.json").read_text())["artifacts"]
    assert {name: entry["loader"] for name, entry in entries.items()} == {
        "control-gguf": "gguf", "control-onnx": "onnx", "control-pipeline": "diffusers"}
