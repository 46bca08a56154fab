"""IV512: a delivered model whose weights are the base's (from the hub cache) or another run's; static, no torch."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from tests.helpers import codes, run_cli, context

BASE = "models--itera-fixtures--tiny-gpt2"


def iv512(package_dir: Path, hf_cache) -> list:
    from itera_verify.rules import Selection
    from itera_verify.flows.checks import run_checks

    package = context(package_dir, hf_cache=Path(hf_cache))
    return [f for f in run_checks(package, Selection(select=("IV512",)), "static") if f.code == "IV512"]


def base_snapshot(built) -> Path:
    return Path(built["hf_cache"]) / BASE / "snapshots" / built["base_revision"]


def add_artifact(package_dir: Path, artifact: dict, entry: dict) -> None:
    manifest = json.loads((package_dir / "manifest.json").read_text())
    manifest["artifacts"].append(artifact)
    (package_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    reload_spec = json.loads((package_dir / "reload.json").read_text())
    reload_spec["artifacts"][artifact["id"]] = entry
    (package_dir / "reload.json").write_text(json.dumps(reload_spec, indent=2))


def test_clean_fixture_package_has_no_IV512(package_dir, built):
    assert iv512(package_dir, built["hf_cache"]) == []


def test_base_snapshot_delivered_as_the_fine_tuned_model_is_IV512(package_dir, built):
    # The user copied the cached base (what from_pretrained loaded before training) as "the trained model".
    target = package_dir / "artifacts/control-model/model.safetensors"
    shutil.copyfile(base_snapshot(built) / "model.safetensors", target)
    [finding] = iv512(package_dir, built["hf_cache"])
    assert finding.path == "artifacts/control-model/model.safetensors"
    assert (finding.run, finding.artifact) == ("control", "control-model")
    assert "itera-fixtures/tiny-gpt2" in finding.message and built["base_revision"] in finding.message
    assert "nothing was trained" in finding.message


def test_base_resaved_with_other_metadata_is_still_IV512(package_dir, built):
    # Equal tensors, different header (metadata, order): digests are of the tensor payloads, not of the file.
    tensors = load_file(base_snapshot(built) / "model.safetensors")
    save_file(dict(reversed(list(tensors.items()))), package_dir / "artifacts/control-model/model.safetensors",
              metadata={"format": "pt", "note": "fine-tuned"})
    assert len(iv512(package_dir, built["hf_cache"])) == 1


def test_one_trained_tensor_is_not_IV512(package_dir, built):
    tensors = load_file(base_snapshot(built) / "model.safetensors")
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name] + 1e-3  # one step of training touched one tensor
    save_file(tensors, package_dir / "artifacts/control-model/model.safetensors", metadata={"format": "pt"})
    assert iv512(package_dir, built["hf_cache"]) == []


def test_base_named_only_by_the_model_artifact_is_compared(package_dir, built):
    # No adapter in the package: the manifest's `base` of the model artifact names the snapshot.
    manifest = json.loads((package_dir / "manifest.json").read_text())
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["kind"] != "peft-adapter"]
    manifest["artifacts"][0]["base"] = {"name": "itera-fixtures/tiny-gpt2", "revision": built["base_revision"]}
    (package_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(package_dir / "artifacts/lora-r16")
    shutil.copyfile(base_snapshot(built) / "model.safetensors", package_dir / "artifacts/control-model/model.safetensors")
    assert len(iv512(package_dir, built["hf_cache"])) == 1


def test_two_runs_delivering_the_same_model_folder_is_IV512(package_dir, built):
    add_artifact(package_dir, {"id": "lora-r16-merged", "run": "lora-r16", "kind": "transformers-model",
                               "path": "artifacts/control-model"}, {"loader": "transformers"})
    [finding] = iv512(package_dir, built["hf_cache"])
    assert (finding.run, finding.artifact) == ("lora-r16", "lora-r16-merged")
    assert "control-model" in finding.message and "'control'" in finding.message


def test_a_copy_of_another_runs_model_is_IV512(package_dir, built):
    shutil.copytree(package_dir / "artifacts/control-model", package_dir / "artifacts/lora-r16-merged")
    add_artifact(package_dir, {"id": "lora-r16-merged", "run": "lora-r16", "kind": "transformers-model",
                               "path": "artifacts/lora-r16-merged"}, {"loader": "transformers"})
    [finding] = iv512(package_dir, built["hf_cache"])
    assert finding.path == "artifacts/lora-r16-merged/model.safetensors"


def test_another_runs_checkpoint_weights_delivered_as_a_model_is_IV512(package_dir, built):
    # The control's delivered model moved on after checkpoint-4; the variant "delivers" that checkpoint's weights.
    model = package_dir / "artifacts/control-model/model.safetensors"
    tensors = load_file(model)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] * 0.5
    save_file(tensors, model, metadata={"format": "pt"})
    shutil.copytree(package_dir / "checkpoints/control/checkpoint-4", package_dir / "artifacts/lora-r16-merged")
    add_artifact(package_dir, {"id": "lora-r16-merged", "run": "lora-r16", "kind": "safetensors",
                               "path": "artifacts/lora-r16-merged/model.safetensors"}, {"loader": "safetensors"})
    [finding] = iv512(package_dir, built["hf_cache"])
    assert "control-resume" in finding.message


def test_same_runs_model_and_checkpoint_are_not_IV512(package_dir, built):
    # The run's final model equals its last checkpoint's weights: that is how a Trainer saves, not a defect.
    shutil.copyfile(package_dir / "checkpoints/control/checkpoint-4/model.safetensors",
                    package_dir / "artifacts/control-model/model.safetensors")
    assert iv512(package_dir, built["hf_cache"]) == []


def test_clean_classifier_campaign_has_no_IV512(classifier_dir, built_classifier):
    assert iv512(classifier_dir, built_classifier["hf_cache"]) == []


def test_clean_multigpu_package_has_no_IV512(multigpu_dir, built_multigpu):
    # Several checkpoints of the control (DDP, DeepSpeed, accelerate) hold its weights: one run, no finding.
    assert iv512(multigpu_dir, built_multigpu["hf_cache"]) == []


def test_init_template_has_no_IV512(tmp_path, built):
    result = run_cli("init", tmp_path / "new")
    assert result.returncode == 0, result.stderr
    assert iv512(tmp_path / "new", built["hf_cache"]) == []


def test_command_line_reports_IV512_without_reloading(package_dir, built):
    shutil.copyfile(base_snapshot(built) / "model.safetensors", package_dir / "artifacts/control-model/model.safetensors")
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--hf-cache", built["hf_cache"], "--format", "json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert "IV512" in codes(type("F", (), {"code": f["code"]}) for f in report["findings"])


def untrained_adapter(built, dest: Path) -> None:
    """What get_peft_model makes before any training step: every lora_B zero."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(built["base_model"], revision=built["base_revision"],
                                                cache_dir=built["hf_cache"], local_files_only=True)
    model = get_peft_model(base, LoraConfig(r=16, target_modules=["c_attn"], task_type="CAUSAL_LM"),
                           revision=built["base_revision"])
    model.save_pretrained(dest)


def test_adapter_saved_before_training_is_IV512(package_dir, built, tmp_path):
    untrained_adapter(built, tmp_path / "adapter")
    shutil.copyfile(tmp_path / "adapter/adapter_model.safetensors",
                    package_dir / "artifacts/lora-r16/adapter_model.safetensors")
    [finding] = iv512(package_dir, built["hf_cache"])
    assert (finding.path, finding.artifact) == ("artifacts/lora-r16/adapter_model.safetensors", "lora-r16-adapter")
    assert "LoRA B matrix" in finding.message and "nothing was trained" in finding.message


def test_adapter_with_one_trained_B_matrix_is_not_IV512(package_dir, built, tmp_path):
    untrained_adapter(built, tmp_path / "adapter")
    tensors = load_file(tmp_path / "adapter/adapter_model.safetensors")
    name = next(n for n in sorted(tensors) if "lora_B" in n)
    tensors[name][0, 0] = 1e-4
    save_file(tensors, package_dir / "artifacts/lora-r16/adapter_model.safetensors", metadata={"format": "pt"})
    assert iv512(package_dir, built["hf_cache"]) == []


# ---- a model in another float format: compared with the base's values converted as torch converts them ----------

def resaved(built, dest: Path, dtype) -> None:
    """What a user gets who loads the base in `dtype` and saves it without a training step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(built["base_model"], revision=built["base_revision"],
                                                 cache_dir=built["hf_cache"], local_files_only=True, dtype=dtype)
    model.save_pretrained(dest)


def test_base_loaded_in_bf16_and_saved_untouched_is_IV512(package_dir, built, tmp_path):
    import torch

    resaved(built, tmp_path / "bf16", torch.bfloat16)
    shutil.copyfile(tmp_path / "bf16/model.safetensors", package_dir / "artifacts/control-model/model.safetensors")
    [finding] = iv512(package_dir, built["hf_cache"])
    assert (finding.run, finding.artifact) == ("control", "control-model")
    assert "converted to bfloat16" in finding.message and "nothing was trained" in finding.message


def test_base_loaded_in_fp16_and_saved_untouched_is_IV512(package_dir, built, tmp_path):
    import torch

    resaved(built, tmp_path / "fp16", torch.float16)
    shutil.copyfile(tmp_path / "fp16/model.safetensors", package_dir / "artifacts/control-model/model.safetensors")
    [finding] = iv512(package_dir, built["hf_cache"])
    assert "converted to float16" in finding.message


def test_the_trained_model_converted_to_bf16_is_not_IV512(package_dir, built):
    # The control was trained (4 steps): in bf16 its weights still differ from the base's converted ones.
    model = package_dir / "artifacts/control-model/model.safetensors"
    save_file({name: tensor.bfloat16() for name, tensor in load_file(model).items()}, model, metadata={"format": "pt"})
    assert iv512(package_dir, built["hf_cache"]) == []


def test_one_value_off_by_one_bf16_step_is_not_IV512(package_dir, built, tmp_path):
    import torch

    resaved(built, tmp_path / "bf16", torch.bfloat16)
    tensors = load_file(tmp_path / "bf16/model.safetensors")
    name = sorted(tensors, key=lambda n: -tensors[n].numel())[0]  # the largest: compared last
    flat = tensors[name].view(-1).view(torch.int16)
    flat[123] += 1  # the next bfloat16 value: not what rounding the base gives
    save_file(tensors, package_dir / "artifacts/control-model/model.safetensors", metadata={"format": "pt"})
    assert iv512(package_dir, built["hf_cache"]) == []


def test_another_runs_model_converted_to_bf16_is_IV512(package_dir, built):
    target = package_dir / "artifacts/lora-r16-merged"
    shutil.copytree(package_dir / "artifacts/control-model", target)
    tensors = load_file(target / "model.safetensors")
    save_file({n: t.bfloat16() for n, t in tensors.items()}, target / "model.safetensors", metadata={"format": "pt"})
    add_artifact(package_dir, {"id": "lora-r16-merged", "run": "lora-r16", "kind": "transformers-model",
                               "path": "artifacts/lora-r16-merged"}, {"loader": "transformers"})
    [finding] = iv512(package_dir, built["hf_cache"])
    assert finding.artifact == "lora-r16-merged" and "converted to bfloat16" in finding.message


def raw_safetensors(path: Path, header: bytes, payload: bytes = b"\0" * 8) -> None:
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + payload)


def test_a_header_with_non_integer_numbers_is_no_weight_set_and_no_crash(package_dir, built):
    # Found by `make fuzz`: 1e999 (infinity) in a shape or an offset made int() raise OverflowError.
    target = package_dir / "artifacts/control-model/model.safetensors"
    for header in (b'{"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}}',
                   b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,1e999]}}',
                   b'{"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}',
                   b'{"w":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}'):
        raw_safetensors(target, header)
        assert iv512(package_dir, built["hf_cache"]) == []
    from itera_verify.rules._tensors import read_header

    raw_safetensors(target, b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')
    assert read_header(str(target))["w"].shape == (2,)  # the same file with integers is read
