"""training_args.bin's allowlist is an exact list of names, checked against real TrainingArguments pickles of
the installed transformers and accelerate; the path rules report the exact strings a pickle holds."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from itera_verify.package.pickles import INERT_CONFIG, scan_file

from tests.helpers import static_findings

# Option combinations a real run uses (on the CPU: fp16/bf16 off), each pickled the way the Trainer saves it.
COMBINATIONS = {
    "defaults": {},
    "eval_steps_cosine": {"eval_strategy": "steps", "eval_steps": 2, "save_strategy": "epoch", "lr_scheduler_type": "cosine",
                              "optim": "adamw_torch", "report_to": "none"},
    "eval_epoch_adafactor": {"eval_strategy": "epoch", "lr_scheduler_type": "linear", "optim": "adafactor", "report_to": [],
                                 "logging_strategy": "no"},
    "no_save_sgd_hub_end": {"lr_scheduler_type": "constant_with_warmup", "optim": "sgd", "save_strategy": "no",
                                "hub_strategy": "end"},
    "accelerator_config": {"lr_scheduler_type": "cosine_with_restarts", "optim": "adamw_torch_fused",
                               "accelerator_config": {"split_batches": True, "even_batches": False}},
    "tensorboard_checkpointing": {"lr_scheduler_type": "polynomial", "optim": "adagrad", "report_to": "tensorboard",
                                      "gradient_checkpointing": True,
                                      "gradient_checkpointing_kwargs": {"use_reentrant": False}},
    "plateau_no_deepspeed": {"lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "steps", "eval_steps": 5,
                                 "optim": "rmsprop", "deepspeed": None},
    "best_model": {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr": 1e-6},
                       "load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "steps",
                       "metric_for_best_model": "loss"},
    "save_best_debug": {"save_strategy": "best", "eval_strategy": "steps", "metric_for_best_model": "loss",
                            "debug": "underflow_overflow", "hub_strategy": "checkpoint"},
    "wsd_scheduler": {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": 2}},
    "tensor_parallel": "tp_size",
    "context_parallel": "cp_size",
    "sequence_parallel": "sp_size",
}


def _options(name: str) -> dict:
    options = COMBINATIONS[name]
    if isinstance(options, str):  # a parallelism_config with one handler (its size > 1 creates it)
        from accelerate.parallelism_config import ParallelismConfig

        extra = {"sp_backend": "deepspeed"} if options == "sp_size" else {}
        return {"parallelism_config": ParallelismConfig(**{options: 2}, **extra)}
    return options


def _training_args(tmp_path: Path, options: dict, output_dir: str = "runs/control"):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=output_dir, use_cpu=True, **options)


@pytest.mark.parametrize("name", COMBINATIONS)
def test_real_training_args_name_only_listed_classes(name, tmp_path):
    path = tmp_path / "training_args.bin"
    torch.save(_training_args(tmp_path, _options(name)), path)
    result = scan_file(path)
    assert result.error is None and result.unsafe == [], result
    assert "transformers.training_args.TrainingArguments" in result.globals
    assert {g for g in result.globals if not g.startswith("torch.")} <= INERT_CONFIG


def test_seq2seq_training_args_with_a_generation_config(tmp_path):
    from transformers import GenerationConfig, Seq2SeqTrainingArguments

    path = tmp_path / "training_args.bin"
    torch.save(Seq2SeqTrainingArguments(output_dir="out", use_cpu=True, predict_with_generate=True,
                                        generation_config=GenerationConfig(max_new_tokens=4)), path)
    result = scan_file(path)
    assert result.unsafe == [] and "transformers.training_args_seq2seq.Seq2SeqTrainingArguments" in result.globals


def test_fixture_trainer_checkpoint_names_only_listed_classes(built):
    result = scan_file(Path(built["package"]) / "checkpoints/control/checkpoint-4/training_args.bin")
    assert result.unsafe == [] and {g for g in result.globals if not g.startswith("torch.")} <= INERT_CONFIG


def test_deepspeed_configuration_classes_by_exact_path(tmp_path):
    """DeepSpeed is not installed here: the classes themselves, pickled by reference, carry the exact names."""
    from accelerate.utils.deepspeed import HfDeepSpeedConfig as AccelerateConfig
    from transformers.integrations.deepspeed import (
        HfDeepSpeedConfig,
        HfTrainerDeepSpeedConfig,
    )

    for cls in (HfTrainerDeepSpeedConfig, HfDeepSpeedConfig, AccelerateConfig):
        path = tmp_path / "training_args.bin"
        path.write_bytes(pickle.dumps(cls, protocol=2))
        assert scan_file(path).unsafe == [], cls


def _global_pickle(module: str, name: str) -> bytes:
    """GLOBAL module name, then REDUCE with no arguments: constructing the class, as a payload would."""
    return b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n)R."


@pytest.mark.parametrize("module,name", [
    ("transformers.cli.serving.model_manager", "ModelManager"),  # loads a model with remote code when built
    ("transformers.modeling_utils", "Thread"),  # a re-export of threading.Thread
    ("transformers.training_args", "os"),
    ("transformers.trainer_utils", "set_seed"),
    ("accelerate.utils.dataclasses", "os"),
    ("transformers", "TrainingArguments"),  # the class by another path than its own module
])
def test_other_transformers_names_are_IV506_in_training_args(module, name, tmp_path, package_dir):
    import importlib

    assert getattr(importlib.import_module(module), name)  # a real, importable name
    rel = "checkpoints/control/checkpoint-4/training_args.bin"
    (package_dir / rel).write_bytes(_global_pickle(module, name))
    assert scan_file(package_dir / rel).unsafe == [f"{module}.{name}"]
    findings = [f for f in static_findings(package_dir) if f.code == "IV506"]
    assert [f.path for f in findings] == [rel] and f"{module}.{name}" in findings[0].message


def test_training_args_classes_are_unsafe_anywhere_else(tmp_path):
    path = tmp_path / "optimizer.pt"
    torch.save(_training_args(tmp_path, {}), path)
    assert "transformers.training_args.TrainingArguments" in scan_file(path).unsafe


# ---- the path rules read the pickle's strings (issue 15) ------------------------------------------------

def test_tmp_output_dir_in_training_args_is_reported_as_the_string_it_holds(package_dir, tmp_path):
    output_dir = "/tmp/itera-run/checkpoints/control"
    rel = "checkpoints/control/checkpoint-4/training_args.bin"
    torch.save(_training_args(tmp_path, {}, output_dir=output_dir), package_dir / rel)
    found = [f for f in static_findings(package_dir) if f.code == "IV201" and f.path == rel]
    assert found, "the /tmp output_dir was not found"
    assert found[0].message.split("stored in the pickle: ", 1)[1].startswith(f"\"{output_dir}\";")
    assert "controlq" not in found[0].message and "record of the run" in found[0].message
    assert "relative output_dir" in found[0].message


def test_tmp_path_in_a_binary_that_is_no_pickle_is_still_found(package_dir):
    rel = "checkpoints/control/blob.bin"
    (package_dir / rel).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8 + b"/tmp/scratch/data\x00" + bytes(16))
    found = [f for f in static_findings(package_dir) if f.code == "IV201" and f.path == rel]
    assert [("/tmp/scratch/data" in f.message) for f in found] == [True]


def test_every_listed_name_is_a_class_at_its_own_module():
    """No re-export on the list: each name is where the class itself says it lives."""
    import importlib

    for name in sorted(INERT_CONFIG):
        module, _, attr = name.rpartition(".")
        obj = getattr(importlib.import_module(module), attr)
        assert isinstance(obj, type) and f"{obj.__module__}.{obj.__qualname__}" == name, name


def test_multi_gpu_trainer_runs_name_only_listed_classes(built_multigpu):
    """The DDP and DeepSpeed Trainer runs the multi-GPU fixture really ran (2 gloo processes): their
    training_args.bin name only the list; under DeepSpeed that includes its configuration classes."""
    files = sorted(Path(built_multigpu["package"]).rglob("training_args.bin"))
    named: set[str] = set()
    for path in files:
        result = scan_file(path)
        assert result.error is None and result.unsafe == [], (path, result)
        named |= {g for g in result.globals if not g.startswith("torch.")}
    assert named <= INERT_CONFIG
    assert {"transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig",
            "accelerate.utils.dataclasses.DeepSpeedPlugin"} <= named
