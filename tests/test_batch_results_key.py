"""The reviewer's key that authenticates `--results` (runtime/reviewer_key.py): made on first use under the config
folder with mode 0600, named by --results-key or ITERA_RESULTS_KEY, refused when other users may read it. The
forged result it stops is tests/test_redteam4_audit.py's; the shards' shared key, tests/test_batch_recipes.py's."""
from __future__ import annotations

import json
import secrets
import shutil
import stat
from pathlib import Path

from tests.helpers import run_cli


def delivery(folder: Path, sealed: Path) -> Path:
    folder.mkdir()
    shutil.copy(sealed, folder / "campaign-0.tar.zst")
    return folder


def key_file(path: Path, mode: int = 0o600) -> Path:
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(mode)
    return path


def rows(result) -> list[dict]:
    return json.loads(result.stdout)


def test_the_first_batch_with_results_makes_the_key_with_mode_0600_and_the_next_reuses_by_it(sealed, tmp_path):
    folder = delivery(tmp_path / "d", sealed)
    config = tmp_path / "config"
    env = {"XDG_CONFIG_HOME": str(config)}
    first = run_cli("audit", folder, "--results", tmp_path / "results", "--format", "json", "-q", env=env)
    key = config / "itera-verify" / "results.key"
    assert first.returncode == 0 and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700 and len(key.read_text().strip()) == 64
    again = run_cli("audit", folder, "--results", tmp_path / "results", "--format", "json", "-q", env=env)
    assert [row["reused"] for row in rows(again)] == [True]
    key_file(key)  # the key replaced: nothing stored before is the reviewer's any more
    other = run_cli("audit", folder, "--results", tmp_path / "results", "--format", "json", env=env)
    (row,) = rows(other)
    assert row["reused"] is False and row["not_reused"].startswith("not authenticated by this reviewer's key")
    assert "stored result not reused: not authenticated" in other.stderr


def test_a_key_named_by_results_key_or_ITERA_RESULTS_KEY_is_the_one_used(sealed, tmp_path):
    folder = delivery(tmp_path / "d", sealed)
    shared = key_file(tmp_path / "shared.key")
    results = tmp_path / "results"
    assert run_cli("audit", folder, "--results", results, "--results-key", shared, "-q").returncode == 0
    again = run_cli("audit", folder, "--results", results, "--format", "json", "-q",
                    env={"ITERA_RESULTS_KEY": str(shared), "XDG_CONFIG_HOME": str(tmp_path / "elsewhere")})
    assert [row["reused"] for row in rows(again)] == [True]
    assert not (tmp_path / "elsewhere").exists()  # a named key: the default one is never made


def test_a_named_key_that_does_not_exist_is_exit_2_and_not_made(sealed, tmp_path):
    folder = delivery(tmp_path / "d", sealed)
    missing = tmp_path / "keys" / "results.key"
    result = run_cli("audit", folder, "--results", tmp_path / "results", "--results-key", missing)
    assert result.returncode == 2 and "no such file" in result.stderr and not missing.exists()


def test_a_key_other_users_may_read_is_exit_2(sealed, tmp_path):
    folder = delivery(tmp_path / "d", sealed)
    readable = key_file(tmp_path / "results.key", 0o644)
    result = run_cli("audit", folder, "--results", tmp_path / "results", "--results-key", readable)
    assert result.returncode == 2 and "chmod 600" in result.stderr and "Traceback" not in result.stderr
    key_file(readable, 0o600)
    assert run_cli("audit", folder, "--results", tmp_path / "results", "--results-key", readable,
                   "-q").returncode == 0


def test_a_key_that_is_a_link_or_too_short_is_exit_2(sealed, tmp_path):
    folder = delivery(tmp_path / "d", sealed)
    short = tmp_path / "short.key"
    short.write_text("0123456789\n")
    short.chmod(0o600)
    link = tmp_path / "link.key"
    link.symlink_to(key_file(tmp_path / "real.key"))
    for key, words in ((short, "not a results key"), (link, "a link is never followed")):
        result = run_cli("audit", folder, "--results", tmp_path / "results", "--results-key", key)
        assert result.returncode == 2 and words in result.stderr, result.stderr


def test_results_key_for_one_archive_is_exit_2(sealed, tmp_path):
    result = run_cli("audit", sealed, "--results-key", key_file(tmp_path / "k"))
    assert result.returncode == 2 and "not one archive" in result.stderr
