"""What a hostile sender can put in front of the reviewer besides the package (issue 23, items 6 and 7): its
own configuration in the extracted folder, a record claiming its rule levels, strings that would start a line
of their own (a GitHub workflow command, a terminal escape), a record nested past any parser's depth, and a
model equal to its base that a header-only extraction would have called trained."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from itera_verify.flows.audit import audit
from itera_verify.seal import seal_package
from tests.helpers import cli_environment, context, run_cli
from tests.tar_forms import gnu_extract, payload_pickle
from itera_verify import settle

# Every audit here makes its private folder in the test's own temporary folder (conftest.private_tmp).
pytestmark = pytest.mark.usefixtures("private_tmp")

CAMPAIGN = "reviews-lora-2026-11"
HOSTILE = ("x\n::add-mask::secret\r\n::stop-commands::tok\n  ::notice title=fake::all good\x1b]0;owned\x07"
           "\x1b[2J\u2028::warning::u2028 ##[add-mask]legacy \x9b31m")


def sealed_as_is(package: Path, archive: Path, record: bytes | None = None) -> Path:
    """`package` sealed by the tool's own seal, whatever its checks would say, with `record` as
    SEAL/verification.json: the archive is canonical, only its content and record are the sender's."""
    recorded = record if record is not None else json.dumps({"tool": "itera-verify", "version": "0.1.0",
                                                             "verdict": "pass", "findings": []}).encode()
    seal_package(context(package), CAMPAIGN, {"SEAL/verification.json": recorded}, archive)
    return archive


def copy_of(built, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True))


# ---- whose configuration ------------------------------------------------------------------------------------
@pytest.fixture
def extracted(built, tmp_path) -> tuple[Path, Path]:
    """(the archive, the folder GNU tar extracted it into): a package with a temporary path (IV201) whose
    sender ships an itera-verify.toml ignoring it, at the top and in a subfolder."""
    pkg = copy_of(built, tmp_path)
    (pkg / "analysis" / "notes.json").write_text(json.dumps({"scratch": "/tmp/run-7/ckpt"}))
    (pkg / "itera-verify.toml").write_text('ignore = ["IV201"]\n')
    (pkg / "analysis" / "pyproject.toml").write_text('[tool.itera-verify]\nignore = ["IV201"]\n')
    reviews = tmp_path / "reviews"
    reviews.mkdir()
    archive = sealed_as_is(pkg, reviews / f"{CAMPAIGN}.tar.zst")
    assert gnu_extract(archive, reviews) == 0
    return archive, reviews / CAMPAIGN


@pytest.mark.parametrize("where", [".", "analysis"])
def test_a_senders_config_in_the_extracted_folder_is_not_applied(extracted, where):
    archive, folder = extracted
    result = run_cli("audit", archive, "--format", "json", cwd=folder / where)
    report = json.loads(result.stdout)
    assert result.returncode == 1, result.stderr
    assert any(f["code"] == "IV201" for f in report["findings"])
    assert report["configuration"]["applied"] is None
    passed_over = {entry["path"] for entry in report["configuration"]["not_applied"]}
    assert str(folder / "itera-verify.toml") in passed_over
    assert all("manifest.json" in entry["why"] for entry in report["configuration"]["not_applied"])
    text = run_cli("audit", archive, cwd=folder / where).stdout
    assert "configuration: none" in text and f"not applied: {folder / 'itera-verify.toml'}" in text


def test_the_reviewers_config_above_the_extracted_folder_still_applies(extracted):
    archive, folder = extracted
    own = folder.parent / "itera-verify.toml"
    own.write_text('ignore = ["IV201"]\n')
    result = run_cli("audit", archive, "--format", "json", cwd=folder / "analysis")
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout[-2000:]
    assert report["configuration"]["applied"] == str(own)
    assert f"configuration {own}" in run_cli("audit", archive, cwd=folder).stdout


def test_a_config_named_with_config_inside_the_extracted_folder_is_exit_2(extracted):
    archive, folder = extracted
    result = run_cli("audit", archive, "--config", "itera-verify.toml", cwd=folder)
    assert result.returncode == 2 and "extracted package" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_seal_folder_alone_marks_an_extracted_package(extracted, tmp_path):
    """The sender writes the manifest: a folder holding SEAL/ and no manifest.json is still the sender's."""
    archive, folder = extracted
    (folder / "manifest.json").unlink()
    result = run_cli("audit", archive, "--format", "json", cwd=folder)
    assert json.loads(result.stdout)["configuration"]["applied"] is None and result.returncode == 1


# ---- "explained by configuration" ---------------------------------------------------------------------------
def test_a_sender_record_claiming_IV506_was_a_warning_does_not_explain_it(built, tmp_path):
    marker = tmp_path / "payload-ran"
    pkg = copy_of(built, tmp_path)
    (pkg / "analysis" / "stats.pkl").write_bytes(payload_pickle(marker))
    record = {"tool": "itera-verify", "version": "0.1.0", "verdict": "pass", "campaign_id": CAMPAIGN,
              "findings": [{"code": "IV506", "severity": "warning", "path": "analysis/stats.pkl"}],
              "rules": {"IV506": {"severity": "warning", "title": "pickle refers to a global outside the allowlist"}}}
    report = audit(sealed_as_is(pkg, tmp_path / "a.tar.zst", json.dumps(record).encode()))
    comparison = report.audit["comparison"]
    assert "IV506" in {f.code for f in report.blocking()}
    assert comparison["explained_by_configuration"] == []
    assert {"code": "IV506", "sender": "warning"} in comparison["not_believed"]
    contradicted = [f for f in report.findings if f.code == "IV701" and f.path.endswith("SEAL/verification.json")]
    assert contradicted and "IV506" in contradicted[0].message
    assert not marker.exists()


def test_a_warning_the_reviewer_raised_to_error_is_explained_by_configuration(built, tmp_path):
    """IV202 is a warning by default: the sender's pass is honest, the reviewer's stricter level explains it."""
    pkg = copy_of(built, tmp_path)
    (pkg / "analysis" / "notes.json").write_text(json.dumps({"data": "/home/alice/data/reviews.jsonl"}))
    (tmp_path / "out").mkdir()
    from itera_verify import verify

    sent = verify(pkg, settle(reload=False, output=tmp_path / "out"))
    assert sent.sealed and "IV202" in {f.code for f in sent.findings}
    (tmp_path / "itera-verify.toml").write_text('levels = { IV202 = "error" }\n')
    result = run_cli("audit", tmp_path / "out" / f"{CAMPAIGN}.tar.zst", "--format", "json", cwd=tmp_path)
    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert report["audit"]["comparison"]["explained_by_configuration"] == ["IV202"]
    assert not [f for f in report["findings"] if f["code"] == "IV701"]


# ---- one line per value ---------------------------------------------------------------------------------------
@pytest.fixture
def hostile_archive(built, tmp_path) -> Path:
    """An artifact id and a stop reason holding newlines, workflow commands, ESC/OSC/CSI and U+2028."""
    pkg = copy_of(built, tmp_path)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["artifacts"][0]["id"] = HOSTILE
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    stops = json.loads((pkg / "stops.json").read_text())
    stops["stops"][0]["reason"] = HOSTILE
    (pkg / "stops.json").write_text(json.dumps(stops))
    return sealed_as_is(pkg, tmp_path / "hostile.tar.zst")


ANNOTATION = re.compile(r"::(error|warning|notice) [^:\n]*::")  # properties escape `:` as %3A


def assert_plain(output: bytes, annotations: bool = False) -> None:
    """No control character but the line ends, no ANSI/OSC, and no line a GitHub runner reads as a command
    (after leading blanks) other than the tool's own annotations."""
    text = output.decode("utf-8")
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f\x80-\x9f\u2028\u2029]", text), repr(text[:3000])
    for line in text.split("\n"):
        if line.lstrip().startswith("::"):
            assert annotations and ANNOTATION.match(line), repr(line)
        else:  # the runner reads `##[command]` anywhere in a line that is not a `::` command
            assert "##[" not in line, repr(line)


@pytest.mark.parametrize("fmt", ["text", "github"])
def test_hostile_strings_stay_one_escaped_line_in_the_audit_output(hostile_archive, tmp_path, fmt):
    # Bytes, not text: text mode would turn a raw CR into a line end before the test could see it.
    result = subprocess.run([sys.executable, "-m", "itera_verify", "audit", str(hostile_archive), "--format", fmt,
                             "-v"], cwd=tmp_path, capture_output=True, timeout=600,
                            env=cli_environment())
    assert result.returncode == 1
    assert_plain(result.stdout, annotations=fmt == "github")
    assert_plain(result.stderr)
    shown = result.stdout.decode()
    assert "add-mask::secret" in shown  # shown, escaped, never at the start of a line
    if fmt == "text":  # the stop reason, in the runs table and whole below it
        assert "\\x1b]0;owned\\x07\\x1b[2J\\u2028" in shown


def test_progress_lines_show_a_hostile_artifact_id_on_one_line():
    import io

    from itera_verify.cli.progress import LinesProgress

    stream = io.StringIO()
    progress = LinesProgress(stream, verbose=True)
    progress.start("reload", "reloading", total=1, unit="artifacts")
    progress.began("reload", HOSTILE)
    progress.ended("reload", HOSTILE, ok=False)
    progress.log(f"{HOSTILE} left a file behind")
    progress.abandon("reload", HOSTILE)
    assert_plain(stream.getvalue().encode())
    assert len(stream.getvalue().splitlines()) == 5
    assert "x\\n\\x3a:add-mask::secret" not in stream.getvalue()  # mid-line: escaped newline, colons kept
    assert "x\\n::add-mask::secret" in stream.getvalue()


def test_every_renderer_shows_hostile_values_escaped():
    """Every value a report carries from a package (path, message, pointer, run, artifact, reload error, stop
    reason, record claims), in every format: no raw control character; text and github never start a command."""
    from itera_verify.report import renderer
    from tests.test_renderers import sample_report

    report = sample_report()
    for finding in report.findings:
        finding.path, finding.message, finding.pointer = HOSTILE, HOSTILE, f"/{HOSTILE}"
    report.reloads[2].artifact, report.reloads[2].error = HOSTILE, HOSTILE
    for run in report.runs:
        run["id"], run["stop_reason"] = HOSTILE, HOSTILE
    report.configuration = {"applied": HOSTILE, "not_applied": [{"path": HOSTILE, "why": HOSTILE}]}
    report.mode, report.audit = "audit", {"comparison": {
        "recorded": True, "recorded_verdict": HOSTILE, "configuration_differences": [{"code": HOSTILE}],
        "not_believed": [{"code": HOSTILE, "sender": HOSTILE}]}}
    for fmt in ("text", "github"):
        assert_plain(renderer(fmt)(report, {"verbose": True}).encode(), annotations=fmt == "github")
    for fmt in ("junit", "html", "json"):
        assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f\u2028\u2029]", renderer(fmt)(report, {}))


def test_a_value_at_the_start_of_a_text_line_never_starts_a_command():
    from itera_verify.report.words import plain_lines

    assert plain_lines("::add-mask::x\n  ::notice::y\nok ::z") == "\\x3a:add-mask::x\n  \\x3a:notice::y\nok ::z"


# ---- records nested past any parser --------------------------------------------------------------------------
@pytest.mark.parametrize("record", [b"[" * 100_000, b'{"verdict": ' + b"[" * 950 + b"]" * 950 + b"}",
                                    b'{"verdict": "pass", "rules": {"IV201": ' + b"{" * 5000 + b"}" * 5000 + b"}}"])
@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_record_nested_too_deep_is_IV702_not_a_traceback(built, tmp_path, record, fmt):
    archive = sealed_as_is(copy_of(built, tmp_path), tmp_path / "deep.tar.zst", record)
    result = run_cli("audit", archive, "--format", fmt, cwd=tmp_path)
    assert "Traceback" not in result.stderr and result.returncode == 1, result.stderr[-3000:]
    if fmt == "json":
        found = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "IV702"]
        assert found and "nested" in found[0]["message"]


def test_the_json_reader_measures_depth_without_recursion():
    from itera_verify.package.jsonread import JSONLimitError, nesting_depth, read_json

    assert nesting_depth('{"a": [1, "[[[\\"{", {"b": []}]}') == 4
    assert read_json(b'{"a": [1, {"b": "]]"}]}') == {"a": [1, {"b": "]]"}]}
    with pytest.raises(JSONLimitError, match="nested 100,000 levels"):
        read_json("[" * 100_000)
    with pytest.raises(JSONLimitError, match="larger than"):
        read_json(b"[1]" * 10, max_bytes=16)


# ---- IV512 on the bytes themselves ---------------------------------------------------------------------------
BIG_BASE, BIG_REVISION = "itera-tests/big-base", "b" * 40


@pytest.fixture(scope="module")
def big_weights(tmp_path_factory) -> dict[str, Path]:
    """Two safetensors files of 20 MiB with the same names, dtypes and shapes, one value apart, and a hub cache
    whose base at BIG_REVISION is the first."""
    import torch

    from fixtures.artifacts import write_safetensors

    folder = tmp_path_factory.mktemp("big-weights")
    values = torch.randn(5 << 20, generator=torch.Generator().manual_seed(0))
    write_safetensors(folder / "a.safetensors", {"w": values})
    other = values.clone()
    other[-1] += 1
    write_safetensors(folder / "b.safetensors", {"w": other})
    snapshot = folder / "hub" / f"models--{BIG_BASE.replace('/', '--')}" / "snapshots" / BIG_REVISION
    snapshot.mkdir(parents=True)
    shutil.copyfile(folder / "a.safetensors", snapshot / "model.safetensors")
    return {"a": folder / "a.safetensors", "b": folder / "b.safetensors", "hub": folder / "hub"}


def with_models(built, tmp_path: Path, models: dict[str, tuple[Path, str]], base: dict | None = None) -> Path:
    """The clean package sealed with each `id: (weights, run)` delivered as a safetensors model artifact."""
    pkg = copy_of(built, tmp_path)
    manifest = json.loads((pkg / "manifest.json").read_text())
    for artifact_id, (weights, run) in models.items():
        shutil.copyfile(weights, pkg / "artifacts" / f"{artifact_id}.safetensors")
        manifest["artifacts"].append({"id": artifact_id, "kind": "safetensors", "run": run,
                                      "path": f"artifacts/{artifact_id}.safetensors", **({"base": base} if base else {})})
    (pkg / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return sealed_as_is(pkg, tmp_path / "models.tar.zst")


def iv512(report) -> list[str]:
    return [f.path for f in report.findings if f.code == "IV512"]


def test_a_20_MiB_model_equal_to_its_base_is_IV512_in_a_default_audit(built, tmp_path, big_weights):
    archive = with_models(built, tmp_path, {"big-model": (big_weights["a"], "control")},
                          base={"name": BIG_BASE, "revision": BIG_REVISION})
    assert iv512(audit(archive, settle(reviewer=True, hf_cache=big_weights["hub"]))) == ["artifacts/big-model.safetensors"]


def test_two_different_20_MiB_models_are_not_called_equal_in_a_default_audit(built, tmp_path, big_weights):
    archive = with_models(built, tmp_path, {"big-model": (big_weights["a"], "control"),
                                            "other-model": (big_weights["b"], "lora-r16")})
    assert iv512(audit(archive, settle(reviewer=True, hf_cache=big_weights["hub"]))) == []


@pytest.mark.parametrize("recorded_version, contradicted", [("0.1.0", False), ("0.2.0", True)])
def test_a_rule_newer_than_the_senders_tool_fails_the_audit_without_calling_the_record_a_lie(
        built, tmp_path, recorded_version, contradicted):
    """A stopped run's predictions file (IV314, added in 0.2.0) in an archive whose record says an older
    itera-verify passed it: the audit fails on IV314, and the recorded pass is explained by the version, not
    called a record that does not describe the content (IV701). Recorded by this version, it is IV701."""
    pkg = copy_of(built, tmp_path)
    shutil.copy(pkg / "predictions" / "control.jsonl", pkg / "predictions" / "lora-r64.jsonl")
    record = json.dumps({"tool": "itera-verify", "version": recorded_version, "verdict": "pass",
                         "findings": []}).encode()
    report = audit(sealed_as_is(pkg, tmp_path / f"{CAMPAIGN}.tar.zst", record), settle(reviewer=True))
    codes = {f.code for f in report.findings}
    assert report.verdict == "fail" and "IV314" in codes
    assert ("IV701" in codes) is contradicted
    comparison = report.audit["comparison"]
    assert comparison["explained_by_version"] == ([] if contradicted else ["IV314"])
