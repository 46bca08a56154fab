"""Signed seals (docs/format.md, signatures, IV801-IV803): real keys made by ssh-keygen, a real ssh-agent started here (and killed at
the end), OpenSSH verifying what the seal wrote, the audit refusing what a courier could do to a signed archive,
and the pure-Python verifier against `ssh-keygen -Y verify` over valid and damaged signatures."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from itera_verify import verify
from itera_verify.archive import ArchiveReader, ArchiveWriter, format_sums
from itera_verify.flows.audit import audit
from itera_verify.format import sshsig
from itera_verify.format.statement import NAMESPACE
from itera_verify.model import UsageError
from tests.helpers import run_cli
from itera_verify import settle

pytestmark = [pytest.mark.usefixtures("private_tmp"),
              pytest.mark.skipif(shutil.which("ssh-keygen") is None or shutil.which("ssh-agent") is None,
                                 reason="needs OpenSSH's ssh-keygen and ssh-agent")]

KEY_TYPES = {"ed25519": ["-t", "ed25519"], "ecdsa256": ["-t", "ecdsa", "-b", "256"],
             "ecdsa384": ["-t", "ecdsa", "-b", "384"], "ecdsa521": ["-t", "ecdsa", "-b", "521"],
             "rsa": ["-t", "rsa", "-b", "2048"]}
CAMPAIGN = "reviews-lora-2026-11"


def keygen(folder: Path, name: str, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", *KEY_TYPES[kind], "-N", "", "-C", f"{name}@example.com",
                    "-f", str(folder / name)], check=True)
    return folder / name


def allowed_signers(path: Path, *entries: tuple[str, Path], options: str = "") -> Path:
    path.write_text("".join(f"{who} {options + ' ' if options else ''}{pub.read_text()}" for who, pub in entries))
    return path


def openssh_verifies(allowed: Path, identity: str, signature: Path, message: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", identity, "-n", NAMESPACE,
                           "-s", str(signature)], input=message, capture_output=True)


# ---- a real agent holding keys whose private files are gone --------------------------------------------------
@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """ssh-agent on a private socket holding alice (ed25519) and carol (RSA); their private key files are deleted
    once added, so every seal signed with them is signed by the agent alone. Killed at the end."""
    folder = tmp_path_factory.mktemp("agent")
    socket_path = folder / "agent.sock"
    process = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "SSH_ASKPASS": "/bin/false",
                                                               "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ""})
    previous = os.environ.get("SSH_AUTH_SOCK")
    try:
        while not socket_path.exists():
            assert process.poll() is None, "ssh-agent did not start"
            time.sleep(0.01)
        env = {**os.environ, "SSH_AUTH_SOCK": str(socket_path)}
        keys = {}
        for name, kind, confirm in (("alice", "ed25519", False), ("carol", "rsa", False), ("dave", "ed25519", True)):
            private = keygen(folder, name, kind)
            subprocess.run(["ssh-add", "-q", *(["-c"] if confirm else []), str(private)], env=env, check=True,
                           capture_output=True)
            private.unlink()  # the agent holds it now; nothing on disk can sign
            keys[name] = folder / f"{name}.pub"
        keys["mallory"] = keygen(folder, "mallory").with_suffix(".pub")  # a key the agent does not hold
        os.environ["SSH_AUTH_SOCK"] = str(socket_path)
        yield {"socket": socket_path, "keys": keys, "folder": folder}
    finally:
        if previous is None:
            os.environ.pop("SSH_AUTH_SOCK", None)
        else:
            os.environ["SSH_AUTH_SOCK"] = previous
        process.send_signal(signal.SIGTERM)
        process.wait(10)


@pytest.fixture(scope="module")
def signed(built, agent, tmp_path_factory) -> Path:
    """The example package sealed with --sign ssh:alice.pub through the agent, once for this module."""
    folder = tmp_path_factory.mktemp("signed")
    shutil.copytree(built["package"], folder / "pkg", symlinks=True)
    report = verify(folder / "pkg", settle(reload=False, output=folder, sign=f"ssh:{agent['keys']['alice']}"))
    assert report.sealed, [f.to_json() for f in report.findings]
    assert report.archive["signature"]["fingerprint"] == sshsig.parse_public_key_text(
        agent["keys"]["alice"].read_text()).fingerprint
    return folder / f"{CAMPAIGN}.tar.zst"


def members_of(archive: Path) -> dict[str, bytes]:
    with open(archive, "rb") as fh:
        data = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {i.name: tar.extractfile(i).read() for i in tar.getmembers() if i.isfile()}


def rewrite(archive: Path, out: Path, changes: dict[str, bytes], resum: bool = False) -> Path:
    """The archive written again by the seal's own (canonical) writer, with `changes` (name under the top folder ->
    bytes); `resum` recomputes SEAL/SHA256SUMS as a courier re-sealing it would."""
    with open(archive, "rb") as source, ArchiveReader(source) as reader:
        entries = []
        for member in reader:
            data = b"".join(bytes(p) for p in reader.data(member)) if member.kind == "file" else None
            entries.append((member, data))
    files = {m.name.split("/", 1)[1]: d for m, d in entries if d is not None}
    files.update(changes)
    if resum:
        listed = {n: hashlib.sha256(d).hexdigest() for n, d in files.items()
                  if n != "SEAL/SHA256SUMS" and not n.startswith("SEAL/statement")}
        files["SEAL/SHA256SUMS"] = format_sums(listed)
    with open(out, "wb") as target:
        writer = ArchiveWriter(target)
        for member, _ in entries:
            name = member.name.rstrip("/")
            if member.kind == "directory":
                writer.add_directory(name, mtime=member.mtime)
            elif member.kind == "symlink":
                writer.add_symlink(name, member.linkname, mtime=member.mtime)
            else:
                writer.add_bytes(name, files[name.split("/", 1)[1]], mode=member.mode, mtime=member.mtime)
        writer.close()
    return out


def signature_codes(report) -> list[str]:
    return sorted(f.code for f in report.findings if f.code.startswith("IV8"))


# ---- the seal -------------------------------------------------------------------------------------------------
def test_seal_signed_by_the_agent_verifies_with_openssh_alone(signed, agent, tmp_path):
    assert not (agent["folder"] / "alice").exists()  # signed with no private key file on disk
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com", agent["keys"]["alice"]))
    sig = signed.with_name(signed.name + ".sig")
    done = openssh_verifies(allowed, "alice@example.com", sig, signed.read_bytes())
    assert done.returncode == 0, done.stderr
    members = members_of(signed)
    statement = members[f"{CAMPAIGN}/SEAL/statement.json"]
    (tmp_path / "statement.sig").write_bytes(members[f"{CAMPAIGN}/SEAL/statement.json.sig"])
    done = openssh_verifies(allowed, "alice@example.com", tmp_path / "statement.sig", statement)
    assert done.returncode == 0, done.stderr
    parsed = json.loads(statement)
    assert parsed["campaign_id"] == CAMPAIGN
    assert parsed["sha256"]["SEAL/SHA256SUMS"] == hashlib.sha256(members[f"{CAMPAIGN}/SEAL/SHA256SUMS"]).hexdigest()
    # OpenSSH refuses the archive's signature over other bytes, and another principal
    assert openssh_verifies(allowed, "alice@example.com", sig, signed.read_bytes() + b"\0").returncode != 0
    assert openssh_verifies(allowed, "bob@example.com", sig, signed.read_bytes()).returncode != 0


def test_rsa_key_in_the_agent_signs_rsa_sha2_512(built, agent, tmp_path):
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    report = verify(tmp_path / "pkg", settle(reload=False, output=tmp_path, sign=f"ssh:{agent['keys']['carol']}"))
    archive = tmp_path / f"{CAMPAIGN}.tar.zst"
    allowed = allowed_signers(tmp_path / "allowed", ("carol@example.com", agent["keys"]["carol"]))
    assert report.archive["signature"]["algorithm"] == "ssh-rsa"
    assert openssh_verifies(allowed, "carol@example.com", archive.with_name(archive.name + ".sig"),
                            archive.read_bytes()).returncode == 0
    assert signature_codes(audit(archive, settle(reviewer=True, allowed_signers=allowed))) == []


def test_key_not_in_the_agent_is_exit_2_before_any_work(built, agent, tmp_path):
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    done = run_cli(str(tmp_path / "pkg"), "--no-reload", "-o", str(tmp_path), "--sign",
                   f"ssh:{agent['keys']['mallory']}", env={**os.environ})
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "not in the ssh-agent" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.tar.zst*")) and not list(tmp_path.glob(".*partial"))


def test_no_agent_is_exit_2(built, agent, tmp_path):
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    done = run_cli(str(tmp_path / "pkg"), "--no-reload", "-o", str(tmp_path), "--sign",
                   f"ssh:{agent['keys']['alice']}", env={"SSH_AUTH_SOCK": ""})
    assert done.returncode == 2 and "SSH_AUTH_SOCK" in done.stderr
    assert not list(tmp_path.glob("*.tar.zst*"))


def test_agent_that_refuses_to_sign_leaves_nothing_sealed(built, agent, tmp_path):
    """dave was added with ssh-add -c and the agent has no way to ask for confirmation: it refuses at the seal."""
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    done = run_cli(str(tmp_path / "pkg"), "--no-reload", "-o", str(tmp_path), "--sign",
                   f"ssh:{agent['keys']['dave']}", env={**os.environ})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refused to sign" in done.stderr and "Traceback" not in done.stderr
    # no archive, no .sig, no .sha256, no partial file (tmp/: the audit's private folder, conftest.private_tmp)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg", "tmp"]


def test_private_key_file_signs_and_never_enters_the_archive(built, tmp_path):
    key = keygen(tmp_path, "erin", "ecdsa384")
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    report = verify(tmp_path / "pkg", settle(reload=False, output=tmp_path, sign=f"ssh:{key}"))
    archive = tmp_path / f"{CAMPAIGN}.tar.zst"
    allowed = allowed_signers(tmp_path / "allowed", ("erin@example.com", key.with_suffix(".pub")))
    assert openssh_verifies(allowed, "erin@example.com", archive.with_name(archive.name + ".sig"),
                            archive.read_bytes()).returncode == 0
    secret = "".join(key.read_text().splitlines()[1:-1])
    secret_bytes = base64.b64decode(secret)
    everything = b"".join(members_of(archive).values()) + json.dumps(report.to_json()).encode()
    assert secret[:40].encode() not in everything and secret_bytes[-64:] not in everything
    assert signature_codes(audit(archive, settle(reviewer=True, allowed_signers=allowed))) == []


def test_a_private_key_file_signs_under_a_temporary_folder_too_deep_for_a_socket(tmp_path, monkeypatch):
    """The temporary agent's socket would pass the 108 bytes of a socket address under this TMPDIR: its private
    folder goes to /tmp instead, the key loads, and the folder is gone after close."""
    import tempfile

    from itera_verify.runtime.sockets import fits
    from itera_verify.seal.agent import TemporaryAgent

    deep = tmp_path / ("deep-" * 16)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert not fits(deep / "itera-sign-abcdefgh" / "agent.sock")
    agent = TemporaryAgent(keygen(tmp_path, "frank"))
    try:
        assert fits(agent.agent.socket_path) and os.path.dirname(agent.folder) == "/tmp"
        assert len(agent.agent.identities()) == 1
    finally:
        agent.close()
    assert not os.path.exists(agent.folder) and list(deep.iterdir()) == []


def test_private_key_inside_the_package_is_refused(built, tmp_path):
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    key = keygen(tmp_path / "pkg", "inside")
    with pytest.raises(UsageError, match="inside the package"):
        verify(tmp_path / "pkg", settle(reload=False, output=tmp_path, sign=f"ssh:{key}"))
    shutil.move(key, tmp_path / "outside")  # a copy left in the package is refused too
    shutil.copy(tmp_path / "outside", tmp_path / "pkg" / "notes.txt")
    with pytest.raises(UsageError, match="copy of the private key"):
        verify(tmp_path / "pkg", settle(reload=False, output=tmp_path, sign=f"ssh:{tmp_path / 'outside'}"))
    assert not list(tmp_path.glob("*.tar.zst*"))


# ---- the audit ---------------------------------------------------------------------------------------------
def test_audit_names_the_signer_and_admits_an_allowed_one(signed, agent, tmp_path):
    fingerprint = sshsig.parse_public_key_text(agent["keys"]["alice"].read_text()).fingerprint
    report = audit(signed)  # no allowed signers: still checked, and shown
    assert report.verdict == "pass" and report.audit["signature"]["signer"] == fingerprint
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com,alice@work.example", agent["keys"]["alice"]),
                              options=f'namespaces="{NAMESPACE}"')
    report = audit(signed, settle(reviewer=True, allowed_signers=allowed, signer="alice@example.com"))
    assert report.verdict == "pass", [f.to_json() for f in report.findings]
    assert report.audit["signature"]["principals"] == ["alice@example.com,alice@work.example"]
    for fmt in ("text", "github", "junit", "html"):
        done = run_cli("audit", str(signed), "--format", fmt, "--allowed-signers", str(allowed))
        assert done.returncode == 0 and fingerprint in done.stdout, (fmt, done.stdout[-2000:])


def test_another_principal_or_another_key_is_IV803(signed, agent, tmp_path):
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com", agent["keys"]["alice"]))
    assert signature_codes(audit(signed, settle(reviewer=True, allowed_signers=allowed, signer="bob@example.com"))) == ["IV803"]
    only_mallory = allowed_signers(tmp_path / "mallory", ("alice@example.com", agent["keys"]["mallory"]))
    assert signature_codes(audit(signed, settle(reviewer=True, allowed_signers=only_mallory))) == ["IV803"]
    expired = allowed_signers(tmp_path / "expired", ("alice@example.com", agent["keys"]["alice"]),
                              options='valid-before="20200101Z"')
    assert signature_codes(audit(signed, settle(reviewer=True, allowed_signers=expired))) == ["IV803"]
    other_namespace = allowed_signers(tmp_path / "ns", ("alice@example.com", agent["keys"]["alice"]),
                                      options='namespaces="git"')
    assert signature_codes(audit(signed, settle(reviewer=True, allowed_signers=other_namespace))) == ["IV803"]


def test_unsigned_archive_is_IV801_only_when_a_signer_is_required(sealed, agent, tmp_path):
    report = audit(sealed)
    assert signature_codes(report) == [] and report.audit["signature"]["signed"] is False
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com", agent["keys"]["alice"]))
    assert signature_codes(audit(sealed, settle(reviewer=True, allowed_signers=allowed))) == ["IV801"]


@pytest.mark.parametrize("form", ["fifo", "sparse"])
def test_a_fifo_or_a_huge_file_named_as_the_archive_signature_is_not_read_and_is_IV802_when_signers_are_required(
        signed, agent, tmp_path, form):
    """A fifo would block the audit, a sparse 1 GiB file fill its memory: neither is read (push/beside.py)."""
    archive = tmp_path / signed.name
    shutil.copy(signed, archive)
    shutil.copy(signed.with_name(signed.name + ".sha256"), archive.with_name(archive.name + ".sha256"))
    sidecar = archive.with_name(archive.name + ".sig")
    if form == "fifo":
        os.mkfifo(sidecar)
    else:
        with open(sidecar, "wb") as fh:
            fh.truncate(1 << 30)
    why = "not a regular file" if form == "fifo" else "larger than"
    plain = run_cli("audit", archive, "--format", "json", timeout=120)
    report = json.loads(plain.stdout)
    assert plain.returncode == 0 and report["audit"]["sidecars_unread"][0]["path"] == sidecar.name
    assert why in report["audit"]["sidecars_unread"][0]["why"]
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com", agent["keys"]["alice"]))
    required = run_cli("audit", archive, "--format", "json", "--allowed-signers", allowed, timeout=120)
    findings = [f for f in json.loads(required.stdout)["findings"] if f["code"].startswith("IV8")]
    assert required.returncode == 1 and [(f["code"], f["path"]) for f in findings] == [("IV802", sidecar.name)]
    assert why in findings[0]["message"]


def test_resealed_archive_is_IV802(signed, agent, tmp_path):
    """A courier changes a member and recomputes SHA256SUMS: the members agree with the sums (no IV701), but the
    sums are not the ones signed, and the archive's bytes are not the ones signed either."""
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com", agent["keys"]["alice"]))
    changed = rewrite(signed, tmp_path / signed.name, {"analysis/errors.md": b"# Error analysis\nrewritten\n"},
                      resum=True)
    shutil.copy(signed.with_name(signed.name + ".sig"), changed.with_name(changed.name + ".sig"))
    report = audit(changed, settle(reviewer=True, allowed_signers=allowed))
    assert {f.code for f in report.findings} == {"IV802"}, [f.to_json() for f in report.findings]
    messages = " ".join(f.message for f in report.findings)
    assert "SEAL/SHA256SUMS is not the one signed" in messages and "archive's signature" in messages


def test_changed_record_is_IV802(signed, agent, tmp_path):
    record = json.loads(members_of(signed)[f"{CAMPAIGN}/SEAL/verification.json"])
    record["findings"] = []
    changed = rewrite(signed, tmp_path / signed.name, {"SEAL/verification.json": json.dumps(record).encode()},
                      resum=True)
    report = audit(changed)
    assert "IV802" in signature_codes(report)
    assert any("verification.json is not the one signed" in f.message for f in report.findings)


def test_swapped_statement_is_IV802(signed, agent, tmp_path):
    statement = json.loads(members_of(signed)[f"{CAMPAIGN}/SEAL/statement.json"])
    statement["sealed_at"] = "2026-01-01T00:00:00Z"
    changed = rewrite(signed, tmp_path / signed.name,
                      {"SEAL/statement.json": json.dumps(statement, indent=2, sort_keys=True).encode() + b"\n"})
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com", agent["keys"]["alice"]))
    report = audit(changed, settle(reviewer=True, allowed_signers=allowed))
    assert signature_codes(report) == ["IV802"]
    assert "does not verify" in next(f.message for f in report.findings if f.code == "IV802")


def test_resealed_with_another_key_is_IV803_and_shows_that_key(built, agent, signed, tmp_path):
    """A courier re-seals the changed package with a key of its own: valid, but not the sender's."""
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    (tmp_path / "pkg" / "analysis" / "errors.md").write_text("# Error analysis\nchanged\n")
    mallory = keygen(tmp_path, "mallory-own")
    verify(tmp_path / "pkg", settle(reload=False, output=tmp_path, sign=f"ssh:{mallory}"))
    archive = tmp_path / signed.name
    allowed = allowed_signers(tmp_path / "allowed", ("alice@example.com", agent["keys"]["alice"]))
    report = audit(archive, settle(reviewer=True, allowed_signers=allowed))
    assert signature_codes(report) == ["IV803"]
    assert report.audit["signature"]["signer"] == sshsig.parse_public_key_text(
        mallory.with_suffix(".pub").read_text()).fingerprint


def test_unreadable_allowed_signers_is_exit_2(signed, tmp_path):
    done = run_cli("audit", str(signed), "--allowed-signers", str(tmp_path / "missing"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "cannot read" in done.stderr
    (tmp_path / "junk").write_text("this is not an allowed signers file\n")
    done = run_cli("audit", str(signed), "--allowed-signers", str(tmp_path / "junk"))
    assert done.returncode == 2 and "no allowed signer" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("audit", str(signed), "--signer", "alice@example.com")
    assert done.returncode == 2 and "--allowed-signers" in done.stderr


# ---- the pure verifier against OpenSSH -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def file_keys(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("keys")
    message = b"the bytes of a statement\n"
    (folder / "message").write_bytes(message)
    keys = {}
    for kind in KEY_TYPES:
        key = keygen(folder, kind, kind)
        subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(folder / "message")],
                       check=True, capture_output=True)
        keys[kind] = {"pub": key.with_suffix(".pub"), "sig": (folder / "message.sig").read_bytes(),
                      "allowed": allowed_signers(folder / f"{kind}.allowed", ("any", key.with_suffix(".pub")))}
        (folder / "message.sig").unlink()
    return {"folder": folder, "message": message, "keys": keys}


def _armor(blob: bytes) -> bytes:
    text = base64.b64encode(blob)
    return sshsig.BEGIN + b"\n".join(text[i:i + 70] for i in range(0, len(text), 70)) + b"\n" + sshsig.END + b"\n"


def _pure(signature: bytes, message: bytes) -> bool:
    try:
        sshsig.verify(signature, NAMESPACE, message)
        return True
    except sshsig.SshSigError:
        return False


def _openssh(folder: Path, allowed: Path, signature: bytes, message: bytes) -> bool:
    (folder / "damaged.sig").write_bytes(signature)
    return openssh_verifies(allowed, "any", folder / "damaged.sig", message).returncode == 0


def test_pure_verifier_accepts_what_ssh_keygen_signs(file_keys):
    for kind, key in file_keys["keys"].items():
        checked = sshsig.verify(key["sig"], NAMESPACE, file_keys["message"])
        assert checked.key == sshsig.parse_public_key_text(key["pub"].read_text()), kind


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(KEY_TYPES)), where=st.sampled_from(["signature", "anywhere", "message", "none",
                                                                        "truncate", "append"]),
       offset=st.integers(min_value=0, max_value=10_000), flip=st.integers(min_value=1, max_value=255))
def test_pure_verifier_agrees_with_ssh_keygen(file_keys, kind, where, offset, flip):
    key = file_keys["keys"][kind]
    blob, message = bytearray(sshsig.dearmor(key["sig"])), bytearray(file_keys["message"])
    if where == "signature":  # the last bytes hold the key's signature
        blob[len(blob) - 1 - offset % 80] ^= flip
    elif where == "anywhere":
        blob[offset % len(blob)] ^= flip
    elif where == "message":
        message[offset % len(message)] ^= flip
    elif where == "truncate":
        del blob[len(blob) - 1 - offset % 40:]
    elif where == "append":
        blob += bytes([flip]) * (1 + offset % 4)
    signature = _armor(bytes(blob))
    expected = _openssh(file_keys["folder"], key["allowed"], signature, bytes(message))
    assert _pure(signature, bytes(message)) == expected
    if where == "none":
        assert expected
