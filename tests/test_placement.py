"""Placement over GPUs (issue 17; docs/format.md, multi-GPU training outputs), planned on the CPU: meta-device models built with
accelerate's init_empty_weights, made-up free memory for two or eight GPUs. What fits goes on one GPU, what
does not is spread in whole blocks over all of them, and accelerate's silent offload to disk (reproduced here
with a small budget) is refused, before a load and after one."""
from __future__ import annotations
from dataclasses import replace

import re
from pathlib import Path

import pytest
from accelerate import infer_auto_device_map, init_empty_weights
from itera_verify.reload import placement
from itera_verify.reload.placement import Offload
from transformers import AutoModelForCausalLM, GPT2Config
from tests.helpers import context

MiB = 1 << 20


def meta_gpt2(layers: int = 8, width: int = 256):
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0)
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config)


def model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def block_order(device_map: dict) -> list[int]:
    """The GPU of each transformer block, in layer order."""
    blocks = sorted((int(m.group(1)), gpu) for name, gpu in device_map.items()
                    if (m := re.fullmatch(r"transformer\.h\.(\d+)", name)))
    return [gpu for _, gpu in blocks]


@pytest.mark.parametrize("gpus,free_mib", [(2, 20), (8, 10)])
def test_a_model_too_large_for_one_gpu_is_spread_over_all_of_them_in_whole_blocks(gpus, free_mib):
    model = meta_gpt2()
    needed = model_bytes(model)  # about 27 MiB in float32
    free = {gpu: free_mib * MiB for gpu in range(gpus)}
    assert needed > free[0] * placement.HEADROOM  # no single GPU can hold it
    plan = placement.plan(needed, free, meta_model=model)
    assert plan.gpus == list(range(gpus)) and set(plan.max_memory) == set(range(gpus))  # GPUs only
    assert set(plan.device_map.values()) <= set(range(gpus)) and len(set(plan.device_map.values())) >= 2
    assert not [v for v in plan.device_map.values() if not isinstance(v, int)]  # no "cpu", no "disk"
    order = block_order(plan.device_map)
    assert len(order) == 8 and order == sorted(order)  # layers in order, each block whole on one GPU
    assert plan.devices == [f"cuda:{gpu}" for gpu in sorted(set(plan.device_map.values()))]
    sizes = placement.module_sizes(model)
    for gpu, budget in plan.max_memory.items():
        used = sum(sizes.get(name, 0) for name, where in plan.device_map.items() if where == gpu)
        assert used <= budget


def test_a_model_that_fits_goes_whole_on_the_gpu_with_the_most_free_memory():
    plan = placement.plan(10 * MiB, {0: 8 << 30, 1: 16 << 30, 2: 12 << 30})
    assert plan.gpus == [1] and plan.device_map is None and plan.devices == ["cuda:1"]


def test_accelerate_silently_offloads_to_disk_and_the_plan_refuses_it():
    model = meta_gpt2()
    small = {0: 2 * MiB, 1: 2 * MiB}
    model.tie_weights()
    raw = infer_auto_device_map(model, max_memory=dict(small), no_split_module_classes=list(model._no_split_modules))
    assert "disk" in raw.values()  # accelerate's own answer: no error, part of the model on disk
    with pytest.raises(Offload, match=r"not reloaded on the GPU: \d+ module\(s\) \([\d.]+ MiB\) would be offloaded "
                                      r"to disk \(.*(transformer\.h|lm_head)"):
        placement.plan(model_bytes(model), small, meta_model=model)


def test_a_memory_cap_forces_the_spread_even_on_large_gpus():
    model = meta_gpt2()
    plan = placement.plan(model_bytes(model), {0: 80 << 30, 1: 80 << 30}, cap=20 * MiB, meta_model=model)
    assert len(plan.devices) == 2 and max(plan.max_memory.values()) <= 20 * MiB
    assert placement.parse_bytes("20MiB") == placement.parse_bytes("20m") == 20 * MiB
    assert placement.parse_bytes("1.5G") == 3 << 29 and placement.parse_bytes("zero") is None
    with pytest.raises(Offload, match="exceed"):
        placement.plan(model_bytes(model), {0: 80 << 30, 1: 80 << 30}, cap=1 * MiB)  # no model to map: refused


def test_a_map_with_a_cpu_or_disk_entry_is_refused_naming_the_modules():
    placement.refuse_offload({"transformer.wte": 0, "transformer.h.0": 1})
    with pytest.raises(Offload, match=r"2 module\(s\) would be offloaded to cpu and disk \(transformer\.h\.1, lm_head\)"):
        placement.refuse_offload({"transformer.wte": 0, "transformer.h.1": "cpu", "lm_head": "disk"})


def test_a_model_loaded_with_layers_offloaded_to_disk_is_found_off_the_gpu(built, tmp_path):
    """The load accelerate would do with that map, done for real on the CPU: it succeeds, and the check after
    the load names what is not on a GPU (here every tensor: the CPU ones and the disk-offloaded blocks)."""
    folder = Path(built["package"]) / "artifacts/control-model"
    model = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, offload_folder=str(tmp_path / "offload"),
        device_map={"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu",
                    "transformer.h": "disk", "transformer.ln_f": "cpu", "lm_head": "cpu"})
    found = placement.off_gpu_tensors(model)
    assert any("(disk, by the device map)" in entry for entry in found)
    assert any(entry.startswith("transformer.h.0.") and "(meta)" in entry for entry in found)  # kept on disk
    assert model.hf_device_map["transformer.h"] == "disk"  # accelerate took the map as given, without a word


def test_weight_bytes_read_from_safetensors_headers(built):
    from safetensors import safe_open

    file = Path(built["package"]) / "artifacts/control-model/model.safetensors"
    with safe_open(str(file), framework="pt") as handle:
        names = handle.keys()
        expected = sum(handle.get_tensor(k).numel() * handle.get_tensor(k).element_size() for k in names)
    assert placement.weight_bytes(file) == expected
    assert placement.weight_bytes(file.parent) == expected  # config.json and the rest are not weights


# --- what the report shows: each artifact's devices, host peak beside GPU peak ------------------------------

def test_reports_show_each_artifacts_devices_and_host_beside_gpu_peak_memory():
    import json

    import jsonschema

    from itera_verify.model import ReloadResult
    from itera_verify.report import Report, renderer

    spread_result = ReloadResult("big-model", "transformers", device="cuda:0", ok=True, seconds=12.5,
                                 peak_memory_bytes=3 << 30, devices=["cuda:0", "cuda:1"],
                                 host_peak_memory_bytes=700 << 20, device_peak_memory_bytes=3 << 30)
    cpu_result = ReloadResult("small-model", "transformers", device="cpu", ok=True, seconds=0.4,
                              peak_memory_bytes=300 << 20, devices=["cpu"], host_peak_memory_bytes=300 << 20)
    report = Report(package="pkg/", reloads=[spread_result, cpu_result], reloaded=True, device="cuda")
    document = json.loads(renderer("json")(report, {}))
    big, small = document["reloads"]
    assert big["devices"] == ["cuda:0", "cuda:1"] and big["host_peak_memory_bytes"] == 700 << 20
    assert big["device_peak_memory_bytes"] == 3 << 30
    assert small["devices"] == ["cpu"] and "device_peak_memory_bytes" not in small
    jsonschema.validate(document, json.loads((Path(__file__).resolve().parents[1] / "schemas/report.schema.json")
                                             .read_text()))
    text = renderer("text")(report, {"width": 200})
    assert "cuda:0, cuda:1" in text and "700.0 MiB / 3.0 GiB" in text and "peak memory (host / GPU)" in text
    html = renderer("html")(report, {})
    assert "cuda:0, cuda:1" in html and "700.0 MiB / 3.0 GiB" in html and "Peak memory (host / GPU)" in html


# --- on a real GPU (skipped without CUDA; scripts/gpu-check.sh runs them) ------------------------------------

needs_cuda = pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")


def cuda_reload(package_dir, hf_cache, *only):
    from itera_verify.reload import run_reloads
    from itera_verify.rules import reload as reload_rules
    from itera_verify.runtime.progress import NULL_PROGRESS

    package = context(package_dir, hf_cache=Path(hf_cache))
    package = replace(package, reloads=run_reloads(package, device="cuda", timeout=300, jobs=1, progress=NULL_PROGRESS,
                                  only=set(only) or None))
    return {r.artifact: r for r in package.reloads}, list(reload_rules.check(package))


@pytest.mark.gpu
@needs_cuda
def test_on_the_gpu_weights_go_straight_to_the_device_and_both_peaks_are_recorded(package_dir, hf_cache):
    results, _ = cuda_reload(package_dir, hf_cache, "control-model", "lora-r16-adapter")
    for result in results.values():
        assert result.ok, result.error
        assert result.devices and all(d.startswith("cuda:") for d in result.devices)
        assert result.device_peak_memory_bytes > 0 and result.host_peak_memory_bytes > 0


@pytest.mark.gpu
@needs_cuda
def test_on_the_gpu_a_cap_below_the_model_is_IV504_naming_the_offload(package_dir, hf_cache, monkeypatch):
    monkeypatch.setenv(placement.CAP_VARIABLE, "64KiB")  # far below the tiny model's weights
    results, findings = cuda_reload(package_dir, hf_cache, "control-model")
    result = results["control-model"]
    assert not result.ok and "not reloaded on the GPU" in result.error and "offload" in result.error
    assert [f.code for f in findings if f.artifact == "control-model"] == ["IV504"]


# --- sharing the GPUs: one child per GPU, all of them for a model too large for one -------------------------

def test_the_gpu_pool_gives_each_child_its_own_gpu_and_a_large_model_all_of_them():
    import threading
    import time

    from itera_verify.reload.gpus import GpuPool

    stopping = threading.Event()
    pool = GpuPool([0, 1], stopping)
    first, second = pool.take(False), pool.take(False)
    assert sorted(first + second) == [0, 1]  # two children side by side, one GPU each
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.take(True)))
    waiter.start()
    time.sleep(0.3)
    assert got == []  # the large model waits while any GPU is busy
    pool.give(first)
    time.sleep(0.3)
    assert got == []
    pool.give(second)
    waiter.join(5)
    assert got == [[0, 1]]
    late = []
    stopper = threading.Thread(target=lambda: late.append(pool.take(False)))
    stopper.start()
    stopping.set()  # Ctrl-C: nobody waits for a GPU any longer
    stopper.join(5)
    assert late == [[]]


def test_which_artifacts_need_every_gpu_and_the_gpus_in_cuda_order(monkeypatch):
    from itera_verify.reload.gpus import _visible_order, needs_every_gpu

    free = {0: 40 << 30, 1: 40 << 30}
    assert needs_every_gpu({"weight_bytes": 60 << 30}, free, None)
    assert not needs_every_gpu({"weight_bytes": 20 << 30}, free, None)
    assert needs_every_gpu({"weight_bytes": 20 << 30}, free, 10 << 30)  # the cap makes it too large for one
    assert not needs_every_gpu({"weight_bytes": 60 << 30}, {0: 40 << 30}, None)  # one GPU: nothing to spread over
    rows = [("0", "GPU-aaa", 1), ("1", "GPU-bbb", 2), ("2", "GPU-ccc", 3)]
    assert _visible_order(rows, None) == [1, 2, 3]  # CUDA_VISIBLE_DEVICES unset
    assert _visible_order(rows, "2,0") == [3, 1]
    assert _visible_order(rows, "GPU-bb,7,0") == [2]  # a UUID prefix; CUDA stops at the invalid 7
