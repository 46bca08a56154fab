"""A zygote imports what its run's loaders need and nothing more (issue 40 item 3: reloads at the import floor),
and a warm zygote serves the runs of one process that ask for the same imports (reload/warm.py)."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from itera_verify.reload import run_reloads, warm_zygotes
from itera_verify.reload.preloads import imports_for, plan
from itera_verify.reload.runner import package_preloads, zygote_env
from itera_verify.reload.warm import suspended
from itera_verify.reload.zygote_client import Zygote
from itera_verify.runtime.environment import Environment
from itera_verify.runtime.launcher import Launcher
from itera_verify.runtime.progress import NULL_PROGRESS
from tests.helpers import context
from tests.test_zygote import probe

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/stat").exists(),
                                reason="the zygote forks (Linux)")
KEPT_OUT = ["bitsandbytes", "boto3", "scipy", "torchvision"]


def write_config(folder: Path, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# --- what a run's zygote imports ----------------------------------------------------------------------------

@pytest.mark.slow
def test_the_example_package_zygote_imports_transformers_and_peft_and_keeps_their_extras_out(package_dir, hf_cache,
                                                                                          monkeypatch, tmp_path):
    wanted = package_preloads(context(package_dir, hf_cache=Path(hf_cache)))
    assert {"torch", "transformers", "peft"} <= set(wanted.imports)
    assert sorted(wanted.without) == KEPT_OUT and "diffusers" not in wanted.imports
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    children = Launcher(Environment.read())
    started = Zygote(children, zygote_env(children.environment), preloads=wanted)
    started.wait_ready()
    assert started.client is not None, started.why
    try:
        seen = probe(children, started, tmp_path / "child", "look")["at_start"]
    finally:
        started.close()
    # torch's compiler came with bitsandbytes; none of these were imported, and the child keeps them out too (peft
    # would import bitsandbytes when it attaches an adapter, in every child).
    assert seen["imported"] == ["accelerate", "peft", "transformers"]
    assert seen["kept_out"] == KEPT_OUT


def test_a_model_that_declares_a_quantization_keeps_bitsandbytes_in(tmp_path):
    plain = write_config(tmp_path / "plain", model_type="gpt2")
    quantized = write_config(tmp_path / "quantized", model_type="gpt2",
                             quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True})
    assert "bitsandbytes" in plan(["transformers"], [plain]).without
    assert "bitsandbytes" not in plan(["transformers"], [plain, quantized]).without
    # in a base pipeline's component folder too
    write_config(tmp_path / "pipeline" / "unet", quantization_config={"quant_method": "bitsandbytes"})
    assert "bitsandbytes" not in plan(["diffusers-lora"], [tmp_path / "pipeline"]).without


def test_an_architecture_whose_modelling_file_names_scipy_keeps_scipy_and_torchvision_in(tmp_path):
    text = write_config(tmp_path / "gpt2", model_type="gpt2")
    fourier = write_config(tmp_path / "fnet", model_type="fnet")  # modeling_fnet.py imports scipy's linalg
    unknown = write_config(tmp_path / "odd", model_type="not_a_transformers_model")
    assert {"scipy", "torchvision"} <= set(plan(["transformers"], [text]).without)
    for folder in (fourier, unknown):
        assert not {"scipy", "torchvision"} & set(plan(["transformers"], [text, folder]).without)


def test_a_diffusers_package_zygote_imports_diffusers_and_keeps_scipy_in(tmp_path):
    wanted = plan(["diffusers"], [])
    assert "diffusers" in wanted.imports and "peft" not in wanted.imports
    assert "scipy" not in wanted.without and "boto3" in wanted.without
    light = plan(["safetensors", "torch-resume"], [])
    assert light.light and "transformers" not in light.imports and "bitsandbytes" in light.without


# --- a warm zygote across runs ------------------------------------------------------------------------------

def reload_once(package_dir, hf_cache, only):
    package = context(package_dir, hf_cache=Path(hf_cache))
    return replace(package, reloads=run_reloads(package, device="cpu", timeout=300, jobs=1, progress=NULL_PROGRESS,
                                                only={only})).reloads


@pytest.mark.own_zygote
def test_runs_inside_warm_zygotes_share_one_zygote_and_another_environment_gets_its_own(package_dir, hf_cache,
                                                                                      monkeypatch, tmp_path):
    folder = tmp_path / "zygotes"
    folder.mkdir()
    with suspended(), warm_zygotes(folder=str(folder)) as warm:
        first = reload_once(package_dir, hf_cache, "lora-r16-resume")
        second = reload_once(package_dir, hf_cache, "lora-r16-resume")
        assert (warm.started, warm.reused) == (1, 1)
        [kept] = list(warm._kept.values())
        monkeypatch.setenv("ITERA_TEST_OTHER_RUN", "1")  # what a child starts with differs: not the same zygote
        third = reload_once(package_dir, hf_cache, "lora-r16-resume")
        assert (warm.started, warm.reused) == (2, 1)
    for results in (first, second, third):
        assert [(r.artifact, r.ok, r.facts["isolation"]) for r in results] == [("lora-r16-resume", True, "fork")]
    assert kept.client.proc.returncode is not None, "leaving warm_zygotes ends its zygotes"
    assert list(folder.iterdir()) == [], "a zygote's folder was left behind"


@pytest.mark.slow
@pytest.mark.own_zygote
def test_a_warm_zygote_that_imports_more_serves_a_run_that_needs_less_and_a_wider_one_replaces_it(
        package_dir, hf_cache, tmp_path):
    folder = tmp_path / "zygotes"
    folder.mkdir()
    with suspended(), warm_zygotes(folder=str(folder)) as warm:
        light = reload_once(package_dir, hf_cache, "lora-r16-resume")  # torch.load alone: torch, no transformers
        [first] = list(warm._kept.values())
        assert "transformers" not in first.preloads.imports
        adapter = reload_once(package_dir, hf_cache, "lora-r16-adapter")  # needs transformers and peft as well
        assert (warm.started, warm.reused) == (2, 0)
        [wider] = list(warm._kept.values())
        assert wider is not first and first.client.proc.returncode is not None, "the narrower one was ended"
        assert set(first.preloads.imports) | {"transformers", "peft"} <= set(wider.preloads.imports)
        again = reload_once(package_dir, hf_cache, "lora-r16-resume")
        model = reload_once(package_dir, hf_cache, "control-model")  # transformers alone: covered as well
        assert (warm.started, warm.reused) == (2, 2)
        assert list(warm._kept.values()) == [wider]
    for results, artifact in ((light, "lora-r16-resume"), (adapter, "lora-r16-adapter"), (again, "lora-r16-resume"),
                              (model, "control-model")):
        assert [(r.artifact, r.ok, r.facts["isolation"]) for r in results] == [(artifact, True, "fork")]
    assert list(folder.iterdir()) == [], "a zygote's folder was left behind"


# --- the device, without importing torch in the tool's own process ---------------------------------------

def test_device_auto_with_a_torch_built_for_the_cpu_alone_is_cpu_without_importing_torch():
    import subprocess
    import sys

    from itera_verify.reload import torch_build

    if torch_build() != "cpu":
        pytest.skip("this torch is built with CUDA or ROCm: auto asks it")
    probe = "import sys; from itera_verify.reload import resolve_device; print(resolve_device('auto'), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == ["cpu", "False"]


def test_a_torch_built_with_cuda_or_rocm_is_not_taken_for_a_cpu_build():
    from itera_verify.reload import built_for_cpu_alone

    cpu = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"
    assert built_for_cpu_alone(cpu)
    assert not built_for_cpu_alone(cpu.replace("cuda: Optional[str] = None", "cuda: Optional[str] = '12.8'"))
    assert not built_for_cpu_alone(cpu.replace("hip: Optional[str] = None", "hip: Optional[str] = '6.2.41133'"))
    assert not built_for_cpu_alone("__version__ = '3.0'\n")  # a file that no longer says: torch is asked


def test_one_set_of_loaders_is_one_zygote_whatever_the_packages_order():
    """A shared server is keyed by its imports in order (reload/shared.py): two packages with the same loaders,
    declared in another order, share one."""
    one = imports_for(["sentence-transformers", "diffusers", "peft", "safetensors"])
    other = imports_for(["safetensors", "peft", "diffusers", "sentence-transformers", "peft", "no-such-loader"])
    assert one == other and len(set(one)) == len(one)
    assert {"peft", "diffusers", "sentence_transformers"} <= set(one)
