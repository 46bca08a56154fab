"""The recorder writes nothing the checker would find untrue (issue 41, item 7): it reads the artifact's own
records back when it registers it and refuses a params file that disagrees (IV514), writes the values the Trainer
ran with and says which given ones it replaced, refuses two keys declaring one fact differently before the first
step, and saves an adapter's resized embeddings with it (IV516). Real PEFT saves and real Trainer runs."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from fixtures.hub import BASE_MODEL
from fixtures.train import torch_threads
from fixtures.truth import word_tokenizer
from itera_verify.record import RecordError
from tests.helpers import static_findings
from tests.test_record_trainer import open_test_campaign, train


def _base(hf_cache: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(BASE_MODEL, cache_dir=str(hf_cache), local_files_only=True)


def _lora(model, **extra):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], task_type="CAUSAL_LM",
                                            fan_in_fan_out=True, **extra))


def _saved_adapter(hf_cache: Path, package: Path) -> Path:
    model = _lora(_base(hf_cache))
    target = package / "artifacts/lora"
    model.save_pretrained(target, save_embedding_layers=False)
    return target


def test_registering_an_adapter_whose_params_declare_another_rank_is_refused(hf_cache, tmp_path):
    campaign = open_test_campaign(tmp_path / "pkg")
    run = campaign.run("lora", "variant", params={"seed": 1, "lora_r": 16, "lora_alpha": 8})
    run.start()
    adapter = _saved_adapter(hf_cache, tmp_path / "pkg")
    with pytest.raises(RecordError) as refused:
        run.adapter(adapter, base=BASE_MODEL, cache_dir=hf_cache)
    assert "params/lora.json declares lora_r = 16" in str(refused.value)
    assert "adapter_config.json records r = 4" in str(refused.value)
    manifest = json.loads((tmp_path / "pkg/manifest.json").read_text())
    assert manifest.get("artifacts", []) == []  # refused before the manifest names it


def test_an_adapter_whose_params_tell_its_rank_is_registered(hf_cache, tmp_path):
    campaign = open_test_campaign(tmp_path / "pkg")
    run = campaign.run("lora", "variant", params={"seed": 1, "lora_r": 4, "lora_alpha": 8})
    run.start()
    assert run.adapter(_saved_adapter(hf_cache, tmp_path / "pkg"), base=BASE_MODEL, cache_dir=hf_cache) \
        == "lora-adapter"


@pytest.mark.slow
def test_a_learning_rate_the_trainer_overrides_is_recorded_as_run_and_said(tmp_path):
    from fixtures.artifacts import tiny_gpt2

    with torch_threads(1), contextlib.chdir(tmp_path):
        campaign = open_test_campaign(Path("pkg"))
        run = campaign.run("control", "control", params={"learning_rate": 1e-4})
        with pytest.warns(UserWarning, match=r"learning_rate 0\.0001 -> 0\.005"):
            train(tiny_gpt2(seed=0), run, "pkg/checkpoints/control", max_steps=1, save_steps=1)
    params = json.loads((tmp_path / "pkg/params/control.json").read_text())
    assert params["learning_rate"] == 5e-3
    assert [f for f in static_findings(tmp_path / "pkg") if f.code == "IV514"] == []


@pytest.mark.slow
def test_two_keys_declaring_one_lora_rank_differently_are_refused_before_the_first_step(hf_cache, tmp_path):
    with torch_threads(1), contextlib.chdir(tmp_path):
        campaign = open_test_campaign(Path("pkg"))
        run = campaign.run("lora", "variant", params={"lora_r": 16})
        with pytest.raises(RecordError, match=r"lora_r = 16 and peft\.default\.r = 4"):
            train(_lora(_base(hf_cache)), run, "pkg/checkpoints/lora", max_steps=1, hf_cache=hf_cache)
    assert not (tmp_path / "pkg/metrics/lora.jsonl").exists()
    assert not (tmp_path / "pkg/params/lora.json").exists()


@pytest.mark.slow
def test_the_recorder_saves_an_adapters_resized_embeddings_with_it(hf_cache, tmp_path):
    from safetensors import safe_open

    tokenizer = word_tokenizer(words=126, chat=True)
    base = _base(hf_cache)
    base.resize_token_embeddings(len(tokenizer))
    with torch_threads(1), contextlib.chdir(tmp_path):
        campaign = open_test_campaign(Path("pkg"))
        run = campaign.run("chat-lora", "variant", params={"chat_format": "chatml"})
        with pytest.warns(UserWarning, match=r"resized \(128 -> 130 token ids\): saving them with the adapter"):
            trainer = train(_lora(base), run, "pkg/checkpoints/chat-lora", max_steps=1,
                            save_model_to="artifacts/chat-lora", hf_cache=hf_cache)
        tokenizer.save_pretrained("pkg/artifacts/chat-lora")
        assert trainer.state.global_step == 1
    params = json.loads((tmp_path / "pkg/params/chat-lora.json").read_text())
    assert (params["vocab_size"], params["base_vocab_size"]) == (130, 128)
    with safe_open(str(tmp_path / "pkg/artifacts/chat-lora/adapter_model.safetensors"), "pt") as saved:
        rows = {name: saved.get_slice(name).get_shape()[0] for name in saved.keys() if name.endswith("wte.weight")}
    assert list(rows.values()) == [130]
    assert [f for f in static_findings(tmp_path / "pkg") if f.code in ("IV514", "IV516", "IV517")] == []


def test_a_bf16_mixed_precision_run_declares_one_precision_and_a_lora_rank_twice_two():
    from itera_verify.record.facts_check import conflicting_declarations

    assert conflicting_declarations({"precision": "bf16", "mixed_precision": "bf16", "bf16": True}) == []
    [conflict] = conflicting_declarations({"lora_r": 16, "peft": {"default": {"r": 4}}})
    assert conflict == "lora_r = 16 and peft.default.r = 4 (the LoRA rank)"
