"""Every output format, from Report objects built by hand with realistic content (no package, no subprocess)."""
from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from itera_verify.model import Finding, ReloadResult, Severity
from itera_verify.report import Report, renderer

ROOT = Path(__file__).resolve().parents[1]
SHA = "9f2c" * 16
# ::error file=…,line=…,col=…,title=…::message, per the workflow-command syntax.
WORKFLOW_COMMAND = re.compile(r"^::(error|warning|notice)( [a-zA-Z]+=[^,:\r\n]*(,[a-zA-Z]+=[^,:\r\n]*)*)?::[^\r\n]*$")


def finding(code, path, message, severity=Severity.ERROR, **where) -> Finding:
    return Finding(code, path, message, severity=severity, **where)


def reload_result(artifact, loader, ok=True, **facts) -> ReloadResult:
    return ReloadResult(artifact=artifact, loader=loader, device="cpu", ok=ok, seconds=facts.pop("seconds", 2.4),
                        peak_memory_bytes=facts.pop("peak", 734_003_200), **facts)


# The 100k-point curve of sample_report, computed once (curve() copies it into each report's own lists).
LONG_LOSS = tuple((s, 2.5 * math.exp(-s / 20000) + 0.05 * math.sin(s / 50)) for s in range(100_000))


def curve(values, downsampled=False, total=None) -> dict:
    points = [[step, v if math.isfinite(v) else None] for step, v in values]
    return {"points": points, "nonfinite_steps": [p[0] for p in points if p[1] is None],
            "total_points": total or len(points), "downsampled": downsampled}


def sample_report(*, accepted: int = 2, clean: bool = False, reloaded: bool = True) -> Report:
    """The example campaign as the checker would report it: 3 runs, 4 artifacts, a NaN loss, a 100k-point curve."""
    findings = [] if clean else [
        finding("IV303", "predictions/lora-r16.jsonl", "2 eval ids missing (ex-0003, ex-0017), 1 unexpected (ex-9999)",
                line=12, column=1, run="lora-r16"),
        finding("IV105", "manifest.json", "'trainer' is not one of ['indispensable', 'useful', 'exploratory']",
                pointer="/runs/1/category"),
        finding("IV504", "artifacts/lora-r16", "adapter failed to reload: size mismatch for lora_A (16 vs 64)",
                artifact="lora-r16-adapter"),
        finding("IV605", "manifest.json", "observed 52.5 h - reserved 48 h = 4.5 h; deviations explain 2 h",
                Severity.WARNING, pointer="/timeline/deviations"),
        finding("IV511", "checkpoints/control/checkpoint-400/pytorch_model.bin", "weights stored as a pickle",
                Severity.WARNING),
    ]
    reloads = [reload_result("control-model", "transformers", forward="logits finite, shape [1, 8, 50257]"),
               reload_result("control-resume", "hf-trainer-checkpoint", seconds=5.1),
               reload_result("lora-r16-adapter", "peft", ok=clean, error=None if clean else "size mismatch",
                             failure=None if clean else "load"),
               reload_result("lora-r16-resume", "torch-resume", peak=None)] if reloaded else []
    accepted_runs = ["control", "lora-r16"][:accepted]
    rejected = [{"run": "lora-r16", "causes": ["IV303: predictions do not cover the eval ids"]},
                {"run": "control", "causes": ["IV504: control-model failed to reload"]}][:2 - accepted]
    budget = {  # the shape summary.budget_summary produces
        "currency": "USD", "total_usd": 48.64, "rental_usd": 47.14, "rental_total_stated_usd": 47.14,
        "lots": [{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}], "lots_window_hours": 72,
        "window_hours": 72, "other_expenses_included": [{"label": "object storage", "usd": 1.5}],
        "other_expenses_excluded": [{"label": "engineer time", "usd": 300.0}],
        "accepted_declared": 2, "accepted_declared_runs": ["control", "lora-r16"], "accepted": accepted,
        "accepted_runs": accepted_runs, "cost_per_accepted_usd": round(48.64 / accepted, 2) if accepted else None,
        "stopped_runs": ["lora-r64"], "rejected": rejected,
    }
    if not accepted:
        budget["cost_incurred_usd"] = 48.64
        budget["undefined_reason"] = ("cost per accepted run is undefined: no accepted run passed every check ("
                                      + "; ".join(f"{r['run']}: {r['causes'][0]}" for r in rejected)
                                      + "); 48.64 USD incurred")
    plan = {"declared_at": "2026-11-20T08:00:00Z", "first_run_started_at": "2026-11-20T09:00:00Z",
            "first_run": "lora-r64", "declared_before_first_run": True, "window_hours": 72, "lots_window_hours": 72,
            "reserved_hours": 48, "observed_hours": 52.5, "uncommitted_margin_hours": 24,
            "observed_minus_reserved_hours": 4.5, "explained_deviation_hours": 4.5,
            "deviations": [{"hours": 4.5, "explanation": "eval on long inputs took longer than the pilot suggested"}],
            "decisions": [{"at": "2026-11-20T12:00:00Z", "after": "pilot", "decision": "reduce",
                           "note": "dropped the r=64 sweep"}], "decisions_after_pilot": []}

    def run(run_id, role, category, status, last, n, stop=None):
        entry = {"id": run_id, "role": role, "category": category, "status": status,
                 "accepted_declared": run_id in ("control", "lora-r16"), "accepted": run_id in accepted_runs,
                 "findings": n, "last_values": {name: {"step": 400, "value": v} if v == v else
                                                {"step": 3, "value": None, "nonfinite": "NaN"}
                                                for name, v in last.items()}}
        if stop:
            entry["stop"] = stop
        return entry

    runs = [run("control", "control", "indispensable", "completed", {"train_loss": 0.412, "eval_macro_f1": 0.8317}, 1),
            run("lora-r16", "variant", "indispensable", "completed", {"train_loss": 0.455, "eval_macro_f1": 0.8104}, 2),
            run("lora-r64", "variant", "useful", "stopped", {"train_loss": float("nan"), "eval_macro_f1": 0.3812}, 0,
                stop={"rule": "nonfinite-loss", "reason": "train_loss became NaN at step 3", "step": 3,
                      "at": "2026-11-20T09:40:00Z"})]
    long_loss = LONG_LOSS
    curves = {
        "control": {"train_loss": curve(long_loss), "eval_macro_f1": curve([(100, 0.61), (200, 0.77), (400, 0.8317)])},
        "lora-r16": {"train_loss": curve([(s, 2.4 / (1 + s / 40)) for s in range(0, 401, 10)]),
                     "eval_macro_f1": curve([(100, 0.58), (200, 0.74), (400, 0.8104)])},
        "lora-r64": {"train_loss": curve([(1, 4.87), (2, 9.61), (3, float("nan"))]),
                     "eval_macro_f1": curve([(2, 0.3812)])},
    }
    archive = None if not clean else {"path": "demo-out/reviews-lora-2026-11.tar.zst", "sha256": SHA,
                                      "bytes": 18_874_368}
    return Report(package="demo-out/package", findings=findings, reloads=reloads, reloaded=reloaded, budget=budget,
                  plan=plan, runs=runs, curves=curves, archive=archive, sealed=clean and reloaded,
                  seal_skipped=None if clean else "findings at error level", device="cpu" if reloaded else None,
                  campaign_id="reviews-lora-2026-11", elapsed_seconds=41.7,
                  rules={"IV303": {"severity": "error", "title": "predictions cover the frozen eval ids",
                                   "family": "identity"},
                         "IV504": {"severity": "error", "title": "artifact reloads", "family": "reload"},
                         "IV605": {"severity": "warning", "title": "deviation explains the hours"}})


def render(name: str, report: Report, **options) -> str:
    return renderer(name)(report, {"color": False, "verbose": False, "quiet": False, **options})


# ----------------------------------------------------------------------------- text

def last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


def test_text_verdict_of_a_clean_sealed_package():
    line = last_line(render("text", sample_report(clean=True)))
    assert line == "PASS: 0 errors, 0 warnings; 4 artifacts reloaded on cpu; sealed reviews-lora-2026-11.tar.zst"


def test_text_verdict_of_a_failing_package_names_the_blocking_codes():
    line = last_line(render("text", sample_report()))
    assert line.startswith("FAIL: 3 errors (IV105, IV303, IV504), 2 warnings;")
    assert "3 of 4 artifacts reloaded on cpu, 1 failed" in line and line.endswith("nothing sealed")


def test_text_verdict_says_artifacts_were_not_reloaded():
    report = sample_report(clean=True, reloaded=False)
    report.seal_skipped = "--no-seal"
    line = last_line(render("text", report))
    assert "artifacts NOT reloaded (--no-reload)" in line and "not sealed (--no-seal)" in line


def test_text_audit_verdict_names_the_audited_archive():
    report = sample_report(clean=True, reloaded=False)
    report.mode, report.sealed = "audit", False
    assert last_line(render("text", report)) == ("PASS: 0 errors, 0 warnings; artifacts NOT reloaded (audit without "
                                                 "--reload); audited reviews-lora-2026-11.tar.zst")


def test_text_strict_warnings_are_listed_as_blocking():
    report = sample_report(clean=True)
    report.findings = [finding("IV605", "manifest.json", "hours", Severity.WARNING)]
    report.strict, report.sealed, report.archive = True, False, None
    assert last_line(render("text", report)).startswith("FAIL: 0 errors, 1 warning (IV605);")


def test_text_groups_findings_by_file_with_location():
    text = render("text", sample_report())
    manifest = text.index("manifest.json\n")
    assert "/runs/1/category" in text[manifest:] and "12:1" in text
    assert "cost per accepted run: 24.32 USD" in text and "sha256" not in text  # nothing sealed
    assert "700.0 MiB" in text and "window 72 h" in text


def test_text_quiet_prints_only_findings_and_verdict():
    text = render("text", sample_report(), quiet=True)
    assert "IV303" in text and "Budget" not in text and "Reloads" not in text
    assert last_line(text).startswith("FAIL:")


def test_text_zero_accepted_says_undefined_with_cost_incurred():
    text = render("text", sample_report(accepted=0))
    assert "undefined: no accepted run passed every check (" in text and "cost incurred 48.64 USD" in text
    assert not re.search(r"(?<![\d,])0\.00 USD", text)


def test_text_reads_the_flat_run_and_budget_shapes_too():
    report = sample_report(accepted=1)
    report.runs = [{"id": "r1", "status": "stopped", "stop_rule": "f1-floor", "stop_reason": "0.41 < 0.6",
                    "metrics": {"eval_macro_f1": 0.41}}]
    report.budget["rejected"] = [{"run": "r1", "cause": "stopped"}]
    text = render("text", report)
    assert "f1-floor: 0.41 < 0.6" in text and "0.41" in text and "rejected r1: stopped" in text


def test_text_shows_archive_checksum_and_has_no_escape_codes_without_color():
    text = render("text", sample_report(clean=True))
    assert SHA in text and "\x1b[" not in text
    assert "\x1b[" in render("text", sample_report(clean=True), color=True)


def test_text_neutralises_terminal_escapes_from_the_package():
    report = sample_report()
    report.findings[0].message = "evil \x1b[2J[bold red]markup[/]"
    text = render("text", report, color=True)
    assert "\x1b[2J" not in text and "\\x1b[2J[bold red]markup[/]" in text


def test_text_survives_a_malformed_package_report():
    report = Report(package="broken/", findings=[finding("IV101", None, "manifest.json is missing")],
                    reloaded=False, budget=None, plan=None, runs=None, curves=None, seal_skipped="findings at error level")
    assert last_line(render("text", report)).startswith("FAIL: 1 error (IV101)")


# ----------------------------------------------------------------------------- json

def test_json_is_one_document_that_follows_the_schema():
    document = json.loads(render("json", sample_report()))
    assert document["verdict"] == "fail" and document["budget"]["cost_per_accepted_usd"] == 24.32
    schema_path = ROOT / "schemas" / "report.schema.json"
    if schema_path.exists():
        import jsonschema

        jsonschema.validate(document, json.loads(schema_path.read_text()))
        jsonschema.validate(json.loads(render("json", sample_report(accepted=0, reloaded=False))),
                            json.loads(schema_path.read_text()))


# ----------------------------------------------------------------------------- junit

def parse_junit(text: str) -> ET.Element:
    return ET.fromstring(text.encode("utf-8"))


def test_junit_has_one_case_per_rule_family_and_per_artifact():
    root = parse_junit(render("junit", sample_report()))
    rules, reloads = root.findall("testsuite")
    assert rules.get("name") == "itera-verify.rules" and reloads.get("name") == "itera-verify.reloads"
    # families named by the report where it knows them (identity, reload), else by the code's hundred
    families = [case.get("name").split(" ")[0] for case in rules.findall("testcase")]
    assert families == ["structure", "identity", "reload", "artifacts", "budget"]
    assert [case.get("name") for case in reloads.findall("testcase")] == [
        "control-model", "control-resume", "lora-r16-adapter", "lora-r16-resume"]
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("9", "4", "0", "0")
    assert (rules.get("tests"), rules.get("failures")) == ("5", "3")


def test_junit_failure_carries_code_path_and_message():
    root = parse_junit(render("junit", sample_report()))
    integrity = next(c for c in root.iter("testcase") if c.get("name").startswith("identity"))
    failure = integrity.find("failure")
    assert failure.get("type") == "IV303"
    assert "IV303 error predictions/lora-r16.jsonl:12:1: 2 eval ids missing" in failure.text
    budget = next(c for c in root.iter("testcase") if c.get("name").startswith("budget"))
    assert budget.find("failure") is None and "IV605 warning" in budget.find("system-out").text
    adapter = next(c for c in root.iter("testcase") if c.get("name") == "lora-r16-adapter")
    assert adapter.find("failure").get("type") == "IV504"


def test_junit_reloads_are_skipped_when_they_did_not_run():
    root = parse_junit(render("junit", sample_report(clean=True, reloaded=False)))
    reloads = root.findall("testsuite")[1]
    assert reloads.get("skipped") == "1" and root.get("failures") == "0"
    assert "NOT reloaded" in reloads.find("testcase/skipped").get("message")


def test_junit_parses_with_junitparser():
    junitparser = pytest.importorskip("junitparser")
    path_text = render("junit", sample_report())
    xml = junitparser.JUnitXml.fromstring(path_text)
    suites = list(xml)
    assert [s.name for s in suites] == ["itera-verify.rules", "itera-verify.reloads"]
    assert sum(s.tests for s in suites) == 9 and sum(s.failures for s in suites) == 4
    failing = [case for case in suites[0] if not case.is_passed]
    assert {result.type for case in failing for result in case.result} == {"IV105", "IV303", "IV504"}


def test_junit_stays_valid_xml_with_control_characters_in_messages():
    report = sample_report()
    report.findings[0].message = "bad\x00byte \x1b and <tag> & \"quotes\""
    failure = parse_junit(render("junit", report)).find(".//failure[@type='IV303']")
    assert "<tag> & \"quotes\"" in failure.text and "\\x00" in failure.text


# ----------------------------------------------------------------------------- github

def test_github_lines_follow_the_workflow_command_syntax():
    lines = render("github", sample_report()).splitlines()
    assert len(lines) == 6 and all(WORKFLOW_COMMAND.match(line) for line in lines)
    assert lines[0] == ("::error file=demo-out/package/predictions/lora-r16.jsonl,line=12,col=1,title=IV303::"
                        "2 eval ids missing (ex-0003, ex-0017), 1 unexpected (ex-9999)")
    assert lines[3].startswith("::warning file=demo-out/package/manifest.json,title=IV605::")
    assert lines[-1].startswith("::error title=itera-verify::FAIL: 3 errors")


def test_github_escapes_percent_newlines_and_property_delimiters():
    report = sample_report(clean=True)
    report.findings = [finding("IV201", "params/a,b:c.json", "100% in /tmp/x\r\nsecond line", line=3)]
    line = render("github", report).splitlines()[0]
    assert line == "::error file=demo-out/package/params/a%2Cb%3Ac.json,line=3,title=IV201::100%25 in /tmp/x%0D%0Asecond line"


def test_github_info_is_a_notice_and_absolute_package_is_made_relative(tmp_path):
    report = sample_report(clean=True)
    report.package = str(tmp_path / "outdir")
    report.findings = [finding("IV608", "manifest.json", "no error analysis", Severity.INFO)]
    lines = render("github", report, workspace=str(tmp_path)).splitlines()  # GITHUB_WORKSPACE, as cli hands it
    assert lines[0] == "::notice file=outdir/manifest.json,title=IV608::no error analysis"
    assert lines[-1].startswith("::notice title=itera-verify::PASS: 0 errors")


# ----------------------------------------------------------------------------- html

def test_html_shows_every_run_budget_figure_and_finding_code():
    page = render("html", sample_report())
    for text in ("control", "lora-r16", "lora-r64", "nonfinite-loss", "train_loss became NaN at step 3",
                 "48.64 USD", "47.14 USD", "1.50 USD", "24.32 USD", "IV303", "IV105", "IV504", "IV605", "IV511",
                 "/runs/1/category", "predictions/lora-r16.jsonl", "700.0 MiB", "size mismatch",
                 "eval on long inputs took longer", "dropped the r=64 sweep", "52.5 h", "72 h", "48 h"):
        assert text in page, text
    # One chart per metric, the three runs overlaid on it (issue 26), not one chart per run and metric.
    assert page.count('<figure class="wide">') == 2 and "FAIL" in page


def test_html_zero_accepted_shows_undefined_and_cost_incurred():
    page = render("html", sample_report(accepted=0))
    assert "undefined: no accepted run passed every check (" in page and "cost incurred 48.64 USD" in page
    assert "IV303: predictions do not cover the eval ids" in page


def test_html_downsamples_large_curves_and_says_so():
    page = render("html", sample_report())
    assert "downsampled from 100,000 points" in page
    assert len(page) < 400_000


def test_html_marks_non_finite_points():
    page = render("html", sample_report())
    assert "step 3: non-finite" in page and "1 non-finite value" in page


def test_html_escapes_everything_from_the_package():
    report = sample_report()
    report.findings[0].message = "<script>alert(1)</script>"
    report.runs[0]["id"] = '"><img src=x onerror=alert(1)>'
    report.curves['<b>run</b>'] = {"<i>metric</i>": curve([(1, 1.0), (2, 2.0)])}
    page = render("html", report)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and "<b>run</b>" not in page and "<i>metric</i>" not in page


def test_html_is_self_contained():
    page = render("html", sample_report(clean=True))
    assert not re.search(r"https?://", page)
    assert "<link" not in page and "<script" not in page and "src=" not in page
    assert "default-src 'none'" in page and SHA in page


def test_html_sealed_copy_explains_where_the_archive_checksum_is():
    report = sample_report(clean=True)
    report.archive = None
    assert "reviews-lora-2026-11.tar.zst.sha256" in render("html", report)


def test_html_survives_a_malformed_package_report():
    report = Report(package="broken/", findings=[finding("IV104", "manifest.json", "Expecting value", line=1)],
                    reloaded=False, budget={"lots": "oops", "total_usd": "12"}, plan={"window_hours": "x"},
                    runs=[{"id": None}, "not a run"], curves={"r": {"m": {"points": [[1, "NaN"], ["a", 2], [2, 3]]}}})
    page = render("html", report)
    assert "IV104" in page and "NOT reloaded" in page


def test_every_renderer_handles_an_empty_report():
    report = Report(package="empty/", reloaded=False, runs=None, curves=None)
    for name in ("text", "json", "junit", "github", "html"):
        assert render(name, report)


def test_junit_takes_a_family_from_the_registry_when_the_report_does_not_name_it():
    """IV409 lives in rules/losses.py, not in the IV4xx stop rules: the module that declares a code is its
    family, whatever its hundred says."""
    from itera_verify.rules import all_rules

    report = Report(package="pkg", mode="verify", reloaded=False,
                    findings=[Finding("IV409", "metrics/control.jsonl", severity=Severity.ERROR, message="NaN")])
    report.rules = {}
    names = [case.get("name") for case in parse_junit(render("junit", report)).iter("testcase")]
    family = all_rules()["IV409"].family
    assert family == "losses"
    assert any(name.startswith(f"{family} ") or name == family for name in names), names


def test_html_reloads_table_has_a_cell_under_every_header():
    """Artifact, Loader, Devices, Result, Time, Peak memory, Detail: each row's cells line up with the header
    (the loader's cell was missing, which shifted every cell after it one column left)."""
    import re

    page = render("html", sample_report())
    section = page[page.index("<th>Artifact</th>"):]
    table = section[:section.index("</table>")]
    headers = re.findall(r"<th[^>]*>", table[:table.index("</thead>")])
    rows = re.findall(r"<tr>(.*?)</tr>", table[table.index("<tbody>"):], re.S)
    assert len(headers) == 7 and rows
    assert all(len(re.findall(r"<td[^>]*>", row)) == 7 for row in rows)
    assert "<code>transformers</code>" in table or "<code>peft</code>" in table


# ----------------------------------------------------------------------------- a report of very many findings

def test_a_report_keeps_1000_findings_of_a_code_and_says_the_rest_once_in_every_format():
    """300,000 empty files once made 300,005 findings: a report keeps the first 1,000 of each code."""
    import jsonschema

    from itera_verify.report import FINDINGS_PER_CODE

    report = sample_report()
    report.findings += [finding("IV703", f"many/{i:05d}", "unsafe member", Severity.WARNING) for i in range(2400)]
    report.findings += [finding("IV703", "many/last", "unsafe member")]  # one error among those left out
    report.cap_findings()
    listed = [f for f in report.findings if f.code == "IV703"]
    assert len(listed) == FINDINGS_PER_CODE + 1 and "1,401 more IV703 findings" in listed[-1].message
    assert listed[-1].severity == Severity.ERROR and report.verdict == "fail"
    report.findings.append(finding("IV703", "later/one", "unsafe member"))
    report.cap_findings()  # again, after more were added: what was left out stays counted
    assert report.findings_omitted == {"IV703": 1402} and len(report.findings) == 5 + FINDINGS_PER_CODE + 1
    document = json.loads(render("json", report))
    jsonschema.validate(document, json.loads((ROOT / "schemas" / "report.schema.json").read_text()))
    assert document["findings_omitted"] == {"IV703": 1402}
    for name in ("text", "html", "junit", "github", "sarif"):
        assert "1,402 more IV703 findings" in render(name, report), name
    assert "findings_omitted" not in json.loads(render("json", sample_report()))
