"""Progress on standard error (issue 19): it names the artifact being reloaded and the time left, as
docs/integration.md promises; -v adds what it says; a run that seals nothing never says "sealing … done"."""
from __future__ import annotations

import pytest
import io
import re

from tests.helpers import run_cli

ARTIFACTS = ("control-model", "control-resume", "lora-r16-adapter", "lora-r16-resume")
SEAL_DONE = re.compile(r"^sealing \S+: done", re.M)


def test_failed_run_never_says_sealing_done(package_dir, tmp_path):
    (package_dir / "checkpoints/control/checkpoint-4/optimizer.pt").unlink()  # IV507: the checks fail
    result = run_cli(package_dir, "--no-reload", "-o", tmp_path)
    assert result.returncode == 1, result.stderr
    assert "sealing reviews-lora-2026-11.tar.zst: started" in result.stderr  # the seal ran beside the checks
    assert not SEAL_DONE.search(result.stderr), result.stderr
    assert "sealing reviews-lora-2026-11.tar.zst: stopped, nothing sealed" in result.stderr
    assert not list(tmp_path.glob("*.tar.zst"))


def test_passing_run_says_sealing_done(package_dir, tmp_path):
    result = run_cli(package_dir, "--no-reload", "-o", tmp_path)
    assert result.returncode == 0, result.stderr
    assert SEAL_DONE.search(result.stderr) and "nothing sealed" not in result.stderr


@pytest.mark.slow
def test_reload_progress_names_each_artifact_and_the_time_left(package_dir, hf_cache):
    result = run_cli(package_dir, "--no-seal", "--hf-cache", hf_cache)
    assert result.returncode == 0, result.stderr
    for artifact in ARTIFACTS:
        assert re.search(rf"^reloading artifacts: {artifact} started \(\d of 4", result.stderr, re.M), result.stderr
    assert re.search(r"^reloading artifacts: [1-3]/4 artifacts, [\d.]+ s, (about \d+ s|under 1 s) left$",
                     result.stderr, re.M), result.stderr
    # Without -v: no per-artifact timing lines, no forward-pass detail, no elapsed line in the report.
    assert " done in " not in result.stderr
    assert "finite output" not in result.stdout and "elapsed" not in result.stdout


@pytest.mark.slow
def test_verbose_adds_each_reloads_time_its_forward_pass_and_the_elapsed_time(package_dir, hf_cache):
    result = run_cli(package_dir, "--no-seal", "-v", "--hf-cache", hf_cache)
    assert result.returncode == 0, result.stderr
    for artifact in ARTIFACTS:
        assert re.search(rf"^reloading artifacts: {artifact} done in [\d.]+ s$", result.stderr, re.M), result.stderr
    assert "finite output" in result.stdout  # what each passing reload's forward pass proved
    assert re.search(r"^elapsed [\d.]+ s$", result.stdout, re.M)


def test_verbose_reports_progress_every_ten_percent():
    from itera_verify.cli.progress import LinesProgress

    def lines(verbose: bool) -> list[str]:
        stream = io.StringIO()
        progress = LinesProgress(stream, verbose=verbose)
        progress.start("seal", "sealing x.tar.zst", total=100, unit="B")
        for _ in range(100):
            progress.advance("seal", 1)
        progress.finish("seal")
        return [line for line in stream.getvalue().splitlines() if "%" in line]

    assert len(lines(verbose=False)) == 3 and len(lines(verbose=True)) == 9  # 25/50/75 and 10…90


def test_bars_keep_an_abandoned_seal_unfinished_and_say_why():
    from itera_verify.cli.progress import BarsProgress

    progress = BarsProgress(io.StringIO())
    progress.start("seal", "sealing x.tar.zst", total=100, unit="B")
    progress.advance("seal", 40)
    progress.abandon("seal", "stopped, nothing sealed")
    progress.finish("seal")  # a later finish (the workflow's cleanup) changes nothing
    [task] = progress.bars.tasks
    assert task.completed == 40 and not task.finished
    assert task.description == "sealing x.tar.zst: stopped, nothing sealed"


def test_bars_name_the_artifacts_in_progress():
    from itera_verify.cli.progress import BarsProgress

    progress = BarsProgress(io.StringIO())
    progress.start("reload", "reloading artifacts", total=2, unit="artifacts")
    progress.began("reload", "control-model")
    progress.began("reload", "lora-r16-adapter")
    [task] = progress.bars.tasks
    assert task.description == "reloading artifacts: control-model, lora-r16-adapter"
    progress.ended("reload", "control-model")
    assert progress.bars.tasks[0].description == "reloading artifacts: lora-r16-adapter"
