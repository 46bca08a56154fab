"""The wheel ships the schemas: built, installed in a fresh venv, and used from outside the checkout."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv_and_carries_the_schemas(tmp_path, package_dir):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, text=True)
    wheel = next(dist.glob("itera_verify-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for schema in ("manifest", "stops", "reload", "params", "report"):
        assert f"itera_verify/schemas/{schema}.schema.json" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # Dependencies come from the test venv (no network): a .pth makes its site-packages visible, after the wheel's.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "zz_test_deps.pth").write_text("\n".join(deps) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    cli = venv / "bin" / "itera-verify"
    rules = subprocess.run([str(cli), "rules", "IV105"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert rules.returncode == 0 and "schema" in rules.stdout
    where = subprocess.run([str(python), "-c", "import itera_verify.package.schemas as s; print(s.schema_dir())"],
                           capture_output=True, text=True, cwd=tmp_path, env=env).stdout.strip()
    assert where.startswith(site), f"schemas read from {where}, not from the installed wheel"
    checked = subprocess.run([str(cli), str(package_dir), "--no-reload", "--no-seal"], capture_output=True,
                             text=True, cwd=tmp_path, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
