"""The HTML report in a real browser: headless Chromium loads it with no console error (the page's
Content-Security-Policy turns any script or network reference into one), the rendered DOM holds the key figures,
and a screenshot is kept under test-artifacts/ for a person to look at.

`make system-tools` installs Chromium from Debian's packages; without it these tests skip.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.test_renderers import SHA, render, sample_report

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (make system-tools)")
# Offline and quiet: no first-run, sync, component updates or background requests from the browser itself.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """One headless load. A browser that crashes or hangs on a loaded machine (its own processes killed or
    starved: exit code non-zero, or no exit in 120 s) is started once more with a fresh profile; what the page
    does (its console, its DOM) is judged only on a load that completed."""
    for attempt in (1, 2):
        command = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}-{attempt}", *args, page.resolve().as_uri()]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise
            continue
        if done.returncode == 0 or attempt == 2:
            return done
    raise AssertionError("unreachable")


def console_messages(stderr: str) -> list[str]:
    """Every message the page wrote to the console (errors, CSP violations, uncaught exceptions)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def visible_text(dom: str) -> str:
    body = re.sub(r"<(style|title)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def png_rows(path: Path, max_rows: int) -> tuple[int, list[bytes]]:
    """Channels and unfiltered rows of an 8-bit RGB(A) PNG: enough to look at a screenshot's colours."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks: dict[bytes, list[bytes]] = {}
    pos = 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunks.setdefault(kind, []).append(data[pos + 8:pos + 8 + length])
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
    assert depth == 8 and color in (2, 6), "Chromium writes 8-bit RGB or RGBA screenshots"
    channels = 3 if color == 2 else 4
    stride = width * channels
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    rows, previous = [], bytearray(stride)
    for y in range(min(height, max_rows)):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                guess = left + up - corner
                pa, pb, pc = abs(guess - left), abs(guess - up), abs(guess - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        previous = line
    return channels, rows


def colour_share(path: Path, rgb: tuple[int, int, int], rows: int = 400, tolerance: int = 24) -> float:
    """The fraction of the pixels of the screenshot's top `rows` close to one colour."""
    channels, rows = png_rows(path, rows)
    hits = total = 0
    for row in rows[::2]:  # every other row is plenty and halves the pure-Python work
        for i in range(0, len(row), channels * 2):
            total += 1
            hits += all(abs(row[i + c] - rgb[c]) <= tolerance for c in range(3))
    return hits / total


def look_at(page: Path, profile: Path, screenshot: Path) -> str:
    """Load the page twice: once for its DOM and console, once for a screenshot. Returns the visible text."""
    loaded = chromium(page, profile, "--dump-dom")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert console_messages(loaded.stderr) == []
    shot = chromium(page, profile, f"--screenshot={screenshot}", "--window-size=1280,2400")
    assert shot.returncode == 0 and screenshot.stat().st_size > 20_000, shot.stderr[-2000:]
    return visible_text(loaded.stdout)


def keep(screenshot: Path, name: str) -> Path:
    """A copy under test-artifacts/ (git-ignored), for a person or a CI job to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    return Path(shutil.copyfile(screenshot, ARTIFACTS / name))


def test_report_renders_in_a_browser_without_console_errors(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render("html", sample_report()), encoding="utf-8")
    text = look_at(page, tmp_path / "profile", tmp_path / "report.png")
    for figure in ("FAIL", "control", "lora-r16", "lora-r64", "nonfinite-loss", "48.64 USD", "24.32 USD",
                   "IV303", "IV504", "IV605", "downsampled from 100,000 points", "1 non-finite value", "52.5 h",
                   "700.0 MiB", "predictions/lora-r16.jsonl"):
        assert figure in text, figure
    shot = keep(tmp_path / "report.png", "html-report-sample.png")
    assert colour_share(shot, (0xCF, 0x22, 0x2E)) > 0.001  # the red FAIL badge is drawn near the top


def test_zero_accepted_budget_reads_undefined_in_the_browser(tmp_path):
    report = sample_report(accepted=0, clean=True)
    report.sealed, report.archive = True, {"path": "out/reviews-lora-2026-11.tar.zst", "sha256": SHA, "bytes": 1234}
    page = tmp_path / "report.html"
    page.write_text(render("html", report), encoding="utf-8")
    text = look_at(page, tmp_path / "profile", tmp_path / "report.png")
    assert "undefined: no accepted run passed every check (" in text and "cost incurred 48.64 USD" in text
    assert SHA in text and "PASS" in text
    assert colour_share(keep(tmp_path / "report.png", "html-report-pass.png"), (0x1A, 0x7F, 0x37)) > 0.001


def test_a_script_planted_in_the_package_never_runs(tmp_path):
    report = sample_report()
    report.findings[0].message = "<script>console.error('pwned')</script><img src=x onerror=alert(1)>"
    page = tmp_path / "report.html"
    page.write_text(render("html", report), encoding="utf-8")
    text = look_at(page, tmp_path / "profile", tmp_path / "report.png")
    assert "<script>console.error('pwned')</script>" in text  # shown as text, not run


def test_the_console_check_catches_a_broken_page(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>undefinedFunction()</script>", encoding="utf-8")
    loaded = chromium(page, tmp_path / "profile", "--dump-dom")
    assert any("undefinedFunction" in line for line in console_messages(loaded.stderr))


def test_example_package_report_in_a_browser(package_dir, tmp_path):
    page = tmp_path / "example.html"
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json", "--report", f"html={page}")
    assert result.returncode in (0, 1), result.stderr
    text = look_at(page, tmp_path / "profile", tmp_path / "example.png")
    keep(tmp_path / "example.png", "html-report-example.png")
    manifest = json.loads((package_dir / "manifest.json").read_text())
    for run in manifest["runs"]:
        assert run["id"] in text
    assert "NOT reloaded" in text and "USD" in text and "Plan against actual" in text
