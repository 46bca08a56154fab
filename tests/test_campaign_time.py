"""Campaign time (issue 26, docs/record.md) on real Trainer runs on the CPU: every save priced, the first checkpoint's
resume proven in a background process while the training goes on, a sabotaged first checkpoint stopping its run
under `no_usable_resume`, a truncated eval input and an eval-loss ceiling stopping theirs, a proof process killed
(the training goes on, the proof records it); then the checker's IV412-IV414, IV613 and IV309 and the report's
saves and the rental's end."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fixtures.artifacts import tiny_gpt2
from fixtures.train import token_dataset, torch_threads
from tests.test_record_trainer import EVAL_IDS, write_predictions
from tests.helpers import context

ROOT = Path(__file__).resolve().parents[1]
RULES = [{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"},
         {"id": "eval-loss-ceiling", "kind": "above_threshold", "metric": "eval_loss", "threshold": 0.5},
         {"id": "truncated", "kind": "truncated_input", "split": "eval", "max_truncated": 0},
         {"id": "no-resume", "kind": "no_usable_resume"}]
STARTED = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
TRAIN_IDS = [f"tr-{i}" for i in range(8)]

pytestmark = pytest.mark.slow


def _callbacks():
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        """Each step's wall time, and whether a proof was running at its end."""

        def __init__(self, run):
            self.run, self.times, self.began = run, [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append((state.global_step, time.monotonic() - self.began, bool(self.run.proofs.running())))

    class Sabotage(TrainerCallback):
        """Cuts the first checkpoint's optimizer.pt in half right after the save (before the recorder sees it),
        then holds the next step until the proof has ended, so that the stop step is known."""

        def __init__(self, run):
            self.run, self.done = run, False

        def on_save(self, args, state, control, **kwargs):
            if not self.done:
                target = Path(args.output_dir) / f"checkpoint-{state.global_step}" / "optimizer.pt"
                os.truncate(target, target.stat().st_size // 2)
                self.done = True

        def on_step_end(self, args, state, control, **kwargs):
            if self.done:
                self.run.proofs.wait(timeout=300)

    class KillProof(TrainerCallback):
        """Kills the proof process as soon as it started (placed after the recorder)."""

        def __init__(self, run):
            self.run, self.killed = run, None

        def on_save(self, args, state, control, **kwargs):
            if self.killed is None and self.run.proofs.running():
                self.killed = self.run.proofs.running()[0].pid
                os.kill(self.killed, signal.SIGKILL)

    return StepTimes, Sabotage, KillProof


def train(run, output_dir: str, *, max_steps: int = 6, save_steps: int | None = 2, eval_steps=None, before=(),
          after=()):
    from itera_verify.integrations import RecordCallback
    from transformers import PrinterCallback, ProgressCallback, Trainer, TrainingArguments

    data = token_dataset(8, 16, seed=7)
    args = TrainingArguments(
        output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=2, learning_rate=5e-3,
        logging_steps=1, save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        eval_strategy="steps" if eval_steps else "no", eval_steps=eval_steps, report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, seed=11)
    trainer = Trainer(model=tiny_gpt2(seed=0), args=args, train_dataset=data,
                      eval_dataset=data[:4] if eval_steps else None,
                      callbacks=[*before, RecordCallback(run), *after])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> dict:
    from itera_verify.record import open_campaign

    StepTimes, Sabotage, KillProof = _callbacks()
    work = tmp_path_factory.mktemp("campaign-time")
    out: dict = {"package": work / "pkg"}
    with torch_threads(1), contextlib.chdir(work):
        campaign = open_campaign(Path("pkg"), "campaign-time", "Does the control's loss fall on toy sequences?",
                                 "toy", "v1", EVAL_IDS, train_ids=TRAIN_IDS)
        campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}],
                              reserved_hours=1, started_at=STARTED)
        campaign.declare_stop_rules(RULES)

        control = campaign.run("control", "control", params={"model": "tiny-gpt2"})
        control.inputs("eval", len(EVAL_IDS), 0)
        times = StepTimes(control)
        trainer = train(control, "pkg/checkpoints/control", max_steps=8, before=[times])
        out["running_at_train_end"] = bool(control.proofs.running())
        out["control_times"] = times.times
        write_predictions(control, trainer.model)
        # The campaign's clock counts seconds: a control that starts and ends within one (a fast machine, its proof
        # forked from a warm shared zygote) would have no duration to price its saves against, nor to overlap.
        time.sleep(1.0)
        control.complete()  # waits for the proof

        sabotaged = campaign.run("sabotaged", "variant", params={"sabotage": "optimizer.pt cut in half"})
        sabotaged.inputs("eval", len(EVAL_IDS), 0)
        out["sabotaged_steps"] = train(sabotaged, "pkg/checkpoints/sabotaged", before=[Sabotage(sabotaged)]
                                       ).state.global_step

        killed = campaign.run("killed", "variant", params={"proof": "killed"})
        killed.inputs("eval", len(EVAL_IDS), 0)
        killer = KillProof(killed)
        trainer = train(killed, "pkg/checkpoints/killed", after=[killer])
        out["killed_pid"], out["killed_steps"] = killer.killed, trainer.state.global_step
        write_predictions(killed, trainer.model)
        killed.complete()

        truncated = campaign.run("truncated", "variant", params={"max_length": 4})
        out["early_violation"] = truncated.inputs("eval", len(EVAL_IDS), 2)
        out["truncated_steps"] = train(truncated, "pkg/checkpoints/truncated", save_steps=None).state.global_step

        ceiling = campaign.run("ceiling", "variant", params={"eval": "every 2 steps"})
        ceiling.inputs("eval", len(EVAL_IDS), 0)
        out["ceiling_steps"] = train(ceiling, "pkg/checkpoints/ceiling", save_steps=None, eval_steps=2
                                     ).state.global_step
        out["manifest"] = campaign.close("positive", "the control's loss falls.", accepted=["control", "killed"],
                                         error_analysis="# Errors\n\nToy data.\n")
    out["stops"] = {s["run"]: s for s in json.loads((out["package"] / "stops.json").read_text())["stops"]}
    out["runs"] = {r["id"]: r for r in out["manifest"]["runs"]}
    return out


def test_every_save_is_priced_with_its_step_time_write_seconds_and_bytes(campaign):
    saves = campaign["runs"]["control"]["checkpoints"]
    assert [c["step"] for c in saves] == [2, 4, 6, 8]
    for save in saves:
        folder = campaign["package"] / f"checkpoints/control/checkpoint-{save['step']}"
        on_disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        assert save["artifact"] == f"control-checkpoint-{save['step']}" and save["bytes"] == on_disk
        assert 0 < save["write_seconds"] < 30 and save["saved_at"].endswith("Z")


def test_the_first_checkpoint_is_proven_in_the_background_at_the_lowest_priority(campaign):
    first, *later = campaign["runs"]["control"]["checkpoints"]
    proof = first["proof"]
    assert proof["ok"] is True and proof["codes"] == [] and proof["device"] == "cpu"
    assert proof["priority"] == {"nice": 19, "ioprio": "idle"} and proof["seconds"] > 0
    assert proof["confinement"].startswith("landlock ABI")  # its reload child confined itself (reload/confine.py)
    assert all("proof" not in c for c in later)  # prove_resume="first"


def test_a_training_step_never_waits_for_the_proof(campaign):
    # The proof (a new interpreter importing torch and transformers, then the reload) outlives the 6 steps after
    # the save: had a step waited for it, the proof would have ended before the training did.
    assert campaign["running_at_train_end"]
    during = [seconds for _, seconds, running in campaign["control_times"] if running]
    assert during and max(during) < 2.0, campaign["control_times"]
    assert campaign["runs"]["control"]["checkpoints"][0]["proof"]["proof_seconds"] > 3 * max(during)


def test_a_sabotaged_first_checkpoint_stops_its_run_under_no_usable_resume(campaign):
    stop = campaign["stops"]["sabotaged"]
    assert stop["rule"] == "no-resume" and stop["step"] == 3 == campaign["sabotaged_steps"]
    assert "sabotaged-checkpoint-2" in stop["reason"] and "optimizer.pt" in stop["reason"]
    assert "IV5" in stop["reason"]
    proof = campaign["runs"]["sabotaged"]["checkpoints"][0]["proof"]
    assert proof["ok"] is False and proof["codes"] and campaign["runs"]["sabotaged"]["status"] == "stopped"


def test_a_killed_proof_is_recorded_and_the_training_goes_on(campaign):
    assert campaign["killed_pid"] is not None and campaign["killed_steps"] == 6
    proof = campaign["runs"]["killed"]["checkpoints"][0]["proof"]
    assert proof["ok"] is False and proof["codes"] == [] and "killed by SIGKILL" in proof["error"]
    assert campaign["runs"]["killed"]["status"] == "completed"


def test_a_truncated_eval_input_stops_the_run_at_train_begin(campaign):
    assert campaign["early_violation"].rule == "truncated"
    stop = campaign["stops"]["truncated"]
    # Decided at train begin (step 0); the Trainer only reads should_training_stop at a step's end.
    assert stop["rule"] == "truncated" and stop["step"] == 0 and campaign["truncated_steps"] == 1
    assert "2 eval input(s) truncated" in stop["reason"]
    lines = [json.loads(x) for x in (campaign["package"] / "metrics/truncated.jsonl").read_text().splitlines()]
    assert {"step": 0, "name": "inputs_truncated/eval", "value": 2} in lines


def test_an_eval_loss_ceiling_stops_the_run_at_its_first_evaluation(campaign):
    stop = campaign["stops"]["ceiling"]
    assert stop["rule"] == "eval-loss-ceiling" and stop["step"] == 2 == campaign["ceiling_steps"]
    assert "above the ceiling 0.5" in stop["reason"]


def test_train_ids_are_recorded_with_their_hash(campaign):
    corpus = campaign["manifest"]["corpus"]
    assert corpus["train_ids"] == "corpus/train_ids.txt" and len(corpus["train_ids_sha256"]) == 64
    assert (campaign["package"] / "corpus/train_ids.txt").read_text().split() == TRAIN_IDS


def cli(package: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / ".venv/bin/itera-verify"), str(package), "--no-reload", "--no-seal", *extra],
                          capture_output=True, text=True, timeout=300, check=False)


def test_verify_shows_the_saves_the_proofs_and_the_rentals_end(campaign):
    done = cli(campaign["package"], "--format", "json")
    report = json.loads(done.stdout)
    codes = {(f["code"], f.get("run")) for f in report["findings"]}
    assert ("IV413", "killed") in codes  # its only proof did not conclude
    assert not {c for c, _ in codes} & {"IV412", "IV414", "IV613", "IV309"}, report["findings"]
    saves = {r["id"]: r.get("saves") for r in report["runs"]}
    assert saves["control"]["count"] == 4 and saves["control"]["interval_steps"] == 2
    assert saves["control"]["proof_ok"] is True and saves["control"]["at_risk_steps"] == 2
    assert 0 < saves["control"]["saving_share"] < 1 and saves["sabotaged"]["proof_ok"] is False
    rental = report["plan"]["rental"]
    ends = datetime.fromisoformat(STARTED) + timedelta(days=3)
    assert rental["ends_at"] == ends.strftime("%Y-%m-%dT%H:%M:%SZ") and rental["fits"] is True
    text = cli(campaign["package"]).stdout
    assert "Saves" in text and "the rental ends at" in text
    page = cli(campaign["package"], "--format", "html").stdout
    assert "Saves and resume proofs" in page and "its resume proof failed at step 2" in page
    assert "stopped at step 3 (no-resume)" in page


def test_a_deadline_the_seal_cannot_meet_is_warned_before_the_checks(campaign):
    # A rental that has ended is said at once, before the checks (a deadline a second away raced the CLI's start).
    past = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = cli(campaign["package"], "--deadline", past, "--format", "json")
    assert "WARNING" in done.stderr and "rental ended" in done.stderr
    assert json.loads(done.stdout)["plan"]["rental"]["source"] == "--deadline"
    assert cli(campaign["package"], "--deadline", "tomorrow").returncode == 2
    # One that ends before the seal would finish, at the rate the estimate uses, is said too.
    from itera_verify.report import summary

    now = datetime.now(UTC)
    package = context(campaign["package"], deadline=(now + timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert "warning" not in summary.rental_summary(package, now=now)
    from itera_verify.seal.rate import Measured

    slow = Measured(1024, 1024, 1.0, 3, 1)  # a machine measured 200 000 times slower
    assert "may not finish in time" in summary.rental_summary(package, now=now, measured=slow)["warning"]


def findings_of(package: Path) -> list:
    from itera_verify.rules import Selection
    from itera_verify.flows.checks import run_checks

    return run_checks(context(package), Selection(), "static")


def edit_manifest(package: Path, change) -> None:
    manifest = json.loads((package / "manifest.json").read_text())
    change(manifest)
    (package / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_a_failed_proof_in_an_accepted_run_is_IV414(campaign, tmp_path):
    package = Path(shutil.copytree(campaign["package"], tmp_path / "pkg"))

    def fail_control_proof(manifest):
        proof = manifest["runs"][0]["checkpoints"][0]["proof"]
        proof.update(ok=False, codes=["IV504"], error="optimizer.pt cut short")

    edit_manifest(package, fail_control_proof)
    found = [f for f in findings_of(package) if f.code == "IV414"]
    assert [f.run for f in found] == ["control"] and "control-checkpoint-2" in found[0].message


def test_two_runs_overlapping_on_the_one_gpu_of_the_plan_is_IV613(campaign, tmp_path):
    package = Path(shutil.copytree(campaign["package"], tmp_path / "pkg"))
    runs = campaign["runs"]
    assert not [f for f in findings_of(package) if f.code == "IV613"]  # one after the other: fine

    def overlap(manifest):
        killed = next(r for r in manifest["runs"] if r["id"] == "killed")
        killed["started_at"] = runs["control"]["started_at"]
        killed["ended_at"] = (datetime.fromisoformat(runs["control"]["ended_at"]) + timedelta(minutes=5)
                              ).strftime("%Y-%m-%dT%H:%M:%SZ")

    edit_manifest(package, overlap)
    found = [f for f in findings_of(package) if f.code == "IV613"]
    # killed now overlaps the control and the sabotaged run that ran after it: each moment once.
    assert found and all("need 2 GPUs" in f.message and "the lots hold 1" in f.message for f in found)
    assert all("killed (1)" in f.message for f in found) and "control (1)" in found[0].message


def test_an_eval_id_among_the_training_ids_is_IV309(campaign, tmp_path):
    package = Path(shutil.copytree(campaign["package"], tmp_path / "pkg"))
    assert not [f for f in findings_of(package) if f.code == "IV309"]
    (package / "corpus/train_ids.txt").write_text("\n".join(TRAIN_IDS + [EVAL_IDS[3]]) + "\n")
    found = [f for f in findings_of(package) if f.code == "IV309"]
    assert len(found) == 1 and EVAL_IDS[3] in found[0].message


def test_an_accepted_run_without_its_input_counts_is_IV412(campaign, tmp_path):
    package = Path(shutil.copytree(campaign["package"], tmp_path / "pkg"))
    metrics = package / "metrics/control.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines() if "inputs_" not in line))
    found = [f for f in findings_of(package) if f.code == "IV412"]
    assert [f.run for f in found] == ["control"] and "never recorded its eval inputs" in found[0].message


def test_count_truncated_counts_what_a_tokenizer_would_cut():
    from itera_verify.integrations import count_truncated

    from tests.test_delivered_tokenizer import word_tokenizer

    tokenizer = word_tokenizer()
    texts = ["a b", "a b c d e f", "a", "a b c d e"]
    lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
    assert lengths == [2, 6, 1, 5]
    assert count_truncated(tokenizer, texts, max_length=4) == (4, 2)
    assert count_truncated(tokenizer, [(t, t) for t in texts], max_length=3) == (4, 3)  # pairs: 4, 12, 2, 10
