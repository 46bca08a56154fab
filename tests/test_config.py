"""[tool.itera-verify] in pyproject.toml, or itera-verify.toml, found from the current folder upward."""
from __future__ import annotations

from pathlib import Path

import pytest

from itera_verify.flows.config import load_config, parse_config
from itera_verify.model import Severity, UsageError
from tests.helpers import run_cli


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def drop_last_prediction(package_dir: Path) -> None:
    """IV303: the lora-r16 predictions no longer cover every frozen eval id."""
    predictions = package_dir / "predictions" / "lora-r16.jsonl"
    lines = predictions.read_text().splitlines(keepends=True)
    predictions.write_text("".join(lines[:-1]))


def verify_in(folder: Path, package_dir: Path, *args: str):
    """The CLI run from `folder`, where the configuration search starts."""
    folder.mkdir(parents=True, exist_ok=True)
    return run_cli(package_dir, "--no-reload", "--no-seal", *args, cwd=folder)


# ----------------------------------------------------------------------------- finding the file

def test_pyproject_table_is_found_from_a_subfolder(tmp_path):
    source = write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n\n[tool.itera-verify]\nignore = ["IV608"]\n')
    config = load_config(start=tmp_path / "campaigns" / "november")
    assert config.source == source and config.ignore == ("IV608",)


def test_itera_verify_toml_is_found_and_takes_plain_keys(tmp_path):
    source = write(tmp_path / "itera-verify.toml", 'select = ["IV1", "IV3"]\ndevice = "cpu"\ntimeout = 120\n')
    config = load_config(start=tmp_path / "sub")
    assert (config.source, config.select, config.device, config.timeout) == (source, ("IV1", "IV3"), "cpu", 120.0)


def test_the_nearest_file_wins_and_a_pyproject_without_the_table_is_skipped(tmp_path):
    write(tmp_path / "itera-verify.toml", 'ignore = ["IV608"]\n')
    write(tmp_path / "repo" / "pyproject.toml", '[project]\nname = "x"\n')
    assert load_config(start=tmp_path / "repo").ignore == ("IV608",)
    nearest = write(tmp_path / "repo" / "itera-verify.toml", 'ignore = ["IV611"]\n')
    assert load_config(start=tmp_path / "repo").source == nearest


def test_no_configuration_is_the_defaults(tmp_path):
    config = load_config(start=tmp_path)
    assert config.source is None and config.select == () and config.levels == {}


# ----------------------------------------------------------------------------- what the keys mean

def test_every_key_parses():
    config = parse_config({"select": ["IV1", "IV3"], "ignore": "IV608, IV611", "levels": {"IV605": "error",
                           "IV307": "info", "IV202": "off"}, "tmp-patterns": ["/scratch/"],
                           "tariffs": {"RTX 4090": {"3": 47.14}}, "device": "cuda", "timeout": 900})
    assert config.select == ("IV1", "IV3")
    assert config.ignore == ("IV608", "IV611", "IV202")  # "off" is an ignore
    assert config.levels == {"IV605": Severity.ERROR, "IV307": Severity.INFO}
    assert config.tmp_patterns == ("/scratch/",) and config.tariffs == {"RTX 4090": {"3": 47.14}}
    assert (config.device, config.timeout) == ("cuda", 900.0)


@pytest.mark.parametrize("table, named", [
    ({"colour": True}, "colour"),
    ({"ignore": ["IV999"]}, "IV999"),
    ({"select": ["IV3", "XX1"]}, "XX1"),
    ({"levels": {"IV999": "warning"}}, "IV999"),
    ({"levels": {"IV303": "fatal"}}, "fatal"),
    ({"device": "tpu"}, "device"),
    ({"timeout": -1}, "timeout"),
    ({"tmp-patterns": "/scratch/"}, "tmp-patterns"),
    ({"tariffs": {"RTX 4090": {"3": float("nan")}}}, "nan"),
    ({"tariffs": {"RTX 4090": {"3": float("inf")}}}, "inf"),
    ({"tariffs": {"RTX 4090": {"3": 1e300}}}, "1e\\+300"),
    ({"tariffs": {"RTX 4090": {"3": "cheap"}}}, "cheap"),
    ({"tariffs": {"RTX 4090": {"a week": 110}}}, "a week"),
    ({"tariffs": {"RTX 4090": 47.14}}, "RTX 4090"),
])
def test_a_wrong_key_code_or_value_is_a_usage_error_naming_it(table, named):
    with pytest.raises(UsageError, match=named):
        parse_config(table)


# ----------------------------------------------------------------------------- through the command line

def test_unknown_key_in_the_file_is_exit_2_naming_it(package_dir, tmp_path):
    write(tmp_path / "itera-verify.toml", 'ignore = ["IV608"]\ncolour = true\n')
    result = verify_in(tmp_path / "work", package_dir)
    assert result.returncode == 2 and "'colour'" in result.stderr and "itera-verify.toml" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_code_in_the_file_is_exit_2_naming_it(package_dir, tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.itera-verify]\nlevels = { IV999 = "warning" }\n')
    result = verify_in(tmp_path, package_dir)
    assert result.returncode == 2 and "IV999" in result.stderr and "pyproject.toml" in result.stderr


def test_a_nan_tariff_in_the_file_is_exit_2_naming_it(package_dir, tmp_path):
    write(tmp_path / "itera-verify.toml", '[tariffs]\n"RTX 4090" = { "3" = nan }\n')
    result = verify_in(tmp_path, package_dir)
    assert result.returncode == 2 and "tariffs" in result.stderr and "Traceback" not in result.stderr


def test_a_broken_toml_file_is_exit_2(package_dir, tmp_path):
    write(tmp_path / "itera-verify.toml", "ignore = [\n")
    result = verify_in(tmp_path, package_dir)
    assert result.returncode == 2 and "itera-verify.toml" in result.stderr


def test_planted_defect_fails_without_configuration(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    result = verify_in(tmp_path, package_dir)
    assert result.returncode == 1 and "IV303" in result.stdout


def test_ignore_in_the_file_silences_a_rule(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    write(tmp_path / "itera-verify.toml", 'ignore = ["IV303"]\n')
    result = verify_in(tmp_path / "sub", package_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "IV303" not in result.stdout


def test_level_warning_in_the_file_lets_the_package_pass(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    write(tmp_path / "pyproject.toml", '[tool.itera-verify.levels]\nIV303 = "warning"\n')
    result = verify_in(tmp_path, package_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning IV303" in result.stdout and result.stdout.splitlines()[-1].startswith("PASS: 0 errors, 1 warning")


def test_level_off_in_the_file_disables_a_rule(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    write(tmp_path / "itera-verify.toml", '[levels]\nIV303 = "off"\n')
    assert verify_in(tmp_path, package_dir).returncode == 0


def test_select_in_the_file_limits_the_rules(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    write(tmp_path / "itera-verify.toml", 'select = ["IV1", "IV2"]\n')
    result = verify_in(tmp_path, package_dir, "--format", "json")
    assert result.returncode == 0 and '"IV303"' not in result.stdout


def test_the_command_line_overrides_the_file(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    write(tmp_path / "itera-verify.toml", 'select = ["IV1", "IV2"]\n')
    result = verify_in(tmp_path, package_dir, "--select", "IV3")
    assert result.returncode == 1 and "IV303" in result.stdout


def test_an_explicit_config_option_replaces_the_search(package_dir, tmp_path):
    drop_last_prediction(package_dir)
    write(tmp_path / "itera-verify.toml", 'colour = true\n')  # would be exit 2 if it were read
    explicit = write(tmp_path / "elsewhere" / "ci.toml", 'ignore = ["IV303"]\n')
    assert verify_in(tmp_path, package_dir, "--config", str(explicit)).returncode == 0


def test_tmp_patterns_in_the_file_reach_the_checks(package_dir, tmp_path):
    notes = package_dir / "analysis" / "errors.md"
    notes.write_text(notes.read_text() + "\nCheckpoints were staged in /scratch/job-42/ckpt before upload.\n")
    assert verify_in(tmp_path / "plain", package_dir).returncode == 0  # not a temporary directory by default
    write(tmp_path / "site" / "itera-verify.toml", 'tmp-patterns = ["/scratch/"]\n')
    result = verify_in(tmp_path / "site", package_dir)
    assert result.returncode == 1 and "IV201" in result.stdout and "analysis/errors.md" in result.stdout


def test_the_documented_configuration_parses():
    import re
    import tomllib

    text = (Path(__file__).resolve().parents[1] / "docs" / "integration.md").read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    config = parse_config(tomllib.loads(block)["tool"]["itera-verify"])
    assert config.select and config.ignore and config.levels and config.tmp_patterns and config.tariffs
    assert config.device == "auto" and config.timeout == 900.0


# ----------------------------------------------------------------------------- one reading for the CLI and the API

def test_the_python_api_applies_the_configuration_file_the_command_line_applies(package_dir, tmp_path, monkeypatch):
    import json

    from itera_verify import settle, verify

    folder = tmp_path / "work"
    source = write(folder / "itera-verify.toml", 'ignore = ["IV6"]\n[levels]\nIV303 = "warning"\n')
    drop_last_prediction(package_dir)  # IV303, lowered to a warning by the file
    cli = json.loads(verify_in(folder, package_dir, "--format", "json").stdout)
    monkeypatch.chdir(folder)
    api = verify(package_dir, settle(reload=False, seal=False))
    assert sorted((f["code"], f["severity"]) for f in cli["findings"]) == \
        sorted((f.code, f.severity.value) for f in api.findings)
    assert ("IV303", "warning") in {(f.code, f.severity.value) for f in api.findings}
    assert not [f for f in api.findings if f.code.startswith("IV6")]
    assert cli["configuration"]["applied"] == api.configuration["applied"] == str(source.resolve())
    # Config() is the way to run without any file; the file's lowering then no longer applies.
    from itera_verify.flows.config import Config

    bare = verify(package_dir, settle(Config(), reload=False, seal=False))
    assert ("IV303", "error") in {(f.code, f.severity.value) for f in bare.findings}
    assert bare.configuration["applied"] is None


def test_audit_applies_the_configurations_device_and_timeout(tmp_path, monkeypatch):
    from itera_verify.flows.config import settle

    write(tmp_path / "itera-verify.toml", 'device = "cpu"\ntimeout = 42\n')
    monkeypatch.chdir(tmp_path)
    for reviewer in (False, True):  # verify and audit settle their options the same way
        options = settle(None, reviewer=reviewer)
        assert (options.device, options.timeout) == ("cpu", 42.0)
        assert settle(None, reviewer=reviewer, device="auto", timeout=5).device == "auto"
