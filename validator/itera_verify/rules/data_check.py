"""IV309: the data check the guide counts among the indispensables: no evaluation example was trained on.

`corpus.train_ids` (optional, written by `open_campaign(..., train_ids=...)`) lists the training example ids,
one per line, in the format of the eval ids; an id in both files means the frozen corpus leaked into training and
every score measured on it is inflated."""
from __future__ import annotations

from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import RunContext, readers
from ..package.campaign import fmt_ids, section

RULES = [
    Rule("IV309", Severity.ERROR, "an evaluation id is also a training id",
         explain="The frozen evaluation examples must be unseen in training: a model scored on examples it was "
                 "trained on reports memory, not skill, and the comparison with the control means nothing. When "
                 "the package declares `corpus.train_ids` (the training example ids, one per line, with "
                 "`train_ids_sha256`), no id of `corpus.eval_ids` may appear in it. Remove the leaked examples "
                 "from the training set and train again, or freeze another evaluation set.",
         bad='corpus/eval_ids.txt: ex-17   corpus/train_ids.txt: ex-17',
         good='corpus/eval_ids.txt: ex-17   corpus/train_ids.txt: tr-0001 ... (no ex-17)'),
]

SHOWN = 5


def _ids(ctx: RunContext, ref) -> readers.EvalIds | None:
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    return readers.read_eval_ids(ctx, rel) if rel else None


def check(ctx: RunContext) -> Iterator[Finding]:
    corpus = section(ctx.documents.manifest or {}, "corpus")
    if "train_ids" not in corpus:
        return
    trained = _ids(ctx, corpus.get("train_ids"))
    evaluated = _ids(ctx, corpus.get("eval_ids"))
    if trained is None or evaluated is None:
        return  # a missing file is IV101/IV106's
    training = set(trained.ids)
    leaked = [i for i in dict.fromkeys(evaluated.ids) if i in training]
    if leaked:
        yield Finding("IV309", trained.path,
                      message=f"{len(leaked)} evaluation id(s) of {evaluated.path} are also training ids in "
                              f"{trained.path} ({fmt_ids(leaked[:SHOWN], len(leaked))}): the frozen corpus leaked "
                              f"into training, and every score on those examples is inflated")
