"""A campaign_id can name a folder the reviewer already has (miniconda3, bin, go): `tar --zstd -xf` in HOME would
write the archive's files into it, and a .pth there runs with the next python. The audit looks where a reviewer
extracts (the current folder, HOME, the archive's folder) and refuses such an archive (IV703), except over an
earlier extraction of the same campaign; the README extracts into a new, empty folder."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from itera_verify import verify
from itera_verify import settle

pytestmark = pytest.mark.usefixtures("private_tmp")


@pytest.fixture
def miniconda_archive(built, tmp_path) -> Path:
    package = tmp_path / "miniconda3"
    shutil.copytree(built["package"], package, symlinks=True)
    manifest = json.loads((package / "manifest.json").read_text())
    manifest["campaign_id"] = "miniconda3"
    (package / "manifest.json").write_text(json.dumps(manifest, indent=2))
    out = tmp_path / "out"
    out.mkdir()
    report = verify(package, settle(reload=False, output=out / "miniconda3.tar.zst"))
    assert report.sealed, [(f.code, f.message) for f in report.blocking()]
    return out / "miniconda3.tar.zst"


def audit(archive: Path, home: Path, cwd: Path) -> tuple[int, list[tuple[str, str]]]:
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("GITHUB_ACTIONS", None)
    done = subprocess.run([sys.executable, "-m", "itera_verify", "audit", str(archive), "--format", "json"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    return done.returncode, [(f["code"], f["message"]) for f in report["findings"] if f["severity"] == "error"]


def test_a_top_folder_that_already_exists_in_home_is_refused(miniconda_archive, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    (home / "miniconda3" / "lib").mkdir(parents=True)
    work.mkdir()
    code, errors = audit(miniconda_archive, home, work)
    assert code == 1
    [(finding, message)] = [e for e in errors if e[0] == "IV703"]
    assert "already holds miniconda3/" in message and str(home) in message and "-C review" in message


def test_the_current_folder_counts_too_and_an_empty_place_passes(miniconda_archive, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    assert audit(miniconda_archive, home, work) == (0, [])
    (work / "miniconda3").write_text("a file of the reviewer's")
    code, errors = audit(miniconda_archive, home, work)
    assert code == 1 and [c for c, _ in errors] == ["IV703"]


@pytest.mark.skipif(not shutil.which("tar") or not shutil.which("zstd"), reason="GNU tar + zstd")
def test_an_earlier_extraction_of_the_same_campaign_is_not_a_collision(miniconda_archive, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["tar", "--zstd", "-xf", str(miniconda_archive)], cwd=home, check=True)
    assert audit(miniconda_archive, home, home) == (0, [])
