"""Issue 23, third red team, bypass B: a few KB of zstd that json.loads turns into gigabytes.

`[[],[],...]` costs about 80 bytes of Python objects per 3 bytes of text. A JSON file no rule reads the values of
is validated by simdjson (no Python object); a document the rules read is parsed only within jsonread.MAX_VALUES
values; the package keeps only small parsed documents. The audit's peak memory on such a file inside a real
sealed archive is a safety bound, tested here (not a benchmark).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from itera_verify.package import KEEP_VALUES
from itera_verify.package.jsonread import MAX_VALUES, count_values
from tests.helpers import static_findings, context
from itera_verify import settle

AUDIT_PEAK_BOUND = 1 << 30  # bytes; the old code took ~2.8 GB on a 32 MiB file, ~5 GB on four of 60 MiB


def nested_empties(size: int) -> bytes:
    n = size // 3
    return b"[" + b"[]," * (n - 1) + b"[]]"


def _audit_peak(archive: Path, cwd: Path) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes of the audit's largest process, output), read from RUSAGE_CHILDREN of a
    fresh wrapper process (this test process's own children would include earlier tests')."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'itera_verify', 'audit', sys.argv[1]], capture_output=True,"
        " text=True, env={'HF_HUB_OFFLINE': '1', 'NO_COLOR': '1', 'PATH': '/usr/bin:/bin'})\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
        "print(r.stdout[-3000:], r.stderr[-3000:])\n")
    out = subprocess.run([sys.executable, "-c", wrapper, str(archive)], capture_output=True, text=True, cwd=cwd,
                         timeout=600, check=True).stdout
    status, peak = out.split("\n", 1)[0].split()
    return int(status), int(peak), out


def test_audit_peak_memory_on_a_64_mib_nested_json(package_dir, tmp_path):
    from itera_verify import verify

    (package_dir / "analysis").mkdir(exist_ok=True)
    (package_dir / "analysis" / "scores.json").write_bytes(nested_empties((64 << 20) - 16))
    campaign = json.loads((package_dir / "manifest.json").read_text())["campaign_id"]
    archive = tmp_path / f"{campaign}.tar.zst"
    report = verify(package_dir, settle(reload=False, output=archive))
    assert report.sealed, [f.to_json() for f in report.findings]
    assert archive.stat().st_size < 2 << 20  # a few hundred KB of zstd
    shutil.rmtree(package_dir)
    status, peak, out = _audit_peak(archive, tmp_path)
    assert status == 0, out
    assert peak < AUDIT_PEAK_BOUND, f"the audit peaked at {peak / 2**20:.0f} MiB"
    print(f"audit peak {peak / 2**20:.0f} MiB")


def test_a_document_the_rules_read_past_max_values_is_IV104(package_dir):
    """A Trainer checkpoint's trainer_state.json is read by the rules: past MAX_VALUES it is never parsed."""
    rel = "extra/checkpoint-10/trainer_state.json"
    (package_dir / rel).parent.mkdir(parents=True)
    (package_dir / rel).write_bytes(nested_empties(3 * MAX_VALUES // 2 + 300))
    findings = [f for f in static_findings(package_dir) if f.code == "IV104" and f.path == rel]
    assert findings and "too large to check" in findings[0].message and f"{MAX_VALUES:,}" in findings[0].message


def test_tokenizer_json_is_only_validated(package_dir):
    """tokenizer.json is read by no rule: a large one (a 250k vocabulary) is validated, never built, and passes."""
    vocab = {f"tok{i}": i for i in range(250_000)}
    merges = [f"t o{i}" for i in range(250_000)]
    rel = "extra/tok/tokenizer.json"
    (package_dir / rel).parent.mkdir(parents=True)
    (package_dir / rel).write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": merges}}))
    assert not [f for f in static_findings(package_dir) if f.path == rel]


@pytest.mark.parametrize("text, line", [(b'{"a": [1, 2,, 3]}', 1), (b'{"a":\n NaN}', None)])
def test_a_small_unread_document_is_decided_by_json_loads(package_dir, text, line):
    """What simdjson refuses, json.loads decides (it takes NaN) and places (line and column)."""
    rel = "extra/notes.json"
    (package_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    (package_dir / rel).write_bytes(text)
    findings = [f for f in static_findings(package_dir) if f.path == rel]
    assert [f.line for f in findings] == ([line] if line else [])


def test_a_large_invalid_unread_document_is_IV104_without_position(package_dir):
    rel = "extra/big.json"
    (package_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    (package_dir / rel).write_bytes(nested_empties(3 * MAX_VALUES)[:-1])  # the last bracket missing
    (finding,) = [f for f in static_findings(package_dir) if f.path == rel]
    assert finding.code == "IV104" and finding.line is None and "too large" in finding.message


@pytest.mark.slow
def test_the_package_keeps_no_large_documents_at_once(tmp_path):
    for i in range(3):
        (tmp_path / f"d{i}.json").write_bytes(nested_empties(3 * KEEP_VALUES // 2))
    package = context(tmp_path)
    for i in range(3):
        assert package.documents.document(f"d{i}.json").ok
    kept = [rel for rel in package.inventory.files if package.documents.parsed(rel) is not None]
    assert sum(count_values((tmp_path / rel).read_bytes()) for rel in kept) <= KEEP_VALUES, kept
