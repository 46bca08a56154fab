"""SEAL/report.html held to what the tool's HTML renderer writes (report/html_allowlist.py). The renderer's own
pages must pass, so the allowlist stays in step with it; each forged page below plants one thing the renderer never
writes and must be named."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from itera_verify.model import Finding, Severity
from itera_verify.report.html_allowlist import check_page
from tests.helpers import run_cli
from tests.redteam4_forms import Member, members, rewrite, seal, small_campaign
from tests.test_renderers import render, sample_report

HOSTILE = '<script>alert(1)</script> " onmouseover="alert(2)" javascript:alert(3) <!-- data:text/html,x'


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("page-check")
    return seal(small_campaign(folder / "machine"), folder / "sealed")


def sealed_page(archive: Path) -> bytes:
    return next(m.data for m in members(archive)[1] if m.name == "SEAL/report.html")


@pytest.mark.parametrize("variant", [dict(), dict(clean=True), dict(accepted=0, reloaded=False)])
def test_every_page_the_renderer_writes_passes(variant):
    checked = check_page(render("html", sample_report(**variant)).encode())
    assert checked.problems == [] and checked.verdict == ("pass" if variant.get("clean") else "fail")


def test_a_page_whose_package_values_hold_markup_passes_because_the_renderer_escapes_them():
    report = sample_report()
    report.findings.append(Finding("IV105", HOSTILE, HOSTILE, severity=Severity.ERROR, pointer=HOSTILE))
    report.runs[0]["id"] = HOSTILE
    report.audit = {"archive": HOSTILE, "comparison": {"recorded_verdict": HOSTILE}}
    assert check_page(render("html", report).encode()).problems == []


def test_the_page_a_real_seal_writes_passes_and_its_audit_passes(sealed, tmp_path):
    checked = check_page(sealed_page(sealed))
    assert checked.problems == [] and checked.verdict == "pass"
    result = run_cli("audit", sealed, "--format", "json", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]


FORGED = {
    "a script": ("<main>", "<main><script>fetch('https://evil.example')</script>"),
    "an event handler": ('<div class="verdict', '<div onmouseover="x()" class="verdict'),
    "a link out": ('<a href="#runs">', '<a href="https://evil.example/login">'),
    "a javascript link": ('<a href="#runs">', '<a href="&#106;avascript:alert(1)">'),
    "an image": ("<main>", '<main><img src="https://evil.example/pixel">'),
    "a style that fetches": ("<main>", '<main><span style="background:url(https://evil.example/p)">x</span>'),
    "a style sheet that fetches": ("<style>", "<style>@import 'https://evil.example/x.css';"),
    "a comment a browser closes early": ("<main>", "<main><!--><script>alert(1)</script>-->"),
    "markup hidden from html.parser in an svg style": ("<main>", "<main><svg><style><img src=x onerror=alert(1)>"
                                                                 "</style></svg>"),
    "a raw < in text": ("<main>", "<main>1 < 2"),
    "a refresh to another site": ("<meta charset", '<meta http-equiv="refresh" content="0;url=https://evil.example">'
                                                    "<meta charset"),
    "no Content-Security-Policy": ('http-equiv="Content-Security-Policy"', 'http-equiv="X-Nothing"'),
    "a second verdict": ("<main>", '<main><div class="verdict pass"><span class="word">PASS</span></div>'),
    "a base element": ("<head>", '<head><base href="https://evil.example/">'),
}


@pytest.mark.parametrize("what", sorted(FORGED))
def test_a_forged_page_is_named(what):
    old, new = FORGED[what]
    page = render("html", sample_report())
    assert old in page
    assert check_page(page.replace(old, new, 1).encode()).problems, what


def test_an_audit_names_a_page_whose_verdict_is_not_the_records(sealed, tmp_path):
    """No script, nothing the renderer never writes: only the verdict box says fail where the record says pass."""
    def flipped(listed: list[Member]) -> list[Member]:
        return [Member(m.name, m.kind, m.data.replace(b'class="verdict pass"', b'class="verdict fail"'), mode=m.mode,
                       mtime=m.mtime) if m.name == "SEAL/report.html" else m for m in listed]

    archive = tmp_path / sealed.name
    shutil.copy(sealed, archive)
    rewrite(archive, flipped)
    result = run_cli("audit", archive, "--format", "json", timeout=300)
    report = json.loads(result.stdout)
    named = [f for f in report["findings"] if f["code"] == "IV702" and f["path"].endswith("SEAL/report.html")]
    assert result.returncode == 1 and len(named) == 1, report["findings"]
    assert "records pass" in named[0]["message"]
