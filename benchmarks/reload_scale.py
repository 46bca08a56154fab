"""Issue 17's two side-by-side benchmarks, run by reload_bench.py (`--sections phase,midsize`).

phase    the example campaign's whole reload phase (run_reloads over every artifact: the zygote's start, then one
         forked child per artifact with every check and the forward pass; and the same with --isolation spawn)
         against ONE plain process doing the same loads one after the other (one import, then bare
         from_pretrained / PeftModel.from_pretrained / torch.load), its whole wall time. Target: tool/plain <= 1.25.
midsize  a model built here from a config with random weights (Llama shape, about 0.47 B parameters, bf16,
         sharded safetensors, about 0.94 GB) reloaded by the tool (run_reloads, one artifact) against a bare
         `from_pretrained` of the same folder in a fresh process, in the same run. Targets: time ratio <= 1.15,
         host peak memory <= 1.3 x the model's bytes. `--midsize-layers 96` runs the same with 4x the layers
         (1.7 B parameters, 3.3 GB), where the libraries' share of the host peak is a quarter as large.
"""
from __future__ import annotations

import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASE_ARTIFACTS = ("control-model", "control-resume", "lora-r16-adapter", "lora-r16-resume")
MIDSIZE = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
               num_key_value_heads=16, vocab_size=32000, max_position_embeddings=512, tie_word_embeddings=False)
MiB = 1 << 20


def build_midsize(folder: Path, layers: int = MIDSIZE["num_hidden_layers"]) -> int:
    """A Llama-shaped model with random bf16 weights saved as ~250 MB safetensors shards; its tensor bytes."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**{**MIDSIZE, "num_hidden_layers": layers}, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="250MB", safe_serialization=True)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def tool_reload(package: Path, hf_cache: Path, device: str, only: set[str] | None, isolation: str) -> dict:
    """run_reloads as the tool runs it; its wall time and what each child reported."""
    from itera_verify.flows.config import Config, settle
    from itera_verify.package import RunContext, discover
    from itera_verify.reload import run_reloads
    from itera_verify.runtime.progress import NULL_PROGRESS

    target = RunContext(discover(package), settle(Config(), hf_cache=hf_cache))
    started = time.perf_counter()
    results = run_reloads(target, device=device, timeout=900, jobs=1, progress=NULL_PROGRESS, only=only,
                          isolation=isolation)
    wall = time.perf_counter() - started
    failed = [f"{r.artifact}: {r.error}" for r in results if not r.ok]
    if failed:
        raise SystemExit(f"the tool's reload failed: {failed}")
    return {"wall": wall, "results": results}


def plain_main(mode: str, package: Path, hf_cache: Path, device: str) -> None:
    """A fresh process (`--plain MODE`): one import, then the bare loads; prints its load time and peak RSS."""
    import torch  # noqa: F401 - the import is part of what a plain process pays
    import transformers.modeling_utils  # noqa: F401
    import peft  # noqa: F401

    from bare_loads import bare_load

    started = time.perf_counter()
    if mode == "phase":
        for artifact in PHASE_ARTIFACTS:
            bare_load(artifact, package, hf_cache, device)
    else:  # midsize: the folder holding the model
        from transformers import AutoModelForCausalLM

        from itera_verify.reload.child import rss_now_bytes

        rss_before = rss_now_bytes()  # the libraries' share, as the tool's child reports it before its load
        model = AutoModelForCausalLM.from_pretrained(package, local_files_only=True, dtype=torch.bfloat16,
                                                     device_map={"": device})
        model.eval()
        loaded = time.perf_counter()
        peak_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        # Not part of the bare load: one pass over every weight (from_pretrained maps the files and reads
        # nothing), what any proof that the weights are there and finite must pay at least.
        for parameter in model.parameters():
            parameter.sum(dtype=torch.float32)
        touch = time.perf_counter() - loaded
        print(json.dumps({"load_seconds": loaded - started, "touch_seconds": touch, "peak_rss_bytes": peak_loaded,
                          "rss_before_load_bytes": rss_before,
                          "peak_rss_touched": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
        return
    print(json.dumps({"load_seconds": time.perf_counter() - started,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def plain_process(mode: str, target: Path, hf_cache: Path, device: str) -> dict:
    command = [sys.executable, str(Path(__file__).with_name("reload_bench.py")), "--plain", mode, "--package",
               str(target), "--hf-cache", str(hf_cache), "--device", device]
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return {"wall": time.perf_counter() - started, **json.loads(done.stdout.strip().splitlines()[-1])}


def phase_section(package: Path, hf_cache: Path, device: str, repeat: int) -> list[str]:
    rows = []
    for _ in range(repeat):  # interleaved: a busy moment of the shared machine spreads over every column
        plain = plain_process("phase", package, hf_cache, device)
        forked = tool_reload(package, hf_cache, device, None, "auto")
        spawned = tool_reload(package, hf_cache, device, None, "spawn")
        rows.append({"plain": plain["wall"], "plain load": plain["load_seconds"], "fork": forked["wall"],
                     "spawn": spawned["wall"],
                     "zygote import": forked["results"][0].facts.get("zygote_import_seconds") or 0.0})
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    return ["== the example campaign's whole reload phase (4 artifacts), one after the other (--jobs 1)",
            f"median of {repeat} interleaved run(s); seconds",
            f"{'plain process (1 import + 4 bare loads), whole wall':<58}{med['plain']:>8.2f}"
            f"   (its loads alone: {med['plain load']:.2f})",
            f"{'itera-verify, zygote + forked children (default)':<58}{med['fork']:>8.2f}"
            f"   (zygote imports: {med['zygote import']:.2f})",
            f"{'itera-verify, --isolation spawn (one interpreter each)':<58}{med['spawn']:>8.2f}",
            f"ratio fork / plain: {med['fork'] / med['plain']:.2f} (target <= 1.25); "
            f"spawn / plain: {med['spawn'] / med['plain']:.2f}",
            "per run (plain, fork, spawn): " + "; ".join(f"{r['plain']:.2f}, {r['fork']:.2f}, {r['spawn']:.2f}"
                                                          for r in rows), ""]


def midsize_package(package: Path, work: Path, layers: int) -> tuple[Path, int]:
    """A copy of the example package whose control-model is the mid-size model (reload.json: bf16)."""
    target = work / ("midsize-package" if layers == MIDSIZE["num_hidden_layers"] else f"midsize-{layers}-package")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(package, target, symlinks=True)
    folder = target / "artifacts" / "control-model"
    shutil.rmtree(folder)
    model_bytes = build_midsize(folder, layers)
    spec = json.loads((target / "reload.json").read_text())
    spec["artifacts"]["control-model"].update({"dtype": "bfloat16", "class": "AutoModelForCausalLM"})
    (target / "reload.json").write_text(json.dumps(spec, indent=2))
    return target, model_bytes


def midsize_section(package: Path, hf_cache: Path, device: str, repeat: int, work: Path,
                    layers: int = MIDSIZE["num_hidden_layers"]) -> list[str]:
    target, model_bytes = midsize_package(package, work, layers)
    folder = target / "artifacts" / "control-model"
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    rows = []
    for _ in range(repeat):
        bare = plain_process("midsize", folder, hf_cache, device)
        tool = tool_reload(target, hf_cache, device, {"control-model"}, "auto")
        (result,) = tool["results"]
        rows.append({"bare wall": bare["wall"] - bare["touch_seconds"], "bare load": bare["load_seconds"],
                     "bare touch": bare["touch_seconds"], "bare rss": bare["peak_rss_bytes"],
                     "bare rss touched": bare["peak_rss_touched"], "bare rss before": bare["rss_before_load_bytes"],
                     "tool wall": tool["wall"], "tool child": result.seconds,
                     "tool load": result.facts.get("load_seconds") or 0.0,
                     "tool rss": result.host_peak_memory_bytes or 0,
                     "tool rss before": result.facts.get("host_rss_before_load_bytes") or 0,
                     "zygote import": result.facts.get("zygote_import_seconds") or 0.0})
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    return [f"== mid-size model: Llama shape {layers} layers x {MIDSIZE['hidden_size']}, "
            f"{model_bytes / 2 / 1e9:.3f} B parameters, bf16, {model_bytes / MiB:.0f} MiB in {len(shards)} "
            "safetensors shards, random weights", f"median of {repeat} interleaved run(s)",
            f"{'':<44}{'wall s':>8}{'load s':>8}{'host peak MiB':>15}",
            f"{'bare from_pretrained, fresh process':<44}{med['bare wall']:>8.2f}{med['bare load']:>8.2f}"
            f"{med['bare rss'] / MiB:>15.0f}",
            f"{'itera-verify (zygote + forked child)':<44}{med['tool wall']:>8.2f}{med['tool load']:>8.2f}"
            f"{med['tool rss'] / MiB:>15.0f}",
            f"  the tool's child alone (fork to result, every check, forward pass): {med['tool child']:.2f} s; "
            f"zygote imports {med['zygote import']:.2f} s",
            f"time ratio tool / bare (whole walls): {med['tool wall'] / med['bare wall']:.2f} (target <= 1.15); "
            f"child / bare load: {med['tool child'] / med['bare load']:.2f}",
            f"  the bare load reads no weight (the shards are mapped); one pass over every weight after it took "
            f"{med['bare touch']:.2f} s more (not in its wall above); tool / (bare + that pass): "
            f"{med['tool wall'] / (med['bare wall'] + med['bare touch']):.2f}",
            f"host peak / model bytes (target <= 1.3), counting what the load adds to the process's memory before "
            f"it (the libraries: {med['tool rss before'] / MiB:.0f} MiB in the tool's child, shared with its zygote; "
            f"{med['bare rss before'] / MiB:.0f} MiB in the bare process): tool "
            f"{(med['tool rss'] - med['tool rss before']) / model_bytes:.2f}, bare "
            f"{(med['bare rss'] - med['bare rss before']) / model_bytes:.2f}, bare after its pass over the weights "
            f"{(med['bare rss touched'] - med['bare rss before']) / model_bytes:.2f}",
            f"  whole resident peaks / model bytes, libraries included: tool {med['tool rss'] / model_bytes:.2f}, "
            f"bare {med['bare rss'] / model_bytes:.2f}, bare after its pass {med['bare rss touched'] / model_bytes:.2f}"
            f" (on the CPU the weights live in host memory and the forward pass makes every one resident; the "
            f"tool's libraries alone are {med['tool rss before'] / model_bytes:.2f}x this model's bytes)",
            ""]
