"""Fourth red team (independent): a lot's signed reload proof (flows/partproofs.py) as a sender's excuse.

An assembled campaign lets a lot's signed record stand for an artifact the checking machine "could not" reload:
a failure for want of memory, or a timeout on the CPU where the lot says it reloaded on a GPU. Both are cheap to
manufacture. Here the artifact is a 300-byte ONNX graph that loops 2**62 times: it never ends on any machine. The
sender writes `manifest.parts` and `provenance/lot-a/` by hand (a SHA256SUMS naming the artifact's real bytes, a
verification.json saying it reloaded on cuda:0, a statement binding both, signed with the sender's own key, the
key the reviewer allows for this sender). The sender's verify seals it; the reviewer's CPU audit --reload
--allowed-signers passes it, the endless artifact "reloaded on lot-a"."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from itera_verify import settle, verify
from itera_verify.record import open_campaign
from tests.helpers import run_cli
from tests.lots import CAMPAIGN, EVAL_IDS, QUESTION, allowed_signers, close, keygen, lots

needs_ssh = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
onnx = pytest.importorskip("onnx")
TIMEOUT = "4"  # the only artifact never ends: any timeout proves it; a short one keeps the suite quick


def endless_onnx(path: Path) -> None:
    """y = x + (1 added 2**62 times): a valid model (onnx.checker's full check passes) whose run never ends."""
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        initializer=[numpy_helper.from_array(np.array([1.0], dtype=np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)], "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[numpy_helper.from_array(np.array(2 ** 62, dtype=np.int64), "trips"),
                     numpy_helper.from_array(np.array(True), "go")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sign(key: Path, path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", "itera-verify-seal@v1", str(path)],
                   check=True, capture_output=True)


def forged_campaign(folder: Path, key: Path) -> Path:
    """A whole campaign whose control's only artifact is the endless model, with a lot's proof written by hand."""
    root = folder / CAMPAIGN
    campaign = open_campaign(root, CAMPAIGN, QUESTION, "toy", "v1", eval_ids=EVAL_IDS, lot="lot-a")
    campaign.declare_plan(lots=lots("lot-a"), reserved_hours=4)
    campaign.declare_stop_rules([{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"}])
    run = campaign.start_run("control", "control", params={"seed": 0})
    for step in range(1, 4):
        run.log(step, "loss", 1.0 / step)
    (root / "artifacts").mkdir()
    endless_onnx(root / "artifacts/model.onnx")
    artifact = run.artifact("artifacts/model.onnx", "onnx")
    with run.predictions() as out:
        for i, eval_id in enumerate(EVAL_IDS):
            out.write(eval_id, i)
    run.complete()
    campaign.decision("continue", after="pilot", note="the control trains")
    close(root, ["control"])

    proof = root / "provenance" / "lot-a"
    proof.mkdir(parents=True)
    sums = f"{sha256((root / 'artifacts/model.onnx').read_bytes())}  artifacts/model.onnx\n".encode()
    record = json.dumps({"verdict": "pass", "reloads": [{"artifact": artifact, "loader": "onnx", "ok": True,
                                                         "device": "cuda:0", "seconds": 0.4}]}).encode()
    (proof / "SHA256SUMS").write_bytes(sums)
    (proof / "verification.json").write_bytes(record)
    (proof / "statement.json").write_text(json.dumps({"type": "itera-verify-seal/1", "campaign_id": CAMPAIGN,
                                                      "sha256": {"SEAL/SHA256SUMS": sha256(sums),
                                                                 "SEAL/verification.json": sha256(record)}}))
    sign(key, proof / "statement.json")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["parts"] = [{"lot": "lot-a", "archive": f"{CAMPAIGN}.lot-a.part.tar.zst", "sha256": "0" * 64,
                          "signer": "alice@example.com"}]
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return root


@pytest.mark.slow
@needs_ssh
def test_an_artifact_that_never_finishes_does_not_stand_on_the_senders_own_proof(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    alice = keygen(keys, "alice")
    package = forged_campaign(tmp_path / "machine", alice)
    # Before the fix the sender's own verify --reload passed it (the proof stood for the timeout). It no longer
    # does: a timeout is never excused, and a hand-written provenance/ is not what the reviewer's assemble wrote.
    refused = verify(package, settle(reload=True, device="cpu", timeout=float(TIMEOUT), seal=False))
    assert "IV504" in {f.code for f in refused.blocking()}
    # The sender seals it all the same, without the reloads (--no-reload seals; or a tool of its own making).
    sealed = verify(package, settle(reload=False, output=f"{tmp_path}/out/", sign=f"ssh:{alice}"))
    allowed = allowed_signers(tmp_path / "allowed_signers", alice)
    archive = Path(sealed.archive["path"]) if sealed.sealed else None
    assert archive is not None, [f.to_json() for f in sealed.findings]
    result = run_cli("audit", archive, "--reload", "--device", "cpu", "--timeout", TIMEOUT, "--allowed-signers",
                     allowed, "--format", "json", timeout=600)
    report = json.loads(result.stdout)
    (reload,) = [r for r in report["reloads"] if r["loader"] == "onnx"]
    assert result.returncode == 1 and not reload["ok"], (report["verdict"], reload.get("facts"))
