"""The tokenizer fits the model it is delivered with (issue 41): vocabulary against the embeddings, an adapter
whose resized embeddings were never saved, special tokens, the chat template a run declares (IV516, IV517), and
the generation config's token ids (IV518). Real saves of real tiny runs (fixtures/truth.py), one change each."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fixtures.edit import edit_json
from tests.helpers import static_findings


def found(package: Path, code: str) -> list:
    return [f for f in static_findings(package, select=(code,)) if f.code == code]


def test_a_chat_tokenizer_delivered_with_embeddings_never_resized_is_IV516(truth_dir):
    from transformers import AutoTokenizer

    chat_tokenizer = AutoTokenizer.from_pretrained(truth_dir / "artifacts/chat-model", local_files_only=True)
    chat_tokenizer.save_pretrained(truth_dir / "artifacts/control-model")  # the tokens added, the model not resized
    [finding] = found(truth_dir, "IV516")
    assert finding.path == "artifacts/control-model/tokenizer.json" and finding.artifact == "control-model"
    assert "ids up to 129" in finding.message and "'<|im_start|>'" in finding.message
    assert "128 token ids" in finding.message


def test_the_chat_model_with_resized_embeddings_and_its_adapter_fit(built_truth):
    clean = Path(built_truth["clean"])
    params = json.loads((clean / "params/chat-lora.json").read_text())
    assert (params["vocab_size"], params["base_vocab_size"]) == (130, 128)  # recorded by the recorder
    assert [f for f in static_findings(clean) if f.code in {"IV516", "IV517", "IV518"}] == []


def test_an_adapter_whose_resized_embeddings_were_never_saved_is_IV516(built_truth, truth_dir):
    adapter = truth_dir / "artifacts/chat-lora-adapter"
    shutil.rmtree(adapter)
    shutil.copytree(Path(built_truth["extras"]) / "chat-lora-unsaved", adapter)  # save_embedding_layers=False
    findings = [f for f in found(truth_dir, "IV516") if f.artifact == "chat-lora-adapter"]
    assert len(findings) == 1, [f.message for f in findings]
    assert "trained with 130 token ids" in findings[0].message and "base of 128" in findings[0].message
    assert "saves no embeddings" in findings[0].message


def test_a_config_vocab_size_copied_from_the_base_onto_resized_embeddings_is_IV516(truth_dir):
    edit_json(truth_dir, "artifacts/chat-model/config.json", lambda config: config.update(vocab_size=128))
    [finding] = found(truth_dir, "IV516")
    assert finding.path == "artifacts/chat-model/config.json" and finding.pointer == "/vocab_size"
    assert "vocab_size = 128" in finding.message and "130 rows" in finding.message


def test_a_special_token_the_vocabulary_does_not_hold_is_IV516(truth_dir):
    edit_json(truth_dir, "artifacts/control-model/tokenizer_config.json",
              lambda config: config.update(pad_token="<pad>"))
    [finding] = found(truth_dir, "IV516")
    assert finding.pointer == "/pad_token" and "'<pad>'" in finding.message


def test_a_chat_run_delivered_without_its_chat_template_is_IV517(truth_dir):
    model = truth_dir / "artifacts/chat-model"
    (model / "chat_template.jinja").unlink()
    edit_json(truth_dir, "artifacts/chat-model/tokenizer_config.json", lambda config: config.pop("chat_template",
                                                                                               None))
    [finding] = found(truth_dir, "IV517")
    assert (finding.path, finding.run) == ("artifacts/chat-model", "chat")
    assert "chat_format = 'chatml'" in finding.message or "chat_template = " in finding.message


def test_a_chat_template_other_than_the_one_the_run_declares_is_IV517(truth_dir):
    (truth_dir / "artifacts/chat-model/chat_template.jinja").write_text(
        "{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}")
    [finding] = found(truth_dir, "IV517")
    assert "not the one run chat's params declare" in finding.message


def test_a_generation_config_copied_from_gpt2_naming_eos_50256_is_IV518(truth_dir):
    from transformers import GenerationConfig

    GenerationConfig(bos_token_id=50256, eos_token_id=50256).save_pretrained(truth_dir / "artifacts/control-model")
    [finding] = found(truth_dir, "IV518")
    assert finding.path == "artifacts/control-model/generation_config.json"
    assert "50256" in finding.message and "128 token ids" in finding.message


def test_generation_ids_inside_the_vocabulary_are_not_IV518(truth_dir):
    from transformers import GenerationConfig

    GenerationConfig(bos_token_id=0, eos_token_id=[0, 1], pad_token_id=1).save_pretrained(
        truth_dir / "artifacts/control-model")
    assert found(truth_dir, "IV518") == []


@pytest.mark.slow
def test_the_chat_adapter_with_its_resized_embeddings_reloads_on_its_base(built, built_truth):
    """The adapter saved the embeddings it was trained with (130 rows, the base's 128 and two chat tokens): the
    reload resizes the base to them before they attach, as the run's script did, never a size-mismatch IV504."""
    from dataclasses import replace

    from itera_verify.reload import run_reloads
    from itera_verify.rules import reload as reload_rules
    from itera_verify.runtime.progress import NULL_PROGRESS
    from tests.helpers import context

    package = context(built_truth["clean"], hf_cache=Path(built["hf_cache"]))
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=300, jobs=1,
                                                   progress=NULL_PROGRESS, only={"chat-lora-adapter"}))
    [result] = package.reloads
    assert result.ok, result.error
    assert result.facts["resized_embeddings"].startswith("128 -> 130 rows")
    assert not [f for f in reload_rules.check(package) if f.artifact == "chat-lora-adapter"]


def test_an_adapter_without_its_embeddings_is_held_to_its_cached_base_when_the_params_are_silent(
        built, built_truth, truth_dir):
    """Params written by hand name no base_vocab_size: the base's rows come from its config.json in the hub
    cache, and the tokenizer's 130 ids against a base of 128 are IV516 all the same."""
    from fixtures.edit import refresh_hashes
    from itera_verify.flows.checks import run_checks
    from itera_verify.rules import Selection
    from tests.helpers import context

    adapter = truth_dir / "artifacts/chat-lora-adapter"
    shutil.rmtree(adapter)
    shutil.copytree(Path(built_truth["extras"]) / "chat-lora-unsaved", adapter)
    edit_json(truth_dir, "params/chat-lora.json", lambda params: [params.pop(key, None)
                                                                  for key in ("base_vocab_size", "vocab_size")])
    refresh_hashes(truth_dir)
    package = context(truth_dir, hf_cache=Path(built["hf_cache"]))
    findings = [f for f in run_checks(package, Selection(select=("IV516",)), "static")
                if f.artifact == "chat-lora-adapter"]
    assert len(findings) == 1, [f.message for f in findings]
    assert "its base's config.json in the hub cache" in findings[0].message
    assert "ids up to 129" in findings[0].message
