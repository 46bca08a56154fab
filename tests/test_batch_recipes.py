"""The shard recipes of docs/integration.md ("Audits at scale"), run as written here: the Slurm array's, the
Kubernetes Indexed Job's and the GitHub Actions matrix's command lines, with the variables each engine sets, each
writing its JSON lines; then gathered. Every key is audited by exactly one shard, and the gathered rows are what
one unsharded batch writes."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "integration.md").read_text()
BIN = Path(sys.executable).parent / "itera-verify"
SHARDS = 3


def recipe(pattern: str) -> str:
    """The command line of a recipe in the doc (continuation lines joined), found by `pattern`."""
    match = re.search(pattern, DOC, re.S)
    assert match, f"the recipe {pattern!r} is gone from docs/integration.md"
    return " ".join(match.group(0).replace("\\\n", " ").split())


def delivery(folder: Path, sealed: Path) -> Path:
    folder.mkdir()
    for index in range(5):
        shutil.copy(sealed, folder / f"campaign-{index}.tar.zst")
    (folder / "damaged.tar.zst").write_bytes(b"\x00" * 100)
    (folder / "readme.txt").write_text("x")
    return folder


def run_shell(command: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    import os

    full = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
    full.update({"PATH": f"{BIN.parent}:{full.get('PATH', '')}", "NO_COLOR": "1", **env})
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def gathered(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("rows-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def results_key(path: Path) -> Path:
    """The key the shards share (docs/integration.md says how to make it)."""
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


def check_cover(rows: list[dict]) -> None:
    keys = [row["key"] for row in rows]
    assert sorted(keys) == sorted({*keys}) and len(keys) == 6  # each archive once, none twice
    assert {row["key"]: row["verdict"] for row in rows}["damaged.tar.zst"] == "fail"


@pytest.mark.slow
def test_the_slurm_array_recipe_covers_every_key_once(sealed, tmp_path):
    folder = delivery(tmp_path / "bucket", sealed)
    line = recipe(r"itera-verify audit s3://acme-campaigns/2026-11/ --shard \"\$SLURM_ARRAY_TASK_ID(?:[^\n]*\\\n)*[^\n]*")
    command = line.replace("s3://acme-campaigns/2026-11/", str(folder)).replace(
        "--results s3://acme-reviews/results/", f"--results {tmp_path / 'results'}")
    home = tmp_path / "home"  # the home folder every node of the cluster shares, with the key in it
    results_key(home / ".itera" / "results.key")
    for task in range(SHARDS):  # what `#SBATCH --array=0-2` runs, one task per index
        result = run_shell(command, tmp_path, {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": str(SHARDS),
                                               "HOME": str(home)})
        assert result.returncode in (0, 1), result.stderr
    check_cover(gathered(tmp_path))
    # Resubmitted as one task: every result the shards kept is reused, authenticated by the key they share. A node
    # with another key trusts none of them: the first copy of each archive is audited again (the five campaigns
    # are one archive, the damaged one another), and the copies after it reuse that new result.
    rerun = {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1"}
    again = run_shell(command, tmp_path, {**rerun, "HOME": str(home)})
    rows = [json.loads(line) for line in (tmp_path / "rows-0.jsonl").read_text().splitlines()]
    assert again.returncode == 1 and len(rows) == 6 and all(row["reused"] for row in rows), again.stderr
    results_key(home / ".itera" / "results.key")  # another key in its place (the hub cache, under HOME, stays)
    again = run_shell(command, tmp_path, {**rerun, "HOME": str(home)})
    rows = [json.loads(line) for line in (tmp_path / "rows-0.jsonl").read_text().splitlines()]
    assert {row["key"]: row.get("not_reused") for row in rows if not row["reused"]} == dict.fromkeys(
        ["campaign-0.tar.zst", "damaged.tar.zst"], "not authenticated by this reviewer's key (--results-key)")
    assert "#SBATCH --array=0-7" in DOC and "cat rows-*.jsonl > rows.jsonl" in DOC


@pytest.mark.slow
def test_the_kubernetes_indexed_job_recipe_covers_every_key_once(sealed, tmp_path):
    folder = delivery(tmp_path / "bucket", sealed)
    line = recipe(r"itera-verify audit s3://acme-campaigns/2026-11/ --shard \$JOB_COMPLETION_INDEX/8[^\"]*")
    (tmp_path / "out").mkdir()
    command = line.replace("s3://acme-campaigns/2026-11/", str(folder)).replace("/8", f"/{SHARDS}").replace(
        "--results s3://acme-reviews/results/", f"--results {tmp_path / 'results'}").replace(
        "/out/", f"{tmp_path / 'out'}/").replace("/keys/", f"{tmp_path / 'keys'}/")
    results_key(tmp_path / "keys" / "results.key")  # the Secret, as the pod mounts it
    for index in range(SHARDS):  # Kubernetes sets JOB_COMPLETION_INDEX from 0 to completions - 1
        result = run_shell(command, tmp_path, {"JOB_COMPLETION_INDEX": str(index)})
        assert result.returncode in (0, 1), result.stderr
    check_cover(gathered(tmp_path / "out"))
    assert "completionMode: Indexed" in DOC and "completions: 8" in DOC
    assert "secretName: itera-results-key" in DOC and "mountPath: /keys" in DOC


@pytest.mark.slow
def test_the_github_matrix_recipe_covers_every_key_once_and_the_gather_step_counts_the_failures(sealed, tmp_path):
    folder = delivery(tmp_path / "bucket", sealed)
    line = recipe(r"itera-verify audit s3://acme-campaigns/2026-11/ --shard \$\{\{ strategy.job-index[^\n]*\n[^\n]*")
    for index in range(SHARDS):  # what Actions substitutes for ${{ ... }} in each job of the matrix
        command = (line.replace("s3://acme-campaigns/2026-11/", str(folder))
                   .replace("${{ strategy.job-index }}", str(index)).replace("${{ strategy.job-total }}", str(SHARDS))
                   .replace("${{ matrix.shard }}", str(index)))
        result = run_shell(command, tmp_path, {})
        assert result.returncode in (0, 1), result.stderr
    rows = gathered(tmp_path)
    check_cover(rows)
    unsharded = run_shell(f"itera-verify audit {folder} --format jsonl -q", tmp_path, {})
    assert sorted(json.dumps({k: r[k] for k in ("key", "verdict", "sha256")}) for r in rows) == sorted(
        json.dumps({k: r[k] for k in ("key", "verdict", "sha256")}) for r in map(json.loads, unsharded.stdout.splitlines()))
    assert "cat rows-*.jsonl > rows.jsonl" in DOC and "select(.verdict != \"pass\")" in DOC
