"""What the command line writes where: format choice, several report files in one run, progress on stderr."""
from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from itera_verify.cli.progress import make_progress
from itera_verify.runtime.progress import NULL_PROGRESS
from tests.helpers import run_cli
from tests.test_config import drop_last_prediction
from tests.test_renderers import WORKFLOW_COMMAND

ANSI = re.compile(r"\x1b\[")


def test_github_actions_gets_workflow_commands_by_default(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    result = run_cli(package_dir, "--no-reload", "--no-seal", cwd=tmp_path, env={"GITHUB_ACTIONS": "true"})
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and lines and all(WORKFLOW_COMMAND.match(line) for line in lines), result.stdout
    assert any(line.startswith("::error file=") and "predictions/lora-r16.jsonl" in line and "title=IV303::" in line
               for line in lines)
    assert lines[-1].startswith("::error title=itera-verify::FAIL: 1 error (IV303)")


def test_an_explicit_format_wins_over_github_actions(package_dir, tmp_path):
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "text", cwd=tmp_path,
                     env={"GITHUB_ACTIONS": "true"})
    assert result.stdout.splitlines()[-1].startswith("PASS:")


def test_several_report_files_in_one_run(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    out = tmp_path / "reports"
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--report", f"json={out / 'report.json'}",
                     "--report", f"html={out / 'report.html'}", "--report", f"junit={out / 'junit.xml'}",
                     "--report", f"github={out / 'annotations.txt'}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1].startswith("FAIL: 1 error (IV303)")  # text still on stdout
    document = json.loads((out / "report.json").read_text())
    assert [f["code"] for f in document["findings"]] == ["IV303"]
    page = (out / "report.html").read_text()
    assert all(run in page for run in ("control", "lora-r16", "lora-r64")) and "IV303" in page
    suites = ET.parse(out / "junit.xml").getroot()
    assert suites.get("failures") == "1" and suites.get("skipped") == "1"
    assert WORKFLOW_COMMAND.match((out / "annotations.txt").read_text().splitlines()[0])


def test_json_on_stdout_is_exactly_one_document_and_progress_goes_to_stderr(package_dir, tmp_path):
    result = run_cli(package_dir, "--no-reload", "-o", tmp_path, "--format", "json", cwd=tmp_path)
    document = json.loads(result.stdout)  # the whole of stdout, nothing before or after
    assert document["verdict"] == "pass" and document["sealed"] is True
    assert re.search(r": done, .* in \d+\.\d s$", result.stderr, re.M), result.stderr
    assert not ANSI.search(result.stderr)


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(package_dir, tmp_path):
    result = run_cli(package_dir, "--no-reload", "-o", tmp_path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert any(line.endswith(": started") or ": started (" in line for line in lines), result.stderr
    assert not ANSI.search(result.stderr) and "\r" not in result.stderr


def test_quiet_prints_only_findings_and_the_verdict(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    result = run_cli(package_dir, "--no-reload", "-o", tmp_path, "-q", cwd=tmp_path)
    assert result.returncode == 1 and result.stderr == ""
    assert "IV303" in result.stdout and "Budget" not in result.stdout and "Runs" not in result.stdout
    assert result.stdout.splitlines()[-1].startswith("FAIL:")


# ----------------------------------------------------------------------------- the progress sinks themselves

class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drive(progress) -> None:
    progress.start("hash", "hashing files", total=8 << 20, unit="B")
    for _ in range(8):
        progress.advance("hash", 1 << 20)
    progress.finish("hash")
    progress.start("reload", "reloading artifacts", total=2, unit="artifacts")
    progress.log("control-model: ok [red]not markup[/]")
    progress.advance("reload")
    progress.advance("reload")
    progress.finish("reload")


def test_plain_progress_lines_for_a_log():
    stream = io.StringIO()
    with make_progress(stream=stream) as progress:
        drive(progress)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "hashing files: started (8.0 MiB)"
    assert [line.split(" (")[0] for line in lines[1:4]] == ["hashing files: 25%", "hashing files: 50%",
                                                              "hashing files: 75%"]
    assert re.fullmatch(r"hashing files: done, 8\.0 MiB in \d+\.\d s", lines[4])
    assert lines[5:7] == ["reloading artifacts: started (2 artifacts)", "control-model: ok [red]not markup[/]"]
    # each count with the time so far and, until the last, the time left (issue 19)
    assert re.fullmatch(r"reloading artifacts: 1/2 artifacts, \d+\.\d s, (under 1 s|about \d+ s) left", lines[7])
    assert re.fullmatch(r"reloading artifacts: 2/2 artifacts, \d+\.\d s", lines[8])
    assert not ANSI.search(stream.getvalue())


def test_verbose_plain_progress_is_denser():
    stream = io.StringIO()
    with make_progress(verbose=True, stream=stream) as progress:
        drive(progress)
    assert sum("hashing files: " in line and "%" in line for line in stream.getvalue().splitlines()) >= 7


def test_a_terminal_gets_bars_with_elapsed_and_remaining_time():
    stream = Terminal()
    with make_progress(stream=stream) as progress:
        drive(progress)
    shown = stream.getvalue()
    assert ANSI.search(shown) and "8.0 MiB / 8.0 MiB" in shown and "2 / 2 artifacts" in shown
    assert "elapsed" in shown and "left" in shown and "control-model: ok [red]not markup[/]" in shown


def test_quiet_shows_no_progress():
    with make_progress(quiet=True, stream=Terminal()) as progress:
        assert progress is NULL_PROGRESS


# ----------------------------------------------------------------------------- integration files

ROOT = Path(__file__).resolve().parents[1]


def test_the_documented_python_api_example_runs(package_dir, capsys):
    text = (ROOT / "docs" / "integration.md").read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(example.replace('"outdir/"', repr(str(package_dir))), "integration.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "pass" and printed[-1] == "24.32"


def test_pre_commit_hook_runs_the_installed_command():
    import tomllib

    import yaml

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "itera-verify")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert hook["entry"] in scripts and hook["language"] == "python" and hook["pass_filenames"] is False
    assert "--no-reload" in hook["args"] and "--no-seal" in hook["args"]


def test_the_sealed_archive_holds_the_html_report(package_dir, tmp_path):
    import tarfile

    import zstandard

    result = run_cli(package_dir, "--no-reload", "-o", tmp_path, "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    archive = next(tmp_path.glob("*.tar.zst"))
    with archive.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar if m.name.endswith("SEAL/report.html")}
    (name, page), = members.items()
    text = page.decode("utf-8")
    assert name == "reviews-lora-2026-11/SEAL/report.html"
    assert all(run in text for run in ("control", "lora-r16", "lora-r64")) and "24.32 USD" in text
    assert "artifacts NOT reloaded (--no-reload); sealed reviews-lora-2026-11.tar.zst" in text
    assert not re.search(r"https?://", text)
