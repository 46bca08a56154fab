"""The text report's runs table (issue 19): the metrics that the question and the stop rules name come first, and
one line per run at 120 columns, however many metrics the Trainer logged."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_cli, context

WIDTH = 120
# What a real Trainer logs besides the campaign's own metrics, first-seen before them in a metrics file.
TRAINER_METRICS = {"loss": 4.61, "grad_norm": 1.25, "learning_rate": 0.0002, "epoch": 0.5, "eval_loss": 4.7,
                   "eval_runtime": 1.234, "eval_samples_per_second": 812.5, "eval_steps_per_second": 101.6,
                   "train_samples_per_second": 95.1, "total_flos": 123456.0}


def runs_table(output: str) -> list[str]:
    """The lines of the Runs table: its header, the rule and one line per run (the notes below are indented)."""
    lines = output.splitlines()
    start = lines.index("Runs") + 1
    end = next(i for i in range(start, len(lines)) if not lines[i] or lines[i].startswith("  "))
    return lines[start:end]


def text_report(package_dir: Path) -> str:
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "text")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def metric_headers(table: list[str]) -> list[str]:
    header = table[0].split()
    return header[header.index("reason") + 1:]


def test_fixture_runs_table_fits_120_columns_with_the_named_metrics_first(package_dir):
    output = text_report(package_dir)
    table = runs_table(output)
    assert all(len(line) <= WIDTH for line in table)
    assert len(table) == 2 + 3  # header, rule, one line per run: nothing wrapped
    # The question asks about macro-F1 (eval_macro_f1); the nonfinite_loss rule names train_loss.
    assert metric_headers(table)[:2] == ["eval_macro_f1", "train_loss"]
    assert "lora-r64 stopped by nonfinite-loss: train_loss became NaN at step 3" in output  # the reason, whole


def test_trainer_metrics_logged_first_do_not_push_the_named_ones_out(package_dir):
    for metrics_file in (package_dir / "metrics").glob("*.jsonl"):
        logged = {json.loads(line)["name"] for line in metrics_file.read_text().splitlines() if line.strip()}
        extra = [json.dumps({"step": 1, "name": name, "value": value}) for name, value in TRAINER_METRICS.items()
                 if name not in logged]
        metrics_file.write_text("\n".join(extra) + "\n" + metrics_file.read_text())
    output = text_report(package_dir)
    table = runs_table(output)
    assert all(len(line) <= WIDTH for line in table), [len(line) for line in table]
    assert len(table) == 2 + 3
    assert metric_headers(table)[:2] == ["eval_macro_f1", "train_loss"]
    assert "more metrics not shown" in output


def test_named_metrics_follow_the_question_then_the_stop_rules(package_dir):
    from itera_verify.report.summary import named_metrics

    manifest = json.loads((package_dir / "manifest.json").read_text())
    manifest["question"] = "Does the LoRA variant keep train loss within 5% of the control?"
    (package_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    # "train loss" names train_loss (and the Trainer's per-step `loss`, where the control logs it); then the
    # metric of the stop rules not named yet: the floor's.
    names = named_metrics(context(package_dir))
    assert names[0] == "train_loss" and names[-1] == "eval_macro_f1" and set(names[1:-1]) <= {"loss"}, names
