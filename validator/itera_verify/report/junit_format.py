"""JUnit XML for CI viewers: one test case per rule family and one per artifact reload.

A failing family carries one <failure> (the form every viewer reads) whose type is the first blocking code and
whose body lists every finding as `CODE severity path:line:col: message`. Reloads that did not run are skipped,
never passed.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Iterable

from ..model import Finding
from ..rules import all_rules
from . import Report
from .lots import where_words
from .words import saves_line, signer_line
from .text_format import clean, human_bytes, location, severity_of, verdict_line



def family_of(report: Report, code: str) -> str:
    """The rule module that declares the code: as the report names it, else as the registry does."""
    rule = report.rules.get(code) if isinstance(report.rules, dict) else None
    if isinstance(rule, dict) and rule.get("family"):
        return str(rule["family"])
    declared = all_rules().get(code)
    return declared.family if declared is not None and declared.family else "other"


def finding_line(finding: Finding) -> str:
    where = clean(finding.path or "(package)")
    if location(finding):
        where += f":{location(finding)}" if finding.line is not None else f" at {location(finding)}"
    return f"{finding.code} {severity_of(finding)} {where}: {clean(finding.message)}"


def _families(report: Report) -> dict[str, list[str]]:
    """family -> codes, for every rule that ran and every code that was found."""
    codes = set(report.rules or {}) | {f.code for f in report.findings}
    families: dict[str, list[str]] = {}
    for code in sorted(codes):
        families.setdefault(family_of(report, code), []).append(code)
    return families


def _suite(parent: ET.Element, name: str, cases: list[ET.Element], seconds: float = 0.0) -> ET.Element:
    suite = ET.SubElement(parent, "testsuite", name=name)
    counts = {"tests": len(cases), "failures": 0, "errors": 0, "skipped": 0}
    for case in cases:
        for tag, key in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            counts[key] += case.find(tag) is not None
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("time", f"{seconds:.3f}")
    return suite


def _rule_cases(report: Report) -> list[ET.Element]:
    blocking = {id(f) for f in report.blocking()}
    cases = []
    for family, codes in _families(report).items():
        case = ET.Element("testcase", name=f"{family} ({codes[0]}–{codes[-1]})" if len(codes) > 1
                          else f"{family} ({codes[0]})", classname="itera-verify.rules", time="0")
        found = [f for f in report.findings if f.code in codes]
        failing = [f for f in found if id(f) in blocking]
        if failing:
            failing_codes = sorted({f.code for f in failing})
            failure = ET.SubElement(case, "failure", type=failing[0].code,
                                    message=f"{len(failing)} blocking: {', '.join(failing_codes)}; "
                                            f"{finding_line(failing[0])}")
            failure.text = "\n".join(finding_line(f) for f in failing) + "\n"
        others = [f for f in found if id(f) not in blocking]
        if others:
            ET.SubElement(case, "system-out").text = "\n".join(finding_line(f) for f in others) + "\n"
        cases.append(case)
    return cases


def _reload_cases(report: Report) -> list[ET.Element]:
    if not report.reloaded:
        why = "--no-reload" if report.mode == "verify" else "audit without --reload"
        case = ET.Element("testcase", name="artifact reloads", classname="itera-verify.reloads", time="0")
        ET.SubElement(case, "skipped", message=f"artifacts NOT reloaded ({why})")
        return [case]
    cases = []
    for reload in report.reloads:
        case = ET.Element("testcase", name=clean(reload.artifact),
                          classname=f"itera-verify.reloads.{clean(reload.loader)}", time=f"{reload.seconds:.3f}")
        facts = [f"device {clean(reload.device)}", f"peak memory {human_bytes(reload.peak_memory_bytes)}"]
        if reload.forward:
            facts.append(f"forward: {clean(reload.forward)}")
        if reload.lot_proof is not None:  # not reloaded here, and no failure: what stands for it is said
            ET.SubElement(case, "skipped", message=clean(where_words(reload)))
        elif not reload.ok:
            related = [f for f in report.findings if f.artifact == reload.artifact]
            code = related[0].code if related else "IV504"
            # A base model missing offline means the artifact could not be tested at all: an error, not a failure.
            tag = "error" if reload.failure == "base-unavailable" else "failure"
            element = ET.SubElement(case, tag, type=code, message=f"{code} {clean(reload.error or 'reload failed')}")
            element.text = "\n".join([finding_line(f) for f in related] or [clean(reload.error)]) + "\n"
        ET.SubElement(case, "system-out").text = "\n".join(facts) + "\n"
        cases.append(case)
    return cases


def _properties(suite: ET.Element, report: Report) -> None:
    archive = report.archive if isinstance(report.archive, dict) else {}
    values: Iterable[tuple[str, object]] = (
        ("package", report.package), ("campaign_id", report.campaign_id), ("verdict", report.verdict),
        ("summary", verdict_line(report)), ("archive", archive.get("path")), ("archive_sha256", archive.get("sha256")),
        ("signature", signer_line(report)))
    # Each run's saves (docs/record.md), one property per run: the viewers that show a suite's properties show these.
    values = [*values, *((f"saves.{clean(run.get('id'))}", saves_line(run)) for run in report.runs or []
                         if isinstance(run, dict))]
    properties = ET.Element("properties")
    for name, value in values:
        if value is not None:
            ET.SubElement(properties, "property", name=name, value=clean(value))
    suite.insert(0, properties)


def render(report: Report, options: dict) -> str:
    root = ET.Element("testsuites", name="itera-verify")
    rule_cases = _rule_cases(report)
    rules = _suite(root, "itera-verify.rules", rule_cases)
    rules.extend(rule_cases)
    _properties(rules, report)
    reload_cases = _reload_cases(report)
    reloads = _suite(root, "itera-verify.reloads", reload_cases, sum(r.seconds for r in report.reloads))
    reloads.extend(reload_cases)
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(int(rules.get(key)) + int(reloads.get(key))))
    root.set("time", f"{report.elapsed_seconds or 0.0:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
