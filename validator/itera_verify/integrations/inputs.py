"""Counting what a Hugging Face tokenizer truncates, for `run.inputs(split, total, truncated)` and the
`truncated_input` stop rule (docs/record.md): an indispensable input cut short changes what the model was judged on."""
from __future__ import annotations

from collections.abc import Iterable

BATCH = 256


def count_truncated(tokenizer, texts: Iterable, max_length: int | None = None, **encode_options) -> tuple[int, int]:
    """(inputs, inputs longer than `max_length` tokens): what `tokenizer(text, truncation=True,
    max_length=max_length)` would cut. `max_length` defaults to the tokenizer's model_max_length; a text pair
    is given as a (first, second) tuple. Special tokens are counted, as truncation counts them.

        total, truncated = count_truncated(tokenizer, eval_texts, max_length=512)
        violation = run.inputs("eval", total, truncated)
    """
    limit = max_length if max_length is not None else getattr(tokenizer, "model_max_length", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0 or limit > 10**9:
        raise ValueError("count_truncated: give max_length (the tokenizer declares no usable model_max_length)")
    total = truncated = 0
    batch: list = []

    def flush() -> int:
        pairs = batch and isinstance(batch[0], tuple)
        firsts = [b[0] for b in batch] if pairs else batch
        seconds = [b[1] for b in batch] if pairs else None
        ids = tokenizer(firsts, seconds, truncation=False, **encode_options)["input_ids"]
        return sum(1 for row in ids if len(row) > limit)

    for text in texts:
        batch.append(text)
        total += 1
        if len(batch) == BATCH:
            truncated += flush()
            batch.clear()
    if batch:
        truncated += flush()
    return total, truncated
