"""IV512: a delivered model whose weights are the base's, or another run's: nothing was trained.

Static: the safetensors headers say which weight sets look alike (same tensor names, dtypes and shapes); only
those are compared, tensor by tensor, on digests of their payload bytes (rules/_tensors.py). No torch, no load.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from ..archive.links import real_path
from ..package.jsonread import read_json_file
from ..runtime.hfcache import snapshot_folder
from ..model import Finding, Rule, Severity
from ..format.layouts import CHECKPOINT_FOLDER, TRAINER_STATE
from ..package import RunContext
from ._tensors import FLOATS, Digests, Tensor, WeightSet, all_zero, converted_to, read_weights

RULES = [
    Rule("IV512", Severity.ERROR, "delivered model equals the base or another run's",
         explain=(
             "A delivered model (a transformers-model folder or a safetensors artifact) whose every tensor holds "
             "the same bytes as the base model at its pinned revision in the local Hugging Face cache was not "
             "trained: it is the untrained base under a fine-tuned name, and it reloads and runs like any "
             "model, so nothing else notices. The bases compared are the one the artifact's manifest `base` "
             "names and those the package's adapters name (adapter_config.json, manifest `base`). A model equal "
             "to another run's artifact (its model, or the weights of its checkpoint) is the same model "
             "delivered twice under two runs: at most one of them trained it. A model in another float format "
             "than the one it is compared with (an fp32 base loaded in bf16 and saved untouched) is compared "
             "with that one's values converted as torch converts them (round to nearest even): equal, it holds "
             "nothing the conversion did not, and a fine-tune so short that bf16 rounds every change away is "
             "reported too, since its delivered weights are the base's. Only weight sets whose safetensors "
             "headers agree on every tensor name and shape are compared, and a comparison stops at the first "
             "tensor that differs. "
             "A model or adapter equal to a checkpoint of its own run saved before the run's last checkpoint "
             "(and not the one its trainer_state.json names best_model_checkpoint) is stale: the run trained on, "
             "and what it delivers is not where it ended. Two checkpoints of one run holding the same weights at "
             "different steps mix steps: the later one holds an earlier checkpoint's files. "
             "A LoRA adapter whose every B matrix is still zero (PEFT's "
             "initialisation) and whose other saved modules (modules_to_save) hold nothing but the base's own "
             "values changes nothing: base plus adapter is the base. So does a diffusers LoRA whose every up "
             "matrix is zero (either layout), and a diffusers pipeline whose denoiser (unet, transformer) equals "
             "its manifest base's snapshot, every other component compared equal too, is the base pipeline. "
             "Deliver the weights the run saved at its end (trainer.save_model(...) or "
             "model.save_pretrained(...)), not a copy of the base snapshot or an adapter saved before training."),
         bad="artifacts/control-model/model.safetensors copied from models--org--base/snapshots/3f1c…a5b4/",
         good="artifacts/control-model/ written by trainer.save_model('artifacts/control-model') after training"),
]

MODEL_KINDS = ("transformers-model", "safetensors")
DELIVERED_KINDS = (*MODEL_KINDS, "peft-adapter")
CHECKPOINT = "resume-checkpoint"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
LORA_B = re.compile(r".*\.lora_(?:B|embedding_B)(?:\.[^.]+)?\.weight|.*\.lora_embedding_B(?:\.[^.]+)?")
LORA_TENSOR = re.compile(r".*\.(?:lora_(?:A|B|embedding_A|embedding_B)|lora_magnitude_vector)(?:\.[^.]+)*")
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _package_weights(ctx: RunContext, rel: str) -> tuple[str, list[str]] | None:
    """(the file a finding names, the shards' OS paths) of a safetensors file or of a model folder's weights."""
    if rel.endswith(".safetensors") and ctx.inventory.is_file(rel):
        return rel, [real_path(ctx.documents.path(rel))]
    index = f"{rel}/{WEIGHTS_INDEX}"
    if ctx.inventory.is_file(index):
        value = ctx.documents.json_value(index)
        weight_map = value.get("weight_map") if isinstance(value, dict) else None
        shards = sorted({f"{rel}/{name}" for name in weight_map.values() if isinstance(name, str)}) \
            if isinstance(weight_map, dict) else []
        if not shards or not all(ctx.inventory.is_file(shard) for shard in shards):
            return None  # a shard missing is the reload's IV504
        return index, [real_path(ctx.documents.path(shard)) for shard in shards]
    single = f"{rel}/{WEIGHTS}"
    if ctx.inventory.is_file(single):
        return single, [real_path(ctx.documents.path(single))]
    return None


def _snapshot_weights(snapshot: Path, weights: str = WEIGHTS) -> list[str] | None:
    """The weight files of a model folder saved as `weights` (or sharded by its index), resolved."""
    index = snapshot / f"{weights}.index.json"
    if index.is_file():
        try:
            weight_map = read_json_file(index).get("weight_map")
            names = sorted({n for n in weight_map.values() if isinstance(n, str)})
        except (OSError, ValueError, AttributeError):
            return None
        return [real_path(snapshot / name) for name in names] if names else None
    single = snapshot / weights
    return [real_path(single)] if single.is_file() else None


def _component_weights(ctx: RunContext, folder: str, weights: str) -> list[str] | None:
    """_snapshot_weights for a folder of the package, read through ctx.documents (the reference's folder is in
    the Hugging Face cache, outside the package)."""
    index = f"{folder}/{weights}.index.json"
    if ctx.inventory.is_file(index):
        value = ctx.documents.json_value(index)
        weight_map = value.get("weight_map") if isinstance(value, dict) else None
        names = sorted({n for n in weight_map.values() if isinstance(n, str)}) if isinstance(weight_map, dict) \
            else []
        return [real_path(ctx.documents.path(f"{folder}/{name}")) for name in names] if names else None
    single = f"{folder}/{weights}"
    return [real_path(ctx.documents.path(single))] if ctx.inventory.is_file(single) else None


def _snapshot(cache: Path, name: str, revision: str) -> Path | None:
    return snapshot_folder(cache, name, revision)


def _named_bases(ctx: RunContext) -> list[tuple[str, str]]:
    """(hub id, revision) of every base the package names: manifest `base` entries and adapter_config.json."""
    bases: list[tuple[str, str]] = []
    for artifact in ctx.documents.artifacts():
        base = artifact.get("base")
        if isinstance(base, dict) and _text(base.get("name")) and _text(base.get("revision")):
            bases.append((base["name"], base["revision"]))
        rel = ctx.inventory.normalise_ref(artifact["path"]) if _text(artifact.get("path")) else None
        config = ctx.documents.json_value(f"{rel}/adapter_config.json") if rel else None
        if isinstance(config, dict) and _text(config.get("base_model_name_or_path")) and _text(config.get("revision")):
            bases.append((config["base_model_name_or_path"], config["revision"]))
    return list(dict.fromkeys(bases))


def _base_weight_sets(ctx: RunContext) -> list[WeightSet]:
    cache = ctx.options.hf_cache
    found = []
    for name, revision in _named_bases(ctx):
        snapshot = _snapshot(Path(cache), name, revision)
        paths = _snapshot_weights(snapshot) if snapshot else None
        tensors = read_weights(paths) if paths else None
        if tensors:
            found.append(WeightSet(f"the base {name} at {revision}", str(snapshot), tensors))
    return found


def _artifact_weight_sets(ctx: RunContext) -> list[tuple[bool, WeightSet]]:
    """(delivered as a model, its weights) for every artifact with safetensors model or adapter weights, in
    manifest order; a checkpoint's weights are compared with (and with its run's other checkpoints)."""
    found = []
    for artifact in ctx.documents.artifacts():
        rel = ctx.inventory.normalise_ref(artifact["path"]) if _text(artifact.get("path")) else None
        located = _package_weights(ctx, rel) if rel else None
        if located is None and rel and ctx.inventory.is_file(f"{rel}/{ADAPTER_WEIGHTS}"):
            located = f"{rel}/{ADAPTER_WEIGHTS}", [real_path(ctx.documents.path(f"{rel}/{ADAPTER_WEIGHTS}"))]
        tensors = read_weights(located[1]) if located else None
        if tensors:
            kind = artifact.get("kind")
            found.append((kind in DELIVERED_KINDS,
                          WeightSet(_text(artifact.get("id")) or rel, located[0], tensors,
                                    run=_text(artifact.get("run")), artifact=_text(artifact.get("id")),
                                    step=_checkpoint_step(ctx, artifact, rel) if kind == CHECKPOINT else None)))
    return found


def _checkpoint_step(ctx: RunContext, artifact: dict, rel: str) -> int | None:
    """The step a checkpoint was saved at: the manifest's record of the save (runs[].checkpoints), else its
    trainer_state.json's global_step, else the Trainer's folder name checkpoint-N; None when nothing says."""
    for run in ctx.documents.runs():
        saves = run.get("checkpoints") if isinstance(run, dict) and run.get("id") == artifact.get("run") else None
        for save in saves if isinstance(saves, list) else ():
            if isinstance(save, dict) and save.get("artifact") == artifact.get("id") and _count(save.get("step")):
                return save["step"]
    state = ctx.documents.json_value(f"{rel}/{TRAINER_STATE}") \
        if ctx.inventory.is_file(f"{rel}/{TRAINER_STATE}") else None
    if isinstance(state, dict) and _count(state.get("global_step")):
        return state["global_step"]
    named = CHECKPOINT_FOLDER.fullmatch(rel.rsplit("/", 1)[-1])
    return int(named.group(1)) if named else None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _best_checkpoints(ctx: RunContext) -> set[tuple[str, str]]:
    """(run, folder name) of each checkpoint a run's trainer_state.json names as its best_model_checkpoint: with
    load_best_model_at_end the Trainer delivers that checkpoint's weights, whatever its step."""
    best = set()
    for artifact in ctx.documents.artifacts():
        rel = ctx.inventory.normalise_ref(artifact["path"]) if _text(artifact.get("path")) else None
        state = ctx.documents.json_value(f"{rel}/{TRAINER_STATE}") \
            if rel and ctx.inventory.is_file(f"{rel}/{TRAINER_STATE}") else None
        named = _text(state.get("best_model_checkpoint")) if isinstance(state, dict) else None
        if named and _text(artifact.get("run")):
            best.add((artifact["run"], named.rstrip("/").rsplit("/", 1)[-1]))
    return best


def _untrained_adapters(ctx: RunContext, digests: Digests, bases: list[WeightSet]) -> Iterator[Finding]:
    """A LoRA adapter whose every B matrix is zero and whose other tensors (modules_to_save) are the base's own:
    base + B·A is the base, and the saved modules change nothing either."""
    for artifact in ctx.documents.artifacts():
        rel = ctx.inventory.normalise_ref(artifact["path"]) if _text(artifact.get("path")) else None
        if artifact.get("kind") != "peft-adapter" or not rel or not ctx.inventory.is_file(f"{rel}/{ADAPTER_WEIGHTS}"):
            continue
        tensors = read_weights([real_path(ctx.documents.path(f"{rel}/{ADAPTER_WEIGHTS}"))])
        b_matrices = [tensor for name, tensor in (tensors or {}).items() if LORA_B.fullmatch(name)]
        if not b_matrices or not all(all_zero(tensor) for tensor in b_matrices):
            continue
        saved = {name: tensor for name, tensor in tensors.items() if not LORA_TENSOR.fullmatch(name)}
        base = next((b for b in bases if _modules_equal_base(digests, saved, b)), None) if saved else None
        if saved and base is None:
            continue  # a saved module the base lacks or that differs from it (a head that was trained)
        label = _text(artifact.get("id")) or rel
        modules = (f" and its saved modules ({', '.join(sorted(saved)[:3])}{', …' if len(saved) > 3 else ''}) "
                   f"equal {base.label}'s" if base else "")
        yield Finding("IV512", f"{rel}/{ADAPTER_WEIGHTS}", run=_text(artifact.get("run")),
                      artifact=_text(artifact.get("id")),
                      message=f"every LoRA B matrix of {label} is zero (as PEFT initialises it){modules}: the "
                              "adapter changes nothing, its model is the base; nothing was trained (save the "
                              "adapter after training)")


# diffusers: a LoRA's up matrix in each layout (save_lora_weights, kohya's, PEFT's names), and the tensors that
# are not a module's weights (kohya's alpha); a pipeline's component weights and the denoisers trained in it.
DIFFUSERS_LORA_WEIGHTS = "pytorch_lora_weights.safetensors"
DIFFUSERS_LORA_UP = re.compile(r".*(?:\.lora\.up|\.lora_up|\.lora_B|\.lora_linear_layer\.up)\.weight")
DIFFUSERS_LORA_OTHER = re.compile(r".*\.(?:alpha|lora\.down\.weight|lora_down\.weight|lora_A\.weight|"
                                  r"lora_linear_layer\.down\.weight|dora_scale|lora_magnitude_vector)")
COMPONENT_WEIGHTS = ("diffusion_pytorch_model.safetensors", "model.safetensors")
DENOISERS = ("unet", "transformer", "prior")


def _untrained_diffusers(ctx: RunContext, digests: Digests) -> Iterator[Finding]:
    """A diffusers LoRA whose every up matrix is zero (base + up·down is the base), and a pipeline whose denoiser
    (and every other component compared) holds its manifest base's weights: nothing was trained."""
    cache = None
    for artifact in ctx.documents.artifacts():
        rel = ctx.inventory.normalise_ref(artifact["path"]) if _text(artifact.get("path")) else None
        kind, where = artifact.get("kind"), {"run": _text(artifact.get("run")), "artifact": _text(artifact.get("id"))}
        if not rel:
            continue
        if kind == "diffusers-lora":
            file = rel if rel.endswith(".safetensors") else f"{rel}/{DIFFUSERS_LORA_WEIGHTS}"
            tensors = read_weights([real_path(ctx.documents.path(file))]) \
                if ctx.inventory.is_file(file) else None
            ups = [t for name, t in (tensors or {}).items() if DIFFUSERS_LORA_UP.fullmatch(name)]
            others = [n for n in tensors or {} if not DIFFUSERS_LORA_UP.fullmatch(n)
                      and not DIFFUSERS_LORA_OTHER.fullmatch(n)]
            if ups and not others and all(all_zero(t) for t in ups):
                yield Finding("IV512", file, **where,
                              message=f"every LoRA up matrix of {where['artifact'] or rel} is zero (as PEFT "
                                      "initialises it): the LoRA changes nothing, its pipeline is the base; "
                                      "nothing was trained (save the LoRA after training)")
        elif kind == "diffusers-pipeline" and isinstance(artifact.get("base"), dict):
            name, revision = _text(artifact["base"].get("name")), _text(artifact["base"].get("revision"))
            cache = cache or ctx.options.hf_cache
            snapshot = _snapshot(cache, name, revision) if name and revision else None
            if snapshot is not None:
                yield from _pipeline_as_base(ctx, digests, rel, snapshot, f"the base {name} at {revision}", where)


def _pipeline_as_base(ctx: RunContext, digests: Digests, rel: str, snapshot: Path, label: str,
                      where: dict) -> Iterator[Finding]:
    """IV512 when the pipeline's denoiser equals the base's and no component compared differs from the base's."""
    equal, differ = [], []
    for component in sorted(ctx.inventory.dirs):
        sub = component[len(rel) + 1:] if component.startswith(rel + "/") else None
        if not sub or "/" in sub:
            continue
        for weights in COMPONENT_WEIGHTS:
            mine = _component_weights(ctx, component, weights)
            theirs = _snapshot_weights(snapshot / sub, weights) if mine else None
            if mine and theirs:
                model, original = read_weights(mine), read_weights(theirs)
                if model and original:
                    same = _match(digests, WeightSet(sub, component, model), [WeightSet(label, "", original)])
                    (equal if same is not None else differ).append(sub)
                break
    denoiser = next((sub for sub in equal if sub in DENOISERS), None)
    if denoiser and not differ:
        others = [sub for sub in equal if sub != denoiser]
        yield Finding("IV512", f"{rel}/{denoiser}", **where,
                      message=f"the {denoiser} of {where['artifact'] or rel}"
                              + (f" (and its {', '.join(others)})" if others else "")
                              + f" equals that of {label} in the hub cache: nothing was trained (save the "
                                "pipeline after training)")


# PEFT saves a modules_to_save copy under the base model's name of the module, behind its own prefix.
PEFT_PREFIX = "base_model.model."


def _modules_equal_base(digests: Digests, saved: dict[str, Tensor], base: WeightSet) -> bool:
    """Every saved module tensor equals the base's tensor of that name (byte for byte, or its values converted)."""
    for name, tensor in sorted(saved.items(), key=lambda item: (item[1].size, item[0])):
        original = base.tensors.get(name.removeprefix(PEFT_PREFIX))
        if original is None or original.shape != tensor.shape:
            return False
        if original.dtype != tensor.dtype and not {original.dtype, tensor.dtype} <= FLOATS.keys():
            return False
        if digests.of(tensor) != digests.of(original, tensor.dtype):
            return False
    return True


DTYPE_WORDS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _match(digests: Digests, model: WeightSet, candidates: list[WeightSet]) -> tuple[WeightSet, str] | None:
    """The first candidate whose tensors `model` holds: byte for byte ("" as the second item), or converted to
    the one float format `model` is in (its name)."""
    for candidate in candidates:
        if digests.equal(model, candidate):
            return candidate, ""
    for candidate in candidates:
        target = converted_to(model, candidate)
        if target and digests.equal(model, candidate, converted=True):
            return candidate, DTYPE_WORDS[target]
    return None


def _as(dtype: str) -> str:
    return f" converted to {dtype}" if dtype else ""


def check(ctx: RunContext) -> Iterator[Finding]:
    digests = Digests()
    bases = _base_weight_sets(ctx)
    untrained = list(_untrained_adapters(ctx, digests, bases))
    yield from untrained
    yield from _untrained_diffusers(ctx, digests)
    artifacts = _artifact_weight_sets(ctx)
    yield from _repeated_checkpoints(digests, artifacts)
    if not any(delivered for delivered, _ in artifacts):
        return
    best = _best_checkpoints(ctx)
    for position, (delivered, model) in enumerate(artifacts):
        if not delivered or model.artifact in {f.artifact for f in untrained}:
            continue
        where = dict(run=model.run, artifact=model.artifact)
        found = _match(digests, model, bases)
        if found is not None:
            base, dtype = found
            yield Finding("IV512", model.where, **where,
                          message=f"every tensor of {model.label} equals {base.label} in the hub cache"
                                  f"{_as(dtype)}: nothing was trained (deliver the weights the run saved"
                                  + (f"; loading the base in {dtype} and saving it changes nothing else)"
                                     if dtype else ")"))
            continue
        stale = _stale(digests, model, artifacts, best)
        if stale is not None:
            yield stale
            continue
        # Another run's artifact: a model pair is reported once, on the later one; a checkpoint always.
        others = [other for index, (is_model, other) in enumerate(artifacts)
                  if other.run and model.run and other.run != model.run and (not is_model or index < position)]
        found = _match(digests, model, others)
        if found is not None:
            twin, dtype = found
            yield Finding("IV512", model.where, **where,
                          message=f"every tensor of {model.label} (run {model.run!r}) equals {twin.label} of run "
                                  f"{twin.run!r} ({twin.where}){_as(dtype)}: one model delivered for two runs")


def _own_checkpoints(model: WeightSet, artifacts: list[tuple[bool, WeightSet]]) -> list[WeightSet]:
    """The checkpoints of `model`'s run whose step is known, earliest first."""
    found = [other for delivered, other in artifacts
             if not delivered and other is not model and other.run == model.run and other.step is not None]
    return sorted(found, key=lambda c: c.step)


def _stale(digests: Digests, model: WeightSet, artifacts: list[tuple[bool, WeightSet]],
           best: set[tuple[str, str]]) -> Finding | None:
    """A delivered model equal to a checkpoint of its own run before the run's last: the run trained on, and
    what it delivers is not where it ended (its last checkpoint, and the run's best under load_best_model_at_end,
    are what a Trainer delivers)."""
    checkpoints = _own_checkpoints(model, artifacts) if model.run else []
    if not checkpoints:
        return None
    last = checkpoints[-1].step
    earlier = [c for c in checkpoints if c.step < last and (model.run, _folder(c.where)) not in best]
    found = _match(digests, model, earlier)
    if found is None:
        return None
    twin, dtype = found
    return Finding("IV512", model.where, run=model.run, artifact=model.artifact,
                   message=f"every tensor of {model.label} equals {twin.label}{_as(dtype)}, the checkpoint of run "
                           f"{model.run!r} at step {twin.step} ({twin.where}), though the run went on to step "
                           f"{last} (its last checkpoint): the delivered weights are stale; deliver those the run "
                           "saved at its end")


def _repeated_checkpoints(digests: Digests, artifacts: list[tuple[bool, WeightSet]]) -> Iterator[Finding]:
    """Two checkpoints of one run holding the same weights at different steps: the later one is not the state
    at its step (files of an earlier checkpoint copied into it); reported on the later one."""
    checkpoints = [ws for delivered, ws in artifacts if not delivered and ws.run and ws.step is not None]
    for later in checkpoints:
        earlier = [c for c in checkpoints if c.run == later.run and c.step < later.step]
        found = _match(digests, later, earlier)
        if found is not None:
            twin, dtype = found
            yield Finding("IV512", later.where, run=later.run, artifact=later.artifact,
                          message=f"{later.label} (run {later.run!r}, step {later.step}) holds the same weights "
                                  f"as {twin.label} at step {twin.step} ({twin.where}){_as(dtype)}: a checkpoint "
                                  f"that mixes steps (an earlier checkpoint's files copied into it); a resume from "
                                  f"it would restart from step {twin.step}'s weights")


def _folder(where: str) -> str:
    """The checkpoint folder a weights file lies in (its name is what best_model_checkpoint ends with)."""
    parts = where.rsplit("/", 2)
    return parts[-2] if len(parts) > 1 else parts[-1]
