"""IV514–IV515: what the package declares against what its artifacts record about themselves.

Static (headers and small documents only): the Trainer's training_args.bin is read from its pickle opcodes, never
unpickled; the weights from their safetensors headers. Which facts, which keys, which records and how they
compare is format/facts.py's table; reading an artifact's records is package/records.py's.
"""
from __future__ import annotations

from typing import Iterator

from ..format import facts as table
from ..model import Finding, Rule, Severity
from ..package import MANIFEST, RunContext, pointer_of
from ..package.records import read_records, read_weights
from ._records import ArtifactFolder, PackageFolder, artifact_folders, bounded_json, run_params

RULES = [
    Rule("IV514", Severity.ERROR, "a declared fact disagrees with the artifact's own record",
         explain="A Hugging Face run leaves its own record of itself: the Trainer pickles its TrainingArguments "
                 "into training_args.bin (learning rate, seed, max_steps, batch size, fp16/bf16, ...) and writes "
                 "trainer_state.json (global_step, max_steps, logging and save intervals); PEFT writes "
                 "adapter_config.json (r, lora_alpha, target_modules, the base and its revision); a checkpoint's "
                 "weights are stored in the precision the run trained in. A params file that says otherwise was "
                 "written for another run than the one that made the artifact (a stale copy, an edited "
                 "configuration, a script's default): the results belong to a configuration nobody can see. So is "
                 "a manifest that records a checkpoint at another step than its trainer_state.json and its "
                 "folder name. Each fact, the params keys that declare it and the records compared are listed in "
                 "docs/format.md (Declared facts); training_args.bin is read from its pickle opcodes, never "
                 "unpickled. Write the params the run used (the recorder's callbacks do), or, when the run used "
                 "other values than planned, record it as a new run.",
         bad='params/lora-r16.json: {"lora_r": 16, "learning_rate": 0.001}   '
             'artifacts/lora-r16/adapter_config.json: {"r": 8}',
         good='params/lora-r16.json: {"lora_r": 8, ...}   adapter_config.json: {"r": 8, ...}', since="0.2.0"),
    Rule("IV515", Severity.ERROR, "config.json declares another dtype than its weights are stored in",
         explain="config.json's `dtype` (`torch_dtype` before transformers 5) says which float format the "
                 "weights are in; loaders that trust it (vLLM, sglang, `dtype=\"auto\"`) allocate and cast "
                 "accordingly. Weights converted after saving (a bf16 copy of an fp32 model) or a config copied "
                 "from another save leave a model whose every file loads while the config describes another "
                 "model: it is compared with the float format most of the weights' elements are stored in, "
                 "read from the safetensors headers alone. Save the model and its config together "
                 "(`model.to(dtype).save_pretrained(path)` writes both).",
         bad='config.json: {"dtype": "bfloat16"}   model.safetensors: every float tensor F32',
         good='config.json: {"dtype": "float32"}   model.safetensors: every float tensor F32', since="0.2.0"),
]

CHECKPOINT = "resume-checkpoint"


def check(ctx: RunContext) -> Iterator[Finding]:
    if not ctx.documents.manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    folders = artifact_folders(ctx)
    records = {folder.rel: read_records(PackageFolder(ctx, folder.rel), checkpoint=folder.kind == CHECKPOINT)
               for folder in folders}
    yield from _params_against_records(ctx, folders, records)
    yield from _saves_against_records(ctx, folders, records)
    yield from _config_dtype(ctx, folders)


def _params_against_records(ctx: RunContext, folders: list[ArtifactFolder],
                            records: dict[str, dict]) -> Iterator[Finding]:
    for _, run_id, rel, params in run_params(ctx):
        found: dict[tuple, list] = {}  # (key, record) -> [(artifact, disagreement)]: one finding per stale key
        for folder in folders:
            if folder.run != run_id:
                continue
            for disagreement in table.disagreements(params, records[folder.rel], table.PARAMS_FACTS):
                found.setdefault((disagreement.key, disagreement.record.key), []).append((folder, disagreement))
        for (key, _), hits in found.items():
            folder, d = hits[0]
            more = f" (and in {len(hits) - 1} other artifact(s) of the run)" if len(hits) > 1 else ""
            yield Finding("IV514", rel, pointer=pointer_of(key.split(".")), run=run_id, artifact=folder.id,
                          message=f"run {run_id}: {rel} declares {key} = {table.shown(d.declared)}, but "
                                  f"{_where(folder, d.record)} records {_field(d.record)} = "
                                  f"{_recorded(d)}{more}: the {d.fact.name} the params declare is not the one "
                                  f"the run that made {folder.label} used; write the params the run used (a "
                                  "run with other values is another run)")


def _saves_against_records(ctx: RunContext, folders: list[ArtifactFolder],
                           records: dict[str, dict]) -> Iterator[Finding]:
    by_id = {folder.id: folder for folder in folders if folder.id}
    listed = ctx.documents.manifest.get("runs")
    for run_index, run in enumerate(listed if isinstance(listed, list) else ()):
        saves = run.get("checkpoints") if isinstance(run, dict) else None
        for save_index, save in enumerate(saves if isinstance(saves, list) else ()):
            named = save.get("artifact") if isinstance(save, dict) else None
            folder = by_id.get(named) if isinstance(named, str) else None
            if folder is None:
                continue
            for d in table.disagreements(save, records[folder.rel], table.CHECKPOINT_FACTS):
                yield Finding("IV514", MANIFEST, pointer=pointer_of(["runs", run_index, "checkpoints", save_index,
                                                                     "step"]),
                              run=folder.run, artifact=folder.id,
                              message=f"the manifest records {folder.label} as saved at step "
                                      f"{table.shown(d.declared)}, but {_where(folder, d.record)} records "
                                      f"{_field(d.record)} = {table.shown(d.recorded)}: the checkpoint is not the "
                                      "save the manifest describes (another step's, or another run's)")


def _config_dtype(ctx: RunContext, folders: list[ArtifactFolder]) -> Iterator[Finding]:
    row = table.fact("dtype")
    for folder in folders:
        config = bounded_json(ctx, f"{folder.rel}/{table.CONFIG}")
        if not isinstance(config, dict) or config.get("quantization_config") is not None:
            continue  # a quantized model stores packed integers: its dtype is the compute dtype
        declared = next(((key, value) for key, value in table.declared_values(config, row)), None)
        declared_name = table.dtype_name(declared[1]) if declared else None
        weights = read_weights(PackageFolder(ctx, folder.rel)) if declared_name else None
        stored = weights.stored_dtype() if weights is not None else None
        if stored is None or table.agree(row, declared_name, stored):
            continue
        files = ", ".join(weights.files[:2]) + (", …" if len(weights.files) > 2 else "")
        yield Finding("IV515", f"{folder.rel}/{table.CONFIG}", pointer=pointer_of(declared[0].split(".")),
                      run=folder.run, artifact=folder.id,
                      message=f"{folder.rel}/{table.CONFIG} declares {declared[0]} = {table.shown(declared[1])}, "
                              f"but most of the float elements of its weights ({files}) are stored in {stored}: "
                              "a loader that trusts the config loads another model than the files hold; save "
                              "the model and its config together (model.to(dtype).save_pretrained(path))")


def _where(folder: ArtifactFolder, record: table.Record) -> str:
    if record.file == table.FOLDER_NAME:
        return f"its folder name {folder.rel}"
    if record.file == table.WEIGHTS:
        return f"{folder.rel} (its weights)"
    return f"{folder.rel}/{record.file}"


def _field(record: table.Record) -> str:
    return "its step" if record.file == table.FOLDER_NAME else record.field


def _recorded(d: table.Disagreement) -> str:
    permitted = table.allowed(d.fact, d.declared)
    if permitted:
        return f"{table.shown(d.recorded)} (a {d.declared} run trains in {table.shown(permitted)})"
    return table.shown(d.recorded)
