"""IV411: every process of a multi-process run wrote its own record (issue 25). Planted in the package the
multi-process fixture builds: each loss and grad_norm line followed, in place, by the other rank's own value,
and a second stop record for the stopped run; a resumed run repeating a block of steps once is not this."""
from __future__ import annotations

import json
from pathlib import Path

from fixtures.edit import edit_json
from tests.helpers import codes, static_findings

METRICS = "metrics/control.jsonl"


def iv411(package: Path) -> list:
    return [f for f in static_findings(package, select=("IV411",)) if f.code == "IV411"]


def records(package: Path) -> list[dict]:
    return [json.loads(line) for line in (package / METRICS).read_text().splitlines()]


def write(package: Path, lines: list[dict]) -> None:
    (package / METRICS).write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_each_loss_line_written_by_both_ranks_is_IV411(multigpu_dir):
    lines = []
    for record in records(multigpu_dir):
        lines.append(record)
        if record["name"] in ("loss", "grad_norm"):  # rank 1 appends its own value right after rank 0's
            lines.append(dict(record, value=record["value"] * 1.03))
    write(multigpu_dir, lines)
    [finding] = iv411(multigpu_dir)
    assert (finding.path, finding.run) == (METRICS, "control")
    assert finding.line == 2 and "4 of its 4 steps" in finding.message and "rank 0" in finding.message


def test_a_resumed_run_repeating_a_block_of_steps_once_is_not_IV411(multigpu_dir):
    # Crashed after step 4, resumed from step 2: steps 3 and 4 are logged again, with other values.
    lines = records(multigpu_dir)
    write(multigpu_dir, lines + [dict(r, value=r["value"] + 0.01) for r in lines if r["step"] in (3, 4)])
    assert iv411(multigpu_dir) == []


def test_a_resume_repeating_only_the_step_it_crashed_at_is_not_IV411(multigpu_dir):
    lines = records(multigpu_dir)
    last = [dict(r, value=r["value"] + 0.01) for r in lines if r["step"] == 4]
    write(multigpu_dir, lines + last)
    assert iv411(multigpu_dir) == []


def test_the_same_value_written_twice_is_not_IV411(multigpu_dir):
    lines = []
    for record in records(multigpu_dir):
        lines += [record, record] if record["name"] == "loss" else [record]
    write(multigpu_dir, lines)
    assert iv411(multigpu_dir) == []


def test_two_stop_records_for_one_run_are_IV411(multigpu_dir):
    edit_json(multigpu_dir, "stops.json",
              lambda s: s["stops"].append(dict(s["stops"][0], at="2026-11-20T09:40:01Z")))
    [finding] = iv411(multigpu_dir)
    assert (finding.path, finding.pointer, finding.run) == ("stops.json", "/stops/1", "lora-r64")


def test_clean_multigpu_package_has_no_IV411(multigpu_dir):
    assert "IV411" not in codes(static_findings(multigpu_dir))
