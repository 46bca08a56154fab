"""`itera-verify rules`: each family once, every code under its own family."""
from __future__ import annotations

import re

from itera_verify.model import Rule, Severity
from itera_verify.report.rules_format import list_rules
from itera_verify.rules import all_rules
from tests.helpers import run_cli


def test_a_family_whose_codes_are_not_contiguous_is_listed_once():
    rules = {code: Rule(code, Severity.ERROR, f"title {code}", "x" * 50, family=family)
             for code, family in [("IV501", "artifacts"), ("IV504", "reload"), ("IV510", "artifacts")]}
    assert list_rules(rules) == ("[artifacts]\nIV501  error    title IV501\nIV510  error    title IV510\n\n"
                                 "[reload]\nIV504  error    title IV504\n")


def test_rules_command_lists_each_family_once_with_all_its_codes():
    result = run_cli("rules")
    assert result.returncode == 0, result.stderr
    headers = re.findall(r"^\[(\w+)\]$", result.stdout, flags=re.M)
    assert len(headers) == len(set(headers)), headers
    listed = re.findall(r"^(IV\d{3}) ", result.stdout, flags=re.M)
    assert sorted(listed) == sorted(all_rules())
    current = None
    for line in result.stdout.splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        elif line.startswith("IV"):
            assert all_rules()[line.split()[0]].family == current, line


def test_new_rules_belong_to_their_families():
    rules = all_rules()
    assert {code: rules[code].family for code in ("IV107", "IV308", "IV408", "IV409", "IV410", "IV612")} == {
        "IV107": "template_files", "IV308": "identity", "IV408": "stops", "IV409": "losses", "IV410": "losses",
        "IV612": "timeline"}
    assert {rules[code].severity.value for code in ("IV107", "IV308")} == {"warning"}
