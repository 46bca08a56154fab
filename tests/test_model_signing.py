"""OpenSSF model-signing signatures (docs/format.md, signatures, issue 28 item 3): `--sign model-signing:KEY.pem` with a real EC key
made by `cryptography`; the real `model_signing verify key` command line (from this venv, in a child process)
accepting the extracted folder and refusing a changed file; the audit verifying SEAL/model.sig with
--oms-public-key (IV802, IV801) and saying it was not checked without one. Everything offline: the `key` method
never contacts Sigstore."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from itera_verify import verify
from itera_verify.flows.audit import audit
from itera_verify.format.names import OMS_SIGNATURE
from itera_verify.model import UsageError
from itera_verify.report import renderer
from tests.helpers import run_cli
from tests.test_signatures import members_of, rewrite, signature_codes

pytest.importorskip("model_signing", reason="the model-signing extra: pip install 'itera-verify[model-signing]'")
from cryptography.hazmat.primitives import serialization  # noqa: E402  (model-signing's dependency)
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from itera_verify import settle

pytestmark = pytest.mark.usefixtures("private_tmp")
CAMPAIGN = "reviews-lora-2026-11"
MODEL_SIGNING = Path(sys.executable).with_name("model_signing")


def ec_key(folder: Path, name: str, curve=ec.SECP256R1) -> tuple[Path, Path]:
    key = ec.generate_private_key(curve())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("oms-keys")
    return {"alice": ec_key(folder, "alice"), "mallory": ec_key(folder, "mallory", ec.SECP384R1)}


@pytest.fixture(scope="module")
def oms_signed(built, keys, tmp_path_factory) -> Path:
    """The example package (with a link inside it) sealed with --sign model-signing:alice.pem, once."""
    folder = tmp_path_factory.mktemp("oms-signed")
    shutil.copytree(built["package"], folder / "pkg", symlinks=True)
    (folder / "pkg" / "manifest-link.json").symlink_to("manifest.json")
    report = verify(folder / "pkg", settle(reload=False, output=folder, sign=(f"model-signing:{keys['alice'][0]}",)))
    assert report.sealed, [f.to_json() for f in report.findings]
    assert report.archive["model_signing"]["path"] == f"{CAMPAIGN}/{OMS_SIGNATURE}"
    assert "signature" not in report.archive  # no SSH key was named: no statement, no .sig beside
    return folder / f"{CAMPAIGN}.tar.zst"


def extracted(archive: Path, where: Path) -> Path:
    with _zst_tar(archive) as tar:
        tar.extractall(where, filter="tar")
    return where / CAMPAIGN


def _zst_tar(archive: Path):
    import io

    import zstandard

    with open(archive, "rb") as fh:
        data = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
    return tarfile.open(fileobj=io.BytesIO(data))


def model_signing_verify(folder: Path, public: Path, *extra: str) -> subprocess.CompletedProcess:
    """The reviewer's own command, as docs/format.md shows it."""
    return subprocess.run([str(MODEL_SIGNING), "verify", "key", str(folder), "--signature",
                           str(folder / OMS_SIGNATURE), "--public_key", str(public), "--allow_symlinks", *extra],
                          capture_output=True, text=True, timeout=120)


def test_model_signing_cli_accepts_the_extracted_folder_and_refuses_a_changed_file(oms_signed, keys, tmp_path):
    folder = extracted(oms_signed, tmp_path / "x")
    assert (folder / "SEAL" / "SHA256SUMS").is_file() and (folder / OMS_SIGNATURE).is_file()
    assert (folder / "manifest-link.json").is_symlink()
    done = model_signing_verify(folder, keys["alice"][1])
    assert done.returncode == 0 and "Verification succeeded" in done.stdout, done.stdout + done.stderr
    # a package file changed, the report inside SEAL/ changed, a file planted: each named by the reviewer's tool
    (folder / "manifest.json").write_bytes((folder / "manifest.json").read_bytes() + b" ")
    (folder / "SEAL" / "verification.json").write_text("{}")
    (folder / "planted.py").write_text("print('x')\n")
    done = model_signing_verify(folder, keys["alice"][1])
    assert done.returncode != 0, done.stdout + done.stderr
    # The library prints its list of mismatches with repr(), whose quoting depends on the digests' bytes.
    said = done.stderr.replace("\\'", "'")
    for name in ("'manifest.json'", "'SEAL/verification.json'", "planted.py"):
        assert name in said, done.stderr


def test_audit_verifies_the_oms_signature_with_the_public_key(oms_signed, keys, tmp_path):
    report = audit(oms_signed, settle(reviewer=True, oms_public_key=keys["alice"][1]))
    assert signature_codes(report) == [] and report.verdict == "pass", [f.to_json() for f in report.findings]
    oms = report.audit["signature"]["model_signing"]
    assert oms["state"] == "valid" and oms["key"].startswith("sha256:")
    assert "model-signing signature valid" in renderer("text")(report, {})
    # another key: IV802
    report = audit(oms_signed, settle(reviewer=True, oms_public_key=keys["mallory"][1]))
    assert signature_codes(report) == ["IV802"]
    assert report.audit["signature"]["model_signing"]["state"] == "invalid"


def test_a_forged_bundle_is_IV802_with_the_public_key(oms_signed, keys, tmp_path):
    """The bundle's signed manifest rewritten to name a planted file's digest, its signature kept (issue 35 item 8):
    the library refuses the envelope; a bundle that is no bundle at all is refused before the library sees it."""
    members = members_of(oms_signed)
    bundle = json.loads(members[f"{CAMPAIGN}/{OMS_SIGNATURE}"])
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "0" * 64
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = rewrite(oms_signed, tmp_path / f"{CAMPAIGN}.tar.zst", {OMS_SIGNATURE: json.dumps(bundle).encode()})
    report = audit(forged, settle(reviewer=True, oms_public_key=keys["alice"][1]))
    assert signature_codes(report) == ["IV802"] and report.audit["signature"]["model_signing"]["state"] == "invalid"
    not_a_bundle = rewrite(oms_signed, tmp_path / "x.tar.zst", {OMS_SIGNATURE: b'{"mediaType": "text/plain"}'})
    report = audit(not_a_bundle, settle(reviewer=True, oms_public_key=keys["alice"][1]))
    assert signature_codes(report) == ["IV802"]
    assert "not a JSON Sigstore bundle" in report.audit["signature"]["model_signing"]["problem"]


def test_audit_without_the_public_key_says_it_was_not_checked(oms_signed):
    report = audit(oms_signed)
    oms = report.audit["signature"]["model_signing"]
    assert oms["state"] == "unchecked" and "--oms-public-key" in oms["problem"]
    assert signature_codes(report) == []
    assert "model-signing signature unchecked" in renderer("text")(report, {})


def test_audit_refuses_a_resealed_archive_and_requires_the_signature(oms_signed, keys, tmp_path, built):
    """A courier changes a file and recomputes SHA256SUMS: the archive's own checks pass, the OMS signature not."""
    members = members_of(oms_signed)
    manifest = members[f"{CAMPAIGN}/manifest.json"]
    forged = rewrite(oms_signed, tmp_path / f"{CAMPAIGN}.tar.zst", {"manifest.json": manifest + b"\n"}, resum=True)
    report = audit(forged, settle(reviewer=True, oms_public_key=keys["alice"][1]))
    assert "IV802" in signature_codes(report), [f.to_json() for f in report.findings]
    problem = report.audit["signature"]["model_signing"]["problem"]
    assert "manifest.json: content differs" in problem and "SEAL/SHA256SUMS: content differs" in problem
    # an archive sealed without it, audited by a reviewer who requires it
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    (tmp_path / "plain").mkdir()
    assert verify(tmp_path / "pkg", settle(reload=False, output=tmp_path / "plain")).sealed
    report = audit(tmp_path / "plain" / f"{CAMPAIGN}.tar.zst", settle(reviewer=True, oms_public_key=keys["alice"][1]))
    assert signature_codes(report) == ["IV801"]


def test_bad_keys_are_one_line_exit_2(built, keys, tmp_path):
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    ed = tmp_path / "ed.pem"
    from cryptography.hazmat.primitives.asymmetric import ed25519

    ed.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    inside = tmp_path / "pkg" / "key.pem"
    shutil.copy(keys["alice"][0], inside)
    for key, words in ((tmp_path / "absent.pem", "cannot read"), (ed, "not an EC private key")):
        with pytest.raises(UsageError, match=words):
            verify(tmp_path / "pkg", settle(reload=False, output=tmp_path, sign=(f"model-signing:{key}",)))
    done = run_cli(str(tmp_path / "pkg"), "--no-reload", "-o", str(tmp_path), "--sign", f"model-signing:{inside}")
    assert done.returncode == 2 and "inside the package" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    inside.unlink()
    assert not list(tmp_path.glob("*.tar.zst*"))
    with pytest.raises(UsageError, match="not a PEM public key"):
        audit(tmp_path / "nothing.tar.zst", settle(reviewer=True, oms_public_key=ed))


def test_without_the_library_the_seal_names_the_extra(built, keys, tmp_path):
    """model_signing made unimportable in the child (a `model_signing` that raises ImportError first on the path)."""
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    shadow = tmp_path / "shadow" / "model_signing"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('absent', name='model_signing')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    done = run_cli(str(tmp_path / "pkg"), "--no-reload", "-o", str(tmp_path), "--sign",
                   f"model-signing:{keys['alice'][0]}", env=env)
    assert done.returncode == 2, done.stderr
    assert "pip install 'itera-verify[model-signing]'" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.tar.zst*"))


@pytest.mark.skipif(shutil.which("ssh-keygen") is None or shutil.which("ssh-agent") is None,
                    reason="needs OpenSSH's ssh-keygen and ssh-agent")
def test_ssh_and_model_signing_together_cover_each_other(built, keys, tmp_path):
    """Both keys: the OMS signature is made first, over every file but the statement pair; the signed statement
    binds model.sig's digest, so the SSH signer alone covers every member (issue 35 item 3). The audit checks both,
    and the library's own command line still accepts the extracted folder."""
    import hashlib

    from tests.test_signatures import allowed_signers, keygen

    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    ssh_key = keygen(tmp_path, "alice")
    report = verify(tmp_path / "pkg", settle(reload=False, output=tmp_path, sign=(f"ssh:{ssh_key}", f"model-signing:{keys['alice'][0]}")))
    assert report.sealed and report.archive["signature"] and report.archive["model_signing"]
    archive = tmp_path / f"{CAMPAIGN}.tar.zst"
    members = members_of(archive)
    bundle = json.loads(members[f"{CAMPAIGN}/{OMS_SIGNATURE}"])
    payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))["predicate"]
    signed = {r["name"] for r in payload["resources"]}
    assert {"SEAL/SHA256SUMS", "SEAL/verification.json", "SEAL/report.html", "manifest.json"} <= signed
    assert not signed & {OMS_SIGNATURE, "SEAL/statement.json", "SEAL/statement.json.sig"}
    statement = json.loads(members[f"{CAMPAIGN}/SEAL/statement.json"])
    assert statement["sha256"][OMS_SIGNATURE] == hashlib.sha256(members[f"{CAMPAIGN}/{OMS_SIGNATURE}"]).hexdigest()
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com", ssh_key.with_suffix(".pub")))
    report = audit(archive, settle(reviewer=True, allowed_signers=allowed, oms_public_key=keys["alice"][1]))
    assert signature_codes(report) == [], [f.to_json() for f in report.findings]
    assert report.audit["signature"]["model_signing"]["state"] == "valid"
    assert report.audit["signature"]["statement"]["state"] == "valid"
    report = audit(archive, settle(reviewer=True, allowed_signers=allowed))  # the SSH signer alone covers model.sig too
    assert report.verdict == "pass" and report.audit["signature"]["uncovered"] == [], \
        [f.to_json() for f in report.findings]
    done = model_signing_verify(extracted(archive, tmp_path / "x"), keys["alice"][1])
    assert done.returncode == 0 and "Verification succeeded" in done.stdout, done.stdout + done.stderr
    with pytest.raises(UsageError, match="one ssh key per seal"):
        verify(tmp_path / "pkg", settle(reload=False, output=tmp_path, sign=(f"ssh:{ssh_key}", f"ssh:{ssh_key}")))
