"""IV501–IV503, IV510, IV511: what can be judged about artifacts without loading them."""
from __future__ import annotations

import re
from typing import Iterator

from ..format import loaders as loader_table
from ..format.names import HUB_ID, PICKLE_SUFFIXES
from ..format.artifact_kinds import Identity
from ..model import Finding, Rule, Severity
from ..package import MANIFEST, RELOAD, RunContext, pointer_of
from ..package.artifact_identity import in_package
from ..package.template import is_placeholder
from ..format.names import PINNED_REVISION

RULES = [
    Rule("IV501", Severity.ERROR, "adapter base revision not pinned",
         explain=(
             "An adapter is only half a model: the reviewer must load exactly the base it was trained on. A branch "
             "or tag such as `main` moves; only a 40-hex commit pins the base. Give the commit both in the "
             "manifest's artifact `base.revision` and in adapter_config.json's `revision`. PEFT writes that "
             "field only when it is told the commit: `get_peft_model(model, config, revision=SHA)` (or "
             "`LoraConfig(..., revision=SHA)`); loading the base with `from_pretrained(..., revision=SHA)` "
             "does not put it there (the loaded commit is in `model.config._commit_hash` where transformers "
             "records it). For an adapter already saved, write the commit into adapter_config.json."),
         bad='"base": {"name": "org/base-model", "revision": "main"}',
         good='"base": {"name": "org/base-model", "revision": "3f1c2a9e0b7d4c6f8a1e2d3c4b5a69788796a5b4"}'),
    Rule("IV502", Severity.ERROR, "adapter base is a local path",
         explain=(
             "A base given as a path on the training machine (`/workspace/base`, `./models/base`) cannot be "
             "found by anyone else. Name the base by its hub id at a pinned revision, in the manifest and in "
             "adapter_config.json's `base_model_name_or_path`."),
         bad='"base_model_name_or_path": "/workspace/models/base-model"',
         good='"base_model_name_or_path": "org/base-model"'),
    Rule("IV503", Severity.ERROR, "manifest and adapter_config.json disagree on the base",
         explain=(
             "PEFT loads the base named in adapter_config.json, and never checks it against anything. When the "
             "manifest names another base or revision, one of them is wrong and the reload proves the other "
             "one. Make both name the same hub id and the same commit."),
         bad='manifest: "revision": "3f1c…a5b4"   adapter_config.json: "revision": "9e8d…0c1b"',
         good='manifest: "revision": "3f1c…a5b4"   adapter_config.json: "revision": "3f1c…a5b4"'),
    Rule("IV510", Severity.ERROR, "artifact has no fitting reload entry",
         explain=(
             "reload.json tells the reviewer (and this tool) how to reload each artifact. Every artifact of the "
             f"manifest needs an entry whose loader fits its kind: {loader_table.fitting_in_words()}. The loader "
             "must also prove what the files are: a folder with model_index.json is a diffusers pipeline, one "
             "with modules.json a sentence-transformers model, a config.json with `architecture` a timm model, "
             "LoRA tensors in the diffusers or kohya layout a diffusers-lora, a .gguf or .onnx file its own "
             "artifact. A loader that cannot prove them would fail on the folder's layout, or pass on a weaker "
             "check (bare tensors, one module of several): nothing is reloaded, and the message names the kind, "
             "the loader and the reload.json entry to write."),
         bad='{"artifacts": {"sd-pipeline": {"loader": "safetensors"}}}   # a folder with model_index.json',
         good='{"artifacts": {"sd-pipeline": {"loader": "diffusers"}}}   # manifest kind "diffusers-pipeline"'),
    Rule("IV511", Severity.WARNING, "model weights stored as a pickle",
         explain=(
             "Pickled weights (`pytorch_model.bin`, `adapter_model.bin`, a .pt state dict) can carry code and "
             "need a scan before every load; safetensors cannot. Save model weights with "
             "`save_pretrained(..., safe_serialization=True)` or `safetensors.torch.save_file`. Optimizer, "
             "scheduler, RNG and torch-resume files are pickles by nature and are not concerned."),
         bad="artifacts/control-model/pytorch_model.bin",
         good="artifacts/control-model/model.safetensors"),
]

PINNED = PINNED_REVISION
PICKLE_WEIGHTS = re.compile(r"(pytorch_model.*|adapter_model)\.bin")
# accelerate's save_fsdp_model writes these for a resume whatever the user asks (no safetensors option), beside
# the model.safetensors the Trainer saves: resume files, not the delivered weights.
FSDP_RESUME_WEIGHTS = re.compile(r"pytorch_model_fsdp(_\d+)?(_rank\d+)?\.bin")
NOT_WEIGHTS = re.compile(r"(training_args\.bin|optimizer.*\.pt|scheduler.*\.pt|scaler.*\.pt|rng_state.*\.pth)")


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _is_local_path(name: str) -> bool:
    return name.startswith(("/", ".", "~", "\\")) or "\\" in name or (len(name) > 1 and name[1] == ":") \
        or not HUB_ID.fullmatch(name)


def _not_a_hub_id(name: str) -> str:
    """IV502's message: a template placeholder is not filled in yet, which is not the same as a local path."""
    if is_placeholder(name):
        return f"base {name!r} is still a template placeholder: give the base's hub id (org/name)"
    return f"base {name!r} is a local path, not a hub id"


def _artifact_path(ctx: RunContext, artifact: dict) -> str | None:
    path = _text(artifact.get("path"))
    return ctx.inventory.normalise_ref(path) if path else None


def _adapter_config(ctx: RunContext, path: str | None) -> tuple[str, dict] | None:
    if not path:
        return None
    rel = f"{path}/adapter_config.json"
    value = ctx.documents.json_value(rel)
    return (rel, value) if isinstance(value, dict) else None


def _base_findings(ctx: RunContext, index: int, artifact: dict) -> Iterator[Finding]:
    """IV501–IV503 for one artifact: its manifest `base` and its adapter_config.json, when it has them."""
    where = {"run": _text(artifact.get("run")), "artifact": _text(artifact.get("id"))}
    adapter = _adapter_config(ctx, _artifact_path(ctx, artifact))
    base = artifact.get("base")
    is_adapter = artifact.get("kind") == "peft-adapter"
    if not is_adapter and adapter is None and base is None:
        return
    name = revision = None
    if isinstance(base, dict):
        name, revision = _text(base.get("name")), _text(base.get("revision"))
    if is_adapter or base is not None:
        pointer = pointer_of(["artifacts", index, "base", "revision"])
        if revision is None or not PINNED.fullmatch(revision):
            shown = "no base revision" if revision is None else f"base revision {revision!r} is not a 40-hex commit"
            yield Finding("IV501", MANIFEST, pointer=pointer, message=f"{shown}: the base is not pinned", **where)
        if name and _is_local_path(name):
            yield Finding("IV502", MANIFEST, pointer=pointer_of(["artifacts", index, "base", "name"]),
                          message=_not_a_hub_id(name), **where)
    if adapter is None:
        return
    rel, config = adapter
    adapter_name, adapter_revision = _text(config.get("base_model_name_or_path")), _text(config.get("revision"))
    if adapter_revision is None or not PINNED.fullmatch(adapter_revision):
        shown = "no `revision`" if adapter_revision is None else f"revision {adapter_revision!r} is not a 40-hex commit"
        yield Finding("IV501", rel, pointer="/revision",
                      message=f"{shown}: PEFT will load whatever the base's default branch holds; pass the "
                              "base's commit to get_peft_model(model, config, revision=SHA) (loading the base "
                              "with revision= does not record it) or write it into adapter_config.json", **where)
    if adapter_name and _is_local_path(adapter_name):
        yield Finding("IV502", rel, pointer="/base_model_name_or_path", message=_not_a_hub_id(adapter_name),
                      **where)
    if revision and adapter_revision and revision != adapter_revision:
        yield Finding("IV503", rel, pointer="/revision",
                      message=f"adapter_config.json pins {adapter_revision}, the manifest {revision}; "
                              "the reload uses adapter_config.json's", **where)
    if name and adapter_name and name != adapter_name:
        yield Finding("IV503", rel, pointer="/base_model_name_or_path",
                      message=f"adapter_config.json names base {adapter_name!r}, the manifest {name!r}", **where)


def _reload_findings(ctx: RunContext, artifact: dict, entries: dict) -> Iterator[Finding]:
    """IV510 for one artifact: an entry exists and its loader fits the artifact's kind and shape."""
    artifact_id, kind = _text(artifact.get("id")), _text(artifact.get("kind"))
    if artifact_id is None:
        return
    where = {"run": _text(artifact.get("run")), "artifact": artifact_id}
    entry = entries.get(artifact_id)
    pointer = pointer_of(["artifacts", artifact_id])
    if not isinstance(entry, dict):
        yield Finding("IV510", RELOAD, pointer=pointer,
                      message=f"artifact {artifact_id!r} has no entry: nobody knows how to reload it", **where)
        return
    loader = _text(entry.get("loader"))
    fitting = loader_table.fitting(kind or "")
    path = _artifact_path(ctx, artifact)
    identity = in_package(ctx, path) if loader and path and ctx.inventory.exists(path) else None
    if loader is None:
        yield Finding("IV510", RELOAD, pointer=pointer, message=f"entry for {artifact_id!r} names no loader",
                      **where)
    elif identity is not None and not identity.proven_by(loader):
        yield Finding("IV510", RELOAD, pointer=pointer + "/loader",
                      message=declared_wrong(path, artifact, loader, identity), **where)
    elif fitting is not None and loader not in fitting:
        if identity is not None and identity.kind != kind and loader in (loader_table.fitting(identity.kind) or ()):
            message = (f"{path} is {identity.what}, which loader {loader!r} reloads, but the manifest's kind is "
                       f"{kind!r}: declare kind {identity.kind!r}")
        else:
            message = f"loader {loader!r} does not fit a {kind} artifact (use {' or '.join(sorted(fitting))})"
        yield Finding("IV510", RELOAD, pointer=pointer + "/loader", message=message, **where)
    elif fitting is not None:
        yield from _shape_finding(ctx, artifact, loader, pointer, where)
    if identity is not None and identity.proven_by(loader or ""):
        yield from _unread_findings(ctx, path, loader, identity, pointer, where)


# What a declared loader does with files it cannot prove, in IV510's words.
WEAKER = {"safetensors": "it would check bare tensors and run no forward pass",
          "transformers": "from_pretrained would load one part of it, or fail on a layout it does not know",
          "peft": "it needs adapter_config.json and a PEFT base"}


def declared_wrong(path: str, artifact: dict, loader: str, identity: Identity) -> str:
    """IV510's message for a declaration that cannot prove what the files are: what they are, the kind and the
    reload.json entry to write (and, for a LoRA, the manifest's base it needs)."""
    artifact_id = artifact.get("id")
    why = WEAKER.get(loader, "it cannot load these files")
    fixes = [f'kind "{identity.kind}"' if artifact.get("kind") != identity.kind else "",
             f'path "{identity.path}"' if identity.path else "",
             'base {"name": ORG/PIPELINE, "revision": 40-hex commit}' if identity.kind == "diffusers-lora"
             and not isinstance(artifact.get("base"), dict) else ""]
    manifest = ", ".join(f for f in fixes if f)
    return (f"{path} is {identity.what}: loader {loader!r} cannot prove it ({why}); write reload.json "
            f'"{artifact_id}": {{"loader": "{identity.loader}"}}' + (f" and in the manifest {manifest}" if manifest
                                                                     else "") + "; nothing was reloaded")


def _unread_findings(ctx: RunContext, path: str, loader: str, identity: Identity, pointer: str,
                     where: dict) -> Iterator[Finding]:
    """Files inside the artifact its loader never reads (a .gguf beside a model's weights), unless another
    artifact of the manifest declares them."""
    declared = {_artifact_path(ctx, a) for a in ctx.documents.artifacts()}
    for name in identity.unread:
        rel = f"{path}/{name}"
        if rel in declared:
            continue
        kind = "gguf" if name.lower().endswith(".gguf") else "onnx"
        yield Finding("IV510", rel,
                      message=f"{path} holds {name}, which loader {loader!r} does not read: nothing proves it; "
                              f'declare it as its own artifact (kind "{kind}", path "{rel}", reload.json '
                              f'{{"loader": "{kind}"}})', **where)


def _shape_finding(ctx: RunContext, artifact: dict, loader: str, pointer: str, where: dict) -> Iterator[Finding]:
    path = _artifact_path(ctx, artifact)
    if not path or not ctx.inventory.exists(path):
        return  # IV106 / IV205 report it
    is_folder = path in ctx.inventory.dirs
    row = loader_table.LOADERS.get(loader)
    if row is not None and row.shape == loader_table.FOLDER and not is_folder:
        yield Finding("IV510", RELOAD, pointer=pointer + "/loader",
                      message=f"loader {loader!r} needs a folder, {path} is a file", **where)
    elif row is not None and row.shape == loader_table.FILE and is_folder:
        yield Finding("IV510", RELOAD, pointer=pointer + "/loader",
                      message=f"loader {loader!r} needs {row.file_form}, {path} is a folder", **where)


def _pickled_weights(ctx: RunContext, artifact: dict) -> list[str]:
    """Model-weight files stored as pickles inside one artifact (docs/format.md: never optimizer/RNG/resume files)."""
    path = _artifact_path(ctx, artifact)
    if not path or artifact.get("kind") not in ("safetensors", "transformers-model", "peft-adapter",
                                                 "resume-checkpoint", "diffusers-pipeline", "diffusers-lora",
                                                 "timm-model", "sentence-transformers-model"):
        return []
    whole_artifact_is_weights = artifact.get("kind") != "resume-checkpoint"
    found = []
    for rel in ctx.inventory.files_under(path):
        name = rel.rsplit("/", 1)[-1]
        if PICKLE_WEIGHTS.fullmatch(name) and not (artifact.get("kind") == "resume-checkpoint"
                                                   and FSDP_RESUME_WEIGHTS.fullmatch(name)):
            found.append(rel)
        elif whole_artifact_is_weights and name.lower().endswith(PICKLE_SUFFIXES) and not NOT_WEIGHTS.fullmatch(name):
            found.append(rel)
    return found


def check(ctx: RunContext) -> Iterator[Finding]:
    spec_entries = ctx.documents.reload_spec.get("artifacts")
    listed = ctx.documents.manifest.get("artifacts")
    for index, artifact in enumerate(listed if isinstance(listed, list) else []):
        if not isinstance(artifact, dict):
            continue
        yield from _base_findings(ctx, index, artifact)
        if isinstance(spec_entries, dict):  # a missing or malformed reload.json is IV101/IV104/IV105
            yield from _reload_findings(ctx, artifact, spec_entries)
        for rel in _pickled_weights(ctx, artifact):
            yield Finding("IV511", rel, run=_text(artifact.get("run")), artifact=_text(artifact.get("id")),
                          message="model weights stored as a pickle; save them as safetensors")
