"""Non-finite and absurd numbers in the manifest (NaN, Infinity, 1e300): the budget and threshold rules cannot
judge them (NaN compares false everywhere), so they are IV105 errors, with the pointer, the line and the sane
range, and nothing is sealed. Python's JSON reader takes the NaN/Infinity tokens, so the manifest parses."""
from __future__ import annotations

import json

import pytest

from fixtures.edit import edit_manifest, load_json
from tests.helpers import run_cli, static_findings

NAN, INF = float("nan"), float("inf")


def below_threshold_index(package_dir) -> int:
    rules = load_json(package_dir, "manifest.json")["stop_rules"]["rules"]
    return next(i for i, r in enumerate(rules) if r["kind"] == "below_threshold")


# (pointer, a value the field takes when sane, the largest sane value)
FIELDS = [
    ("/plan/rental_total_usd", 47.14, 10_000_000),
    ("/plan/lots/0/price_usd", 47.14, 10_000_000),
    ("/plan/lots/0/days", 3, 3650),
    ("/plan/lots/0/gpus", 1, 100_000),
    ("/plan/other_expenses/0/usd", 1.5, 10_000_000),
    ("/plan/window_hours", 72, 100_000),
    ("/plan/reserved_hours", 48, 100_000),
    ("/timeline/observed_hours", 52.5, 100_000),
    ("/timeline/deviations/0/hours", 4.5, 100_000),
    ("/decision/cost_per_accepted_usd", 24.32, 10_000_000),
    ("/stop_rules/rules/{threshold}/threshold", 0.6, 1e15),
]


def resolve(pointer: str, package_dir) -> str:
    return pointer.replace("{threshold}", str(below_threshold_index(package_dir)))


def set_at(package_dir, pointer: str, value) -> None:
    def change(manifest):
        *parents, last = pointer.strip("/").split("/")
        node = manifest
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value

    edit_manifest(package_dir, change)


def iv105_at(findings, pointer):
    return [f for f in findings if f.code == "IV105" and f.pointer == pointer]


@pytest.mark.parametrize("value", [NAN, INF, -INF, 1e300], ids=["NaN", "Infinity", "-Infinity", "1e300"])
@pytest.mark.parametrize("pointer", [f[0] for f in FIELDS], ids=[f[0] for f in FIELDS])
def test_each_field_with_a_nonfinite_or_absurd_value_is_one_IV105_with_its_line(package_dir, pointer, value):
    pointer = resolve(pointer, package_dir)
    set_at(package_dir, pointer, value)
    found = iv105_at(static_findings(package_dir), pointer)
    assert len(found) == 1, [(f.code, f.pointer, f.message) for f in static_findings(package_dir)]
    assert found[0].path == "manifest.json" and found[0].line and found[0].line > 1
    assert "between" in found[0].message, found[0].message  # says what a sane value is


@pytest.mark.parametrize("pointer,sane,bound", FIELDS, ids=[f[0] for f in FIELDS])
def test_the_largest_sane_value_passes_the_numbers_check(package_dir, pointer, sane, bound):
    pointer = resolve(pointer, package_dir)
    set_at(package_dir, pointer, bound)
    assert not iv105_at(static_findings(package_dir), pointer)


def test_a_nonfinite_number_in_an_unknown_field_is_IV105_too(package_dir):
    edit_manifest(package_dir, lambda m: m.__setitem__("notes", {"score": NAN}))
    found = iv105_at(static_findings(package_dir), "/notes/score")
    assert len(found) == 1 and "NaN" in found[0].message


def test_a_huge_integer_is_IV105_and_not_a_crash(package_dir):
    set_at(package_dir, "/plan/lots/0/gpus", 10 ** 30)
    assert len(iv105_at(static_findings(package_dir), "/plan/lots/0/gpus")) == 1


def test_the_clean_manifest_has_no_number_finding(package_dir):
    assert not [f for f in static_findings(package_dir) if f.code == "IV105"]


# One real command-line run per field, each with another of the bad values: exit 1, IV105 at the pointer.
CLI_VALUES = [NAN, INF, 1e300, -INF, NAN, 1e300, INF, NAN, 1e300, INF, NAN]


@pytest.mark.parametrize("pointer,value", [(f[0], v) for f, v in zip(FIELDS, CLI_VALUES)],
                         ids=[f"{f[0]}={v}" for f, v in zip(FIELDS, CLI_VALUES)])
def test_the_command_line_fails_on_each_field(package_dir, pointer, value):
    pointer = resolve(pointer, package_dir)
    set_at(package_dir, pointer, value)
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["verdict"] == "fail"
    found = [f for f in report["findings"] if f["code"] == "IV105" and f.get("pointer") == pointer]
    assert len(found) == 1 and found[0]["severity"] == "error" and found[0]["line"] > 1, report["findings"]


def test_a_nan_rental_total_is_never_sealed(package_dir, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    set_at(package_dir, "/plan/rental_total_usd", NAN)
    result = run_cli(package_dir, "--no-reload", "-o", dest)
    assert result.returncode == 1 and "IV105" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert list(dest.iterdir()) == []
