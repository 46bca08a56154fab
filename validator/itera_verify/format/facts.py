"""Declared facts and where an artifact records them: the one table (pure data and pure comparisons, no I/O).

A package declares facts about its runs (params/<run>.json: the learning rate, the seed, the LoRA rank; the
manifest: the step each checkpoint was saved at; a model's config.json: its dtype, its vocabulary) and the
libraries that wrote its artifacts recorded the same facts in files of their own (the Trainer's
training_args.bin and trainer_state.json, PEFT's adapter_config.json, the safetensors headers, the tokenizer
files). Each row below names a fact, the keys that declare it, the artifact files and fields that record it and
how the two compare. The rules (rules/declared_facts.py, tokenizer_fit.py, shard_index.py, run_history.py,
predictions_corpus.py) and the recorder (record/facts_check.py) read the rows and compare with the functions
here, so a writer and a checker cannot disagree. Reading an artifact's files is package/records.py's.

Adding a framework's record of a fact is one `Record` in its row (and, for a file kind nobody reads yet, its
reader in package/records.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterator

# How a declared value and a recorded one compare.
EXACT = "exact"  # equal (numbers by value: 4 == 4.0; strings as written; lists in order)
NUMERIC = "numeric"  # equal within the row's relative tolerance
ONE_OF = "one of"  # the recorded value is one of those the declared value allows (`allowed`)
SAME_SET = "same set"  # equal as sets (a list of module names in any order; a string pattern as written)
AT_MOST = "at most"  # the declared value is at most the recorded bound (a tokenizer's size, the embedding rows)
BELOW = "below"  # the declared value is under the recorded bound (a token id, the embedding rows)
PRESENT = "present"  # declared: the record must exist (and equal the declared text when that is a template)

# Pseudo-files: what an artifact records outside one file's fields.
WEIGHTS = "weights"  # the safetensors headers of its weights (model.safetensors, shards, adapter_model.safetensors)
FOLDER_NAME = "folder name"  # a Trainer checkpoint's own name, checkpoint-<N>
TOKENIZER = "tokenizer"  # tokenizer.json (or vocab.json / vocab.txt) with the added tokens
STORED_DTYPE = "the dtype most of its float tensors are stored in"
EMBEDDING_ROWS = "rows of its input embeddings"
TOKENIZER_SIZE = "its largest token id + 1"

PARAMS = "params/<run>.json"
CHECKPOINT_RECORD = "manifest runs[].checkpoints[]"
LOGGED_METRICS = "metrics/<run>.jsonl"


@dataclass(frozen=True)
class Record:
    """Where an artifact records a fact: a file inside the artifact's folder (or a pseudo-file above) and the
    field in it; `when` says in words when the record is comparable at all."""

    file: str
    field: str
    when: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.file, self.field


@dataclass(frozen=True)
class Fact:
    """One declared fact: the document and keys that declare it, the records that must agree, the comparison.
    Keys are dotted paths; `*` stands for any key of an object (params `peft.<adapter>.r`)."""

    name: str
    declared_in: str
    keys: tuple[str, ...]
    records: tuple[Record, ...]
    comparison: str
    code: str
    tolerance: float = 0.0
    shapes_training: bool = False  # two runs declaring different values cannot log the same losses
    ignored: tuple[str, ...] = ()  # SAME_SET: members a library adds by itself, left out of both sides


# The heads PEFT itself adds to modules_to_save for a task (PeftModelForSequenceClassification and the like): the
# reload builds the base with them, and IV514 leaves them out of the declared modules_to_save. PEFT 0.22 added
# `pre_classifier` (DistilBERT's head) to the classification ones; earlier versions add classifier and score.
PEFT_CLASSIFIER_HEADS = ("classifier", "score", "pre_classifier")
PEFT_TASK_HEADS_BY_TASK = {"SEQ_CLS": PEFT_CLASSIFIER_HEADS, "TOKEN_CLS": PEFT_CLASSIFIER_HEADS,
                           "QUESTION_ANS": ("qa_outputs",)}
PEFT_TASK_HEADS = tuple(dict.fromkeys(head for heads in PEFT_TASK_HEADS_BY_TASK.values() for head in heads))
TRAINING_ARGS = "training_args.bin"  # a pickled TrainingArguments: read from its opcodes, never unpickled
TRAINER_STATE = "trainer_state.json"
ADAPTER_CONFIG = "adapter_config.json"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
INDEX_SUFFIX = ".safetensors.index.json"

# The learning rate logged in trainer_state.json's log_history is the scheduled one (warm-up, decay, a custom
# scheduler may even pass the configured value), not the peak the params declare: only training_args.bin
# records the configured value, so it is the one compared.
PARAMS_FACTS: tuple[Fact, ...] = (
    Fact("seed", PARAMS, ("seed",), (Record(TRAINING_ARGS, "seed"),), EXACT, "IV514", shapes_training=True),
    Fact("learning rate", PARAMS, ("learning_rate", "lr"), (Record(TRAINING_ARGS, "learning_rate"),), NUMERIC,
         "IV514", tolerance=1e-6, shapes_training=True),
    Fact("maximum steps", PARAMS, ("max_steps",),
         (Record(TRAINING_ARGS, "max_steps"), Record(TRAINER_STATE, "max_steps", "declared above 0")), EXACT,
         "IV514"),
    Fact("epochs", PARAMS, ("num_train_epochs",), (Record(TRAINING_ARGS, "num_train_epochs"),), NUMERIC, "IV514",
         tolerance=1e-9),
    Fact("batch size per device", PARAMS, ("per_device_train_batch_size",),
         (Record(TRAINING_ARGS, "per_device_train_batch_size"),), EXACT, "IV514", shapes_training=True),
    Fact("gradient accumulation", PARAMS, ("gradient_accumulation_steps",),
         (Record(TRAINING_ARGS, "gradient_accumulation_steps"),), EXACT, "IV514", shapes_training=True),
    Fact("weight decay", PARAMS, ("weight_decay",), (Record(TRAINING_ARGS, "weight_decay"),), NUMERIC, "IV514",
         tolerance=1e-6, shapes_training=True),
    Fact("warm-up steps", PARAMS, ("warmup_steps",), (Record(TRAINING_ARGS, "warmup_steps"),), NUMERIC, "IV514",
         tolerance=1e-9, shapes_training=True),
    Fact("LR scheduler", PARAMS, ("lr_scheduler_type",), (Record(TRAINING_ARGS, "lr_scheduler_type"),), EXACT,
         "IV514"),
    Fact("optimizer", PARAMS, ("optim",), (Record(TRAINING_ARGS, "optim"),), EXACT, "IV514"),
    Fact("fp16 mixed precision", PARAMS, ("fp16",), (Record(TRAINING_ARGS, "fp16"),), EXACT, "IV514"),
    Fact("bf16 mixed precision", PARAMS, ("bf16",), (Record(TRAINING_ARGS, "bf16"),), EXACT, "IV514"),
    # A Trainer checkpoint holds the weights as they trained: under fp16/bf16 mixed precision the master weights
    # stay float32, a model loaded in half precision trains in it. A delivered model may be converted for
    # delivery (a bf16 copy of an fp32 run), so only checkpoints are compared.
    Fact("precision", PARAMS, ("precision", "mixed_precision"),
         (Record(WEIGHTS, STORED_DTYPE, "a resume checkpoint's weights"),), ONE_OF, "IV514"),
    # trainer_state.json's logging_steps and save_steps are the first attempt's: a resume loads them from the
    # checkpoint it resumes from (transformers only warns when the arguments changed), so they are not compared.
    Fact("logging interval", PARAMS, ("logging_steps",), (Record(TRAINING_ARGS, "logging_steps"),), NUMERIC,
         "IV514", tolerance=1e-9),
    Fact("save interval", PARAMS, ("save_steps",), (Record(TRAINING_ARGS, "save_steps"),), NUMERIC, "IV514",
         tolerance=1e-9),
    Fact("LoRA rank", PARAMS, ("lora_r", "peft.*.r"), (Record(ADAPTER_CONFIG, "r"),), EXACT, "IV514",
         shapes_training=True),
    Fact("LoRA alpha", PARAMS, ("lora_alpha", "peft.*.lora_alpha"), (Record(ADAPTER_CONFIG, "lora_alpha"),),
         NUMERIC, "IV514", tolerance=1e-9, shapes_training=True),
    Fact("LoRA dropout", PARAMS, ("lora_dropout", "peft.*.lora_dropout"), (Record(ADAPTER_CONFIG, "lora_dropout"),),
         NUMERIC, "IV514", tolerance=1e-9),
    Fact("LoRA target modules", PARAMS, ("target_modules", "lora_target_modules", "peft.*.target_modules"),
         (Record(ADAPTER_CONFIG, "target_modules"),), SAME_SET, "IV514", shapes_training=True),
    # PEFT adds its task's head to modules_to_save by itself (SEQ_CLS: classifier, score and, since PEFT 0.22,
    # pre_classifier), sometimes twice.
    Fact("modules saved whole", PARAMS, ("modules_to_save", "peft.*.modules_to_save"),
         (Record(ADAPTER_CONFIG, "modules_to_save"),), SAME_SET, "IV514", ignored=PEFT_TASK_HEADS),
    # Not the recorder's `model_name_or_path`: that is the string the model was loaded with (a hub alias, an
    # older name), which the recorder pins to the hub id the user names when it registers the adapter.
    Fact("adapter base", PARAMS, ("base_model", "base_model_name_or_path"),
         (Record(ADAPTER_CONFIG, "base_model_name_or_path"),), EXACT, "IV514"),
    Fact("adapter base revision", PARAMS, ("base_revision", "peft.*.revision"), (Record(ADAPTER_CONFIG, "revision"),),
         EXACT, "IV514"),
)

# The manifest's record of each save (the recorder writes it) against the checkpoint's own.
CHECKPOINT_FACTS: tuple[Fact, ...] = (
    Fact("checkpoint step", CHECKPOINT_RECORD, ("step",),
         (Record(TRAINER_STATE, "global_step"), Record(FOLDER_NAME, "N of checkpoint-<N>")), EXACT, "IV514"),
)

# What a model folder declares about itself against what its weights and tokenizer hold.
ARTIFACT_FACTS: tuple[Fact, ...] = (
    Fact("dtype", CONFIG, ("dtype", "torch_dtype", "text_config.dtype", "text_config.torch_dtype"),
         (Record(WEIGHTS, STORED_DTYPE, "no quantization_config"),), EXACT, "IV515"),
    Fact("vocabulary size", CONFIG, ("vocab_size", "text_config.vocab_size"), (Record(WEIGHTS, EMBEDDING_ROWS),),
         EXACT, "IV516"),
    Fact("tokenizer vocabulary", TOKENIZER, (TOKENIZER_SIZE,),
         (Record(WEIGHTS, EMBEDDING_ROWS), Record(CONFIG, "vocab_size", "no weights to read"),
          Record(PARAMS, "base_vocab_size", "an adapter that saves no embeddings")), AT_MOST, "IV516"),
    # The recorder writes `vocab_size` (the model's embedding rows as it trains, after a resize) and, for an
    # adapter, `base_vocab_size` (its base's, from the hub cache): base + adapter has the base's rows unless the
    # adapter saves its own.
    Fact("trained vocabulary", PARAMS, ("vocab_size",),
         (Record(WEIGHTS, EMBEDDING_ROWS, "an adapter that saves its embeddings"),
          Record(PARAMS, "base_vocab_size", "an adapter that saves no embeddings")), EXACT, "IV516"),
    Fact("special tokens", TOKENIZER_CONFIG,
         ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token",
          "extra_special_tokens", "additional_special_tokens"),
         (Record(TOKENIZER, "its vocabulary and added tokens"),), PRESENT, "IV516"),
    Fact("chat template", PARAMS, ("chat_template", "chat_format"),
         (Record(TOKENIZER_CONFIG, "chat_template"), *(Record(name, "the file") for name in CHAT_TEMPLATE_FILES)),
         PRESENT, "IV517"),
    Fact("generation token ids", GENERATION_CONFIG,
         ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"),
         (Record(WEIGHTS, EMBEDDING_ROWS), Record(CONFIG, "vocab_size", "no weights to read")), BELOW, "IV518"),
    Fact("model token ids", CONFIG, ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"),
         (Record(WEIGHTS, EMBEDDING_ROWS), Record(CONFIG, "vocab_size", "no weights to read")), BELOW, "IV518"),
    Fact("shard index", f"*{INDEX_SUFFIX}", ("weight_map", "metadata.total_size"),
         (Record(WEIGHTS, "each listed shard's tensor names and byte ranges (headers only)"),), EXACT, "IV519"),
)

# Campaign facts: a run's metrics against its checkpoints' own log, predictions against the frozen corpus.
# `tolerance` here is for a run's own two records of one value (a metrics writer may round); values copied
# from another run are equal to the bit (COPIED_TOLERANCE).
LOGGED = ("loss", "grad_norm", "learning_rate", "eval_loss")
GOLD_LABEL_KEYS = ("label", "gold", "gold_label", "target", "reference")
RESUME_DECLARATIONS = ("resume_from_checkpoint", "resumed_from", "init_from")
CAMPAIGN_FACTS: tuple[Fact, ...] = (
    Fact("logged values", LOGGED_METRICS, LOGGED,
         (Record(TRAINER_STATE, "log_history[].<name> at log_history[].step"),), NUMERIC, "IV312", tolerance=1e-3),
    Fact("gold label", "predictions/<run>.jsonl", GOLD_LABEL_KEYS,
         (Record("predictions/<other run>.jsonl", "the same key for the same eval id"),), EXACT, "IV313"),
    Fact("predictions of a stopped run", "manifest runs[].status", ("stopped",),
         (Record("predictions/<run>.jsonl", "the file"),), PRESENT, "IV314"),
)
COPIED_TOLERANCE = 1e-12

FACTS: tuple[Fact, ...] = PARAMS_FACTS + CHECKPOINT_FACTS + ARTIFACT_FACTS + CAMPAIGN_FACTS


def fact(name: str) -> Fact:
    return next(row for row in FACTS if row.name == name)


# ---------------------------------------------------------------------------------------------- dtypes

# Every spelling of a float format, as config.json (torch_dtype/dtype), params and safetensors write it.
DTYPE_NAMES = {
    "float32": "float32", "torch.float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "float16": "float16", "torch.float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "torch.float64": "float64", "f64": "float64", "double": "float64",
    "float8_e4m3fn": "float8_e4m3fn", "f8_e4m3": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2", "f8_e5m2": "float8_e5m2",
}
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})  # safetensors' float dtypes

# A declared precision and the float formats a Trainer checkpoint's weights may then be stored in: mixed
# precision keeps float32 master weights (DeepSpeed's fp16 and bf16 modes keep the module in half precision),
# a model loaded in half precision trains in it (Lightning's "-true"). accelerate's "no" says only that no
# autocast ran: it allows any format, so it is not listed.
PRECISION_DTYPES = {
    "fp16": {"float16", "float32"}, "float16": {"float16", "float32"}, "16": {"float16", "float32"},
    "16-mixed": {"float16", "float32"}, "16-true": {"float16"},
    "bf16": {"bfloat16", "float32"}, "bfloat16": {"bfloat16", "float32"}, "bf16-mixed": {"bfloat16", "float32"},
    "bf16-true": {"bfloat16"},
    "fp32": {"float32"}, "float32": {"float32"}, "32": {"float32"}, "32-true": {"float32"},
}


def dtype_name(value: Any) -> str | None:
    """A float format's one name (float32, float16, bfloat16, ...) from any spelling; None when not one."""
    if not isinstance(value, str):
        return None
    return DTYPE_NAMES.get(value.strip().lower())


def allowed(fact_: Fact, declared: Any) -> set | None:
    """For a ONE_OF fact, the recorded values the declared one allows; None when the declaration is unknown."""
    if fact_.name == "precision" and isinstance(declared, (str, int)) and not isinstance(declared, bool):
        return PRECISION_DTYPES.get(str(declared).strip().lower())
    return None


# ---------------------------------------------------------------------------------------------- comparisons

def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def close(one: Any, other: Any, tolerance: float) -> bool:
    """Two numbers equal within a relative tolerance (and an absolute one of the same size near zero); NaN
    equals NaN (a log and its copy agree on it)."""
    a, b = as_float(one), as_float(other)
    if a is None or b is None:
        return False
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance * 1e-3) if tolerance else a == b


def as_float(value: Any) -> float | None:
    """A JSON number as a float (NaN and infinities included); None for anything else, 10**400 included."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def agree(fact_: Fact, declared: Any, recorded: Any) -> bool:
    """Whether the declared value and the recorded one tell the same fact (the row's comparison)."""
    if fact_.comparison == NUMERIC:
        return close(declared, recorded, fact_.tolerance) if _number(declared) is not None else declared == recorded
    if fact_.comparison == ONE_OF:
        permitted = allowed(fact_, declared)
        return permitted is None or recorded in permitted
    if fact_.comparison == SAME_SET:
        if isinstance(declared, list) and isinstance(recorded, list):
            return {str(v) for v in declared} - set(fact_.ignored) == {str(v) for v in recorded} - set(fact_.ignored)
        return declared == recorded
    if fact_.comparison in (AT_MOST, BELOW):
        if _number(declared) is None or _number(recorded) is None:
            return False
        return declared <= recorded if fact_.comparison == AT_MOST else declared < recorded
    # EXACT: numbers by value (4 == 4.0, but True is no 1)
    if isinstance(declared, bool) or isinstance(recorded, bool):
        return declared is recorded or declared == recorded and type(declared) is type(recorded)
    if _number(declared) is not None and _number(recorded) is not None:
        return float(declared) == float(recorded)
    return declared == recorded


def same_declaration(fact_: Fact, one: Any, other: Any) -> bool:
    """Whether two declarations of one fact (two keys of a params file, two runs' params) say the same: equal
    for a ONE_OF fact (a declared precision is not one of its recorded dtypes), else as `agree` compares."""
    if fact_.comparison == ONE_OF:
        return one == other or (allowed(fact_, one) is not None and allowed(fact_, one) == allowed(fact_, other))
    if fact_.comparison in (AT_MOST, BELOW):
        return agree(replace(fact_, comparison=EXACT), one, other)
    return agree(fact_, one, other)


# ---------------------------------------------------------------------------------------------- declarations

def lookup(document: Any, key: str) -> list[tuple[str, Any]]:
    """(the concrete key, its value) for a dotted key path in a JSON document; `*` matches every key of an
    object. Nothing when the path is absent."""
    found = [("", document)]
    for part in key.split("."):
        step = []
        for prefix, value in found:
            if not isinstance(value, dict):
                continue
            names = [k for k in value if isinstance(k, str)] if part == "*" else [part] if part in value else []
            step += [(f"{prefix}.{name}" if prefix else name, value[name]) for name in names]
        found = step
    return found


def declared_values(document: Any, fact_: Fact) -> list[tuple[str, Any]]:
    """Every (key, value) of the document declaring the fact; a null value declares nothing."""
    out = []
    for key in fact_.keys:
        found = lookup(document, key)
        if "*" in key and len(found) > 1:
            continue  # several adapters in one params file: which one an artifact holds is not said
        out += [(name, value) for name, value in found if value is not None]
    return out


def comparable(record: Record, declared: Any) -> bool:
    """A record compared only under its condition: trainer_state.json's max_steps is the computed total, the
    declared max_steps when that is above 0 (an epoch-based run declares -1)."""
    if record.when == "declared above 0":
        return _number(declared) is not None and declared > 0
    return True


@dataclass(frozen=True)
class Disagreement:
    fact: Fact
    key: str  # the declared key
    declared: Any
    record: Record
    recorded: Any


def disagreements(document: Any, records: dict[tuple[str, str], Any],
                  facts: tuple[Fact, ...] = PARAMS_FACTS) -> Iterator[Disagreement]:
    """Each declared fact of `document` (a params file, a save record) that a record of `records` (record key
    -> value, what package/records.py read from one artifact) tells otherwise."""
    if not isinstance(document, dict):
        return
    for row in facts:
        for key, value in declared_values(document, row):
            for record in row.records:
                if record.key not in records or not comparable(record, value):
                    continue
                recorded = records[record.key]
                if recorded is None and row.comparison != PRESENT:
                    continue  # the artifact records nothing for it (a null revision is IV501's)
                if not agree(row, value, recorded):
                    yield Disagreement(row, key, value, record, recorded)


def shown(value: Any) -> str:
    """A value inside a message: short, JSON-like."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, (list, tuple)):
        items = ", ".join(shown(v) if isinstance(v, (str, int, float, type(None))) else type(v).__name__
                          for v in list(value)[:6])
        return f"[{items}{', …' if len(value) > 6 else ''}]"
    if isinstance(value, (set, frozenset)):
        return "one of " + " / ".join(sorted(map(str, value)))
    if isinstance(value, int):
        return str(value) if abs(value) < 10 ** 30 else f"an integer of {len(str(abs(value)))} digits"
    return "an object" if isinstance(value, dict) else type(value).__name__
