"""Inputs the 10,000-example fuzz run found crashing the tool: each must now end in findings or exit 2."""
from __future__ import annotations

import json

import pytest

from fixtures.edit import edit_manifest
from tests.helpers import run_cli, static_findings


def _strict_json(text: str):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def test_absurd_cost_per_accepted_run_is_IV604_not_a_crash(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"].__setitem__("cost_per_accepted_usd", 1e308))
    found = [f for f in static_findings(package_dir) if f.code == "IV604"]
    assert found and "not a usable amount" in found[0].message


def test_infinite_hours_in_the_manifest_still_give_standard_json(package_dir):
    text = (package_dir / "manifest.json").read_text().replace('"observed_hours": 52.5', '"observed_hours": Infinity')
    assert "Infinity" in text
    (package_dir / "manifest.json").write_text(text)
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    report = _strict_json(result.stdout)
    assert report["tool"] == "itera-verify"


@pytest.mark.slow
def test_reference_with_a_nul_byte_is_IV205_not_a_crash(package_dir):
    edit_manifest(package_dir, lambda m: m["artifacts"][0].__setitem__("path", "artifacts/control\u0000-model"))
    result = run_cli(package_dir, "--no-seal", "--select", "IV2,IV5")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "IV205" in result.stdout


@pytest.mark.parametrize("content", ["tool = true\n", "tool = [1, 2]\n"])
def test_config_whose_tool_is_not_a_table_is_exit_2_or_ignored(package_dir, tmp_path, content):
    (tmp_path / "itera-verify.toml").write_text(content)
    result = run_cli(package_dir, "--no-reload", "--no-seal", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "tool" in result.stderr


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_non_finite_timeout_in_config_is_exit_2(package_dir, tmp_path, value):
    (tmp_path / "itera-verify.toml").write_text(f"timeout = {value}\n")
    result = run_cli(package_dir, "--no-reload", "--no-seal", cwd=tmp_path)
    assert result.returncode == 2 and "timeout" in result.stderr


def test_infinite_timeout_on_the_command_line_is_exit_2(package_dir):
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--timeout", "inf")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_float8_weights_with_a_nan_are_counted_not_a_crash():
    import torch

    from itera_verify.reload.common import nonfinite_count

    weights = torch.tensor([1.0, float("nan"), 0.5]).to(torch.float8_e4m3fn)
    assert nonfinite_count(weights) == 1
