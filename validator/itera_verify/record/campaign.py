"""A campaign folder recorded as it happens: create or reopen it, declare the plan and the stop rules, start
runs, record the timeline, close it with the decision. The package on disk is the only state: every step reads
it under the lock, changes it and writes it back atomically, so a crash, a reopen or a second process of the
same campaign all continue from what was written."""
from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from ..format import money as money_rules
from ..format.money import money
from ..version import FORMAT
from .errors import RecordError
from .files import read_bytes, remove_stale_temps, write_atomic
from .ids import check_id
from .lots import check_lot, check_plan_lots, check_reopen
from .run import Run
from .stoprules import validate_rules
from .store import EVAL_IDS, MANIFEST, RELOAD, STOPS, now, parse_time, read, transaction

TRAIN_IDS = "corpus/train_ids.txt"


def is_main_process() -> bool:
    """Under torchrun/accelerate only rank 0 writes (RANK is set for every process of the job)."""
    return os.environ.get("RANK", "0") == "0"


def _timestamp(value, what: str) -> str:
    """RFC 3339 UTC to the second, from such a string or an aware datetime."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise RecordError(f"{what}: a datetime with its time zone (datetime.now(UTC)), not a naive one")
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        parsed = parse_time(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise RecordError(f"{what} {value!r}: an RFC 3339 time with its zone, e.g. 2026-11-20T08:00:00Z")
    return value


def _eval_ids_bytes(eval_ids: Iterable[str] | str | os.PathLike, what: str = "eval") -> bytes:
    if isinstance(eval_ids, (str, os.PathLike)):
        ids = Path(eval_ids).read_text(encoding="utf-8").splitlines()
    else:
        ids = list(eval_ids)
    if not ids:
        raise RecordError(f"the frozen corpus has no {what} ids")
    seen = set()
    for i in ids:
        if not isinstance(i, str) or not i.strip() or "\n" in i or "\r" in i or i != i.strip():
            raise RecordError(f"{what} id {i!r}: one non-blank id per line, no surrounding spaces")
        if i in seen:
            raise RecordError(f"{what} id {i!r} appears twice in the frozen corpus")
        seen.add(i)
    return "".join(i + "\n" for i in ids).encode("utf-8")


def open_campaign(path: str | os.PathLike, campaign_id: str, question: str, corpus_name: str,
                  corpus_revision: str, eval_ids: Iterable[str] | str | os.PathLike, *,
                  main_process: bool | None = None, clock: Callable[[], str] | None = None,
                  train_ids: Iterable[str] | str | os.PathLike | None = None, lot: str | None = None) -> Campaign:
    """Create the campaign folder, or reopen it (after a crash, from another process): reopening with another
    id, question or corpus is refused, since what a run was compared on is frozen.

    `eval_ids`: the frozen evaluation ids (a list, or a file with one id per line); they are copied to
    corpus/eval_ids.txt and hashed. On every process but the main one (RANK != 0) nothing is written.
    `clock`: what "now" is (an RFC 3339 string); the real UTC clock by default, a fixed one for a reproducible
    build. `train_ids`: the training example ids (a list or a file), written to corpus/train_ids.txt with their
    sha256, so the checker can prove no evaluation id leaked into training (IV309). `lot`: the plan lot
    (plan.lots[].id) this machine is, when the campaign runs on several: its runs record it (runs[].lot), and
    the folder is this lot's part (`itera-verify OUTDIR --part`, then `itera-verify assemble`)."""
    writer = is_main_process() if main_process is None else main_process
    campaign = Campaign(Path(path).absolute(), writer, clock or now, check_lot(lot))
    if not writer:
        return campaign
    check_id("campaign_id", campaign_id)
    if not isinstance(question, str) or not question.strip():
        raise RecordError("the campaign needs its question (with its success threshold)")
    if not corpus_revision:
        raise RecordError("the corpus needs a revision (a tag, a commit or a dated snapshot): it must be frozen")
    ids = _eval_ids_bytes(eval_ids)
    trained_on = _eval_ids_bytes(train_ids, "train") if train_ids is not None else None
    root = campaign.root
    root.mkdir(parents=True, exist_ok=True)
    with transaction(root) as tx:
        manifest = tx.get(MANIFEST)
        if manifest is None:
            write_atomic(root, EVAL_IDS, ids)
            tx.set(MANIFEST, {
                "format": FORMAT, "campaign_id": campaign_id, "question": question, "created_at": campaign.now(),
                "corpus": {"name": corpus_name, "revision": corpus_revision, "eval_ids": EVAL_IDS,
                           "eval_ids_sha256": hashlib.sha256(ids).hexdigest()},
                "runs": [], "artifacts": [], "timeline": {"deviations": [], "decisions": []}})
            tx.get(STOPS), tx.get(RELOAD)  # written as {"stops": []} and {"artifacts": {}}
        else:
            campaign._check_reopen(manifest, campaign_id, question, corpus_name, corpus_revision, ids)
            check_reopen(manifest, campaign.lot, root)
        if trained_on is not None:
            corpus = tx.get(MANIFEST)["corpus"]
            digest = hashlib.sha256(trained_on).hexdigest()
            if corpus.get("train_ids_sha256") not in (None, digest):
                raise RecordError(f"the train ids differ from the recorded {TRAIN_IDS}: open a new folder for "
                                  "another training set")
            write_atomic(root, TRAIN_IDS, trained_on)
            corpus.update(train_ids=TRAIN_IDS, train_ids_sha256=digest)
        # Under the lock: every atomic write holds it, so a temporary file seen now is one a dead process left,
        # never the one another process of the campaign is about to rename.
        stale = remove_stale_temps(root)
    if stale:
        warnings.warn(f"removed {len(stale)} temporary file(s) an interrupted write left: {', '.join(stale[:3])}",
                      stacklevel=2)
    return campaign


class Campaign:
    def __init__(self, root: Path, writer: bool, clock: Callable[[], str] = now, lot: str | None = None):
        self.root = root
        self.writer = writer
        self.now = clock
        self.lot = lot  # the plan lot this machine is (open_campaign(..., lot=)), None on one machine

    # ---- reading ------------------------------------------------------------------------------------
    @property
    def manifest(self) -> dict:
        return read(self.root, MANIFEST)

    def _check_reopen(self, manifest, campaign_id, question, corpus_name, corpus_revision, ids) -> None:
        corpus = manifest.get("corpus") or {}
        recorded = {"campaign_id": manifest.get("campaign_id"), "question": manifest.get("question"),
                    "corpus name": corpus.get("name"), "corpus revision": corpus.get("revision")}
        given = {"campaign_id": campaign_id, "question": question, "corpus name": corpus_name,
                 "corpus revision": corpus_revision}
        for what, value in recorded.items():
            if value != given[what]:
                raise RecordError(f"{self.root} is campaign {manifest.get('campaign_id')!r} with {what} "
                                  f"{value!r}, not {given[what]!r}: a campaign's question and corpus "
                                  "are frozen; open a new folder for another campaign")
        if read_bytes(self.root, EVAL_IDS) != ids:
            raise RecordError(f"the eval ids differ from the frozen {EVAL_IDS}: the corpus is frozen once the "
                              "campaign is opened; open a new folder for another corpus")

    def _started_runs(self, manifest: dict) -> list[str]:
        return [r.get("id") for r in manifest.get("runs", [])]

    def _refuse_after_start(self, manifest: dict, what: str) -> None:
        started = self._started_runs(manifest)
        if started:
            raise RecordError(f"the {what} cannot change: run {started[0]!r} has started and the {what} is "
                              "compared with what happened, never rewritten. Record the change with "
                              "campaign.deviation(hours, explanation) or campaign.decision(decision, note=...)")

    # ---- declarations -------------------------------------------------------------------------------
    def declare_plan(self, lots: list[dict], reserved_hours: float, window_hours: float | None = None,
                     other_expenses: list[dict] = (), started_at: str | datetime | None = None) -> None:
        """The committed plan: lots ({gpu, days, gpus, price_usd, started_at?}), hours reserved, the window
        (default: the longest lot), other expenses ({label, usd, included}). `started_at` (RFC 3339, or an aware
        datetime): when the rental began, given to every lot that does not say (to this machine's lot only, when
        it was opened with `lot=`); the rental ends at started_at +
        days (docs/record.md), which the recorder prints at each save. Declaring the same plan again is a no-op."""
        if not self.writer:
            return
        if not lots or not all(isinstance(lot, dict) and {"gpu", "days", "price_usd"} <= lot.keys() for lot in lots):
            raise RecordError("plan lots: a non-empty list of {gpu, days, price_usd, gpus?, started_at?}")
        lots = [dict(lot) for lot in lots]
        check_plan_lots(lots, self.lot)
        for lot in lots:
            # On one lot of several, the rental this machine knows is its own.
            if lot.get("started_at") is None and started_at is not None and self.lot in (None, lot.get("id")):
                lot["started_at"] = started_at
            if lot.get("started_at") is not None:
                lot["started_at"] = _timestamp(lot["started_at"], "a lot's started_at")
        if any(money_rules.usd(lot["price_usd"]) is None for lot in lots):
            raise RecordError(f"plan lots: every price_usd is an amount between 0 and {money_rules.MAX_USD:,} USD")
        if not all(isinstance(e, dict) and {"label", "usd", "included"} <= e.keys() for e in other_expenses):
            raise RecordError("other expenses: a list of {label, usd, included}")
        # Lots bought together run side by side: the window is the longest lot (docs/format.md).
        longest = max(lot["days"] for lot in lots) * 24
        window_hours = longest if window_hours is None else window_hours
        if window_hours > longest:
            raise RecordError(f"window_hours {window_hours} exceeds the longest lot ({longest} h)")
        if reserved_hours > window_hours:
            raise RecordError(f"reserved_hours {reserved_hours} exceed the window of {window_hours} h (IV606)")
        plan = {"window_hours": window_hours,
                "reserved_hours": reserved_hours, "lots": [dict(lot) for lot in lots],
                "rental_total_usd": money(money_rules.rental_usd({"lots": lots})),
                "other_expenses": [dict(e) for e in other_expenses]}
        self._declare("plan", plan)

    def declare_stop_rules(self, rules: list[dict]) -> None:
        """The stop rules ({id, kind, metric?, threshold?}), declared before the first run starts."""
        if not self.writer:
            return
        self._declare("stop_rules", {"rules": validate_rules(rules)})

    def _declare(self, key: str, value: dict) -> None:
        with transaction(self.root) as tx:
            manifest = tx.get(MANIFEST)
            old = manifest.get(key)
            if old is not None and {k: v for k, v in old.items() if k != "declared_at"} == value:
                return  # a reopened campaign declaring the same thing again
            self._refuse_after_start(manifest, key.replace("_", " "))
            manifest[key] = {"declared_at": self.now(), **value}

    # ---- runs -----------------------------------------------------------------------------------------
    def run(self, run_id: str, role: str, category: str = "indispensable", params: dict | None = None) -> Run:
        """A run handle; `run.start()` records it (the Trainer and Lightning callbacks start it themselves,
        adding the training arguments to `params`)."""
        check_id("run id", run_id)
        if role not in ("control", "variant"):
            raise RecordError(f"run {run_id!r}: role is 'control' or 'variant', not {role!r}")
        if category not in ("indispensable", "useful", "exploratory"):
            raise RecordError(f"run {run_id!r}: category is indispensable, useful or exploratory, not {category!r}")
        return Run(self, run_id, role, category, dict(params or {}))

    def start_run(self, run_id: str, role: str, category: str = "indispensable",
                  params: dict | None = None) -> Run:
        return self.run(run_id, role, category, params).start()

    # ---- timeline -------------------------------------------------------------------------------------
    def deviation(self, hours: float, explanation: str) -> None:
        """Hours spent beyond (positive) or under (negative) the plan, and why (IV605)."""
        if not self.writer:
            return
        if not isinstance(explanation, str) or not explanation.strip():
            raise RecordError("a deviation needs its explanation")
        with transaction(self.root) as tx:
            tx.get(MANIFEST)["timeline"].setdefault("deviations", []).append(
                {"hours": hours, "explanation": explanation})

    def decision(self, decision: str, after: str | None = None, note: str | None = None) -> None:
        """A decision taken during the campaign (after="pilot" for the post-pilot one, IV611), dated now."""
        if not self.writer:
            return
        if not isinstance(decision, str) or not decision.strip():
            raise RecordError("a decision needs its text (continue, reduce, stop, ...)")
        entry = {"at": self.now(), "decision": decision}
        if after is not None:
            entry["after"] = after
        if note is not None:
            entry["note"] = note
        with transaction(self.root) as tx:
            tx.get(MANIFEST)["timeline"].setdefault("decisions", []).append(entry)

    def _explain_deviation(self, manifest: dict, observed_hours: float, explanation: str) -> None:
        hours = _unexplained_hours(manifest, observed_hours)
        if hours:
            manifest["timeline"].setdefault("deviations", []).append({"hours": hours, "explanation": explanation})

    # ---- closing ----------------------------------------------------------------------------------------
    def close(self, outcome: str, summary: str, accepted: list[str], error_analysis: str | None = None,
              observed_hours: float | None = None, deviation: str | None = None) -> dict:
        """The decision: outcome (positive | negative | inconclusive), summary, accepted runs (completed ones)
        and the error analysis (its text, written to analysis/errors.md). Observed hours default to the time
        since the campaign was created; the cost per accepted run is computed from the lots and the included
        expenses (omitted when nothing is accepted: the ratio is undefined). `deviation`: why the observed hours
        differ from the reserved ones; the hours the deviations recorded so far leave unexplained (observed -
        reserved - their sum, IV605) are recorded with it. Returns the manifest."""
        if not self.writer:
            return {}
        if self.lot is not None:
            raise RecordError(f"this folder is lot {self.lot!r}'s part: a campaign closes once, over every lot's "
                              "runs; seal the part (itera-verify DIR --part), assemble the parts, then close the "
                              "assembled campaign (open_campaign without lot=)")
        if outcome not in ("positive", "negative", "inconclusive"):
            raise RecordError(f"outcome is positive, negative or inconclusive, not {outcome!r}")
        if not isinstance(summary, str) or not summary.strip():
            raise RecordError("the decision needs its summary")
        if deviation is not None and (not isinstance(deviation, str) or not deviation.strip()):
            raise RecordError("a deviation needs its explanation")
        with transaction(self.root) as tx:
            manifest = tx.get(MANIFEST)
            if "plan" not in manifest:
                raise RecordError("declare the plan before closing: the cost needs its lots")
            runs = {r["id"]: r for r in manifest.get("runs", [])}
            running = [run_id for run_id, run in runs.items() if run.get("status") == "running"]
            if running:
                raise RecordError(f"run {running[0]!r} is still running: complete it or stop it by a rule "
                                  "before closing the campaign")
            if len(set(accepted)) != len(accepted):
                raise RecordError("a run is accepted twice (IV609)")
            for run_id in accepted:
                status = runs.get(run_id, {}).get("status")
                if status != "completed":
                    raise RecordError(f"run {run_id!r} cannot be accepted: it is "
                                      f"{status or 'not a run of this campaign'}; only completed runs are "
                                      "deliverables (a stopped run stays in the cost)")
            if error_analysis is not None:  # after the refusals: a refused close writes nothing
                write_atomic(self.root, "analysis/errors.md", error_analysis.encode("utf-8"))
            if observed_hours is None:
                elapsed = parse_time(self.now()) - parse_time(manifest["created_at"])
                observed_hours = round(elapsed.total_seconds() / 3600, 2)
            manifest["timeline"]["observed_hours"] = observed_hours
            if deviation is not None:
                self._explain_deviation(manifest, observed_hours, deviation)
            decision = {"outcome": outcome, "summary": summary, "accepted": list(accepted)}
            if error_analysis is not None:
                decision["error_analysis"] = "analysis/errors.md"
            cost = cost_per_accepted(manifest["plan"], accepted)
            if cost is not None:
                decision["cost_per_accepted_usd"] = cost
            manifest["decision"] = decision
            return manifest


def _unexplained_hours(manifest: dict, observed_hours: float) -> float:
    """observed - reserved - the deviations already recorded: what IV605 wants explained."""
    recorded = sum(d.get("hours", 0) for d in manifest["timeline"].get("deviations", [])
                   if isinstance(d, dict) and isinstance(d.get("hours"), (int, float)))
    return round(observed_hours - manifest["plan"]["reserved_hours"] - recorded, 2)


def cost_per_accepted(plan: dict, accepted: list[str]) -> float | None:
    """(rental + included other expenses) / distinct accepted runs, to the cent; None at zero (docs/format.md). The
    arithmetic is format/money.py's, the one the budget rules check with."""
    return money(money_rules.cost_per_accepted(money_rules.total_usd(plan), len(set(accepted))))


__all__ = ["Campaign", "cost_per_accepted", "open_campaign"]
