"""The delivered model has its tokenizer (issue 25): RecordCallback(save_model_to=...) saves the Trainer's
processing_class beside the model, as the Trainer does in every checkpoint, and IV513 warns when a delivered
model lacks the tokenizer its run's checkpoints carry. A real Trainer run, recorded."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from fixtures.artifacts import tiny_gpt2
from fixtures.train import token_dataset, torch_threads
from tests.helpers import codes, static_findings
from tests.test_record_trainer import EVAL_IDS, open_test_campaign

MODEL = "artifacts/control-model"


def word_tokenizer():
    """A real fast tokenizer, built offline: one word per id, within the tiny model's vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i + 2 for i in range(60)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    from itera_verify.integrations import RecordCallback
    from transformers import PrinterCallback, ProgressCallback, Trainer, TrainingArguments

    work = tmp_path_factory.mktemp("tokenizer")
    with torch_threads(1), contextlib.chdir(work):
        campaign = open_test_campaign(Path("pkg"))
        run = campaign.run("control", "control", params={"model": "tiny-gpt2"})
        args = TrainingArguments(output_dir="pkg/checkpoints/control", max_steps=2, per_device_train_batch_size=2,
                                 logging_steps=1, save_strategy="steps", save_steps=2, report_to="none",
                                 use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=11)
        trainer = Trainer(model=tiny_gpt2(seed=0), args=args, train_dataset=token_dataset(4, 16, seed=7),
                          processing_class=word_tokenizer(), callbacks=[RecordCallback(run, save_model_to=MODEL)])
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        trainer.train()
        with run.predictions() as stream:
            for i in EVAL_IDS:
                stream.write(i, 0)
        run.complete()
    return work / "pkg"


def iv513(package: Path) -> list:
    return [f for f in static_findings(package) if f.code == "IV513"]


@pytest.mark.slow
def test_the_final_model_is_saved_with_the_trainers_tokenizer(recorded):
    assert (recorded / MODEL / "tokenizer.json").is_file()
    assert (recorded / "checkpoints/control/checkpoint-2/tokenizer.json").is_file()
    assert iv513(recorded) == []


def test_a_delivered_model_without_the_tokenizer_its_checkpoints_carry_is_IV513(recorded, tmp_path):
    package = Path(shutil.copytree(recorded, tmp_path / "pkg", symlinks=True))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (package / MODEL / name).unlink(missing_ok=True)
    [finding] = iv513(package)
    assert (finding.path, finding.run, finding.artifact) == (MODEL, "control", "control-model")
    assert "checkpoints/control/checkpoint-2" in finding.message and "tokenizer.json" in finding.message


def test_clean_example_package_has_no_IV513(package_dir):
    # Neither its model nor its checkpoints carry a tokenizer: nothing the reviewer was denied.
    assert "IV513" not in codes(static_findings(package_dir))
