"""Signing a seal (docs/format.md, Signatures): `--sign ssh:KEY.pub` (the key in the running ssh-agent) or
`--sign ssh:KEY` (a private key file, loaded into a temporary agent of our own: seal/agent.py); with
`--sign model-signing:KEY.pem` too or instead, an OpenSSF model-signing signature (seal/oms.py).

The signer is opened before any work, so a key that is not in the agent or a file that cannot be read stops
the command at once (exit 2). At the seal it signs `SEAL/statement.json` (format/statement.py) and then the
archive's bytes (by their SHA-256, computed by the read-back: the archive is not read again); each signature is
verified here with the audit's own verifier before anything is published. A private key file inside the package
is refused: it would be sealed.
"""
from __future__ import annotations

import hashlib
import os
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..format import sshsig
from ..format.names import STATEMENT, STATEMENT_SIG
from ..format.statement import NAMESPACE, statement_bytes
from ..model import UsageError
from ..package import RunContext, inside_package
from ..version import __version__
from .agent import RSA_SHA2_512, Agent, AgentError, TemporaryAgent, running_agent
from .oms import OmsSigner, open_oms_signer

SCHEMES = ("ssh", "model-signing")
KEY_FILE_MAX = 1 << 20


@dataclass
class Signer:
    key: sshsig.PublicKey
    agent: Agent
    source: str  # how the key was named: ssh-agent, or the private key file
    temporary: TemporaryAgent | None = None

    def sign(self, hash_algorithm: str, digest: bytes) -> bytes:
        """The armored SSHSIG over content whose `hash_algorithm` digest is `digest`, checked before it is
        returned: an agent that answers with another key or a wrong signature never gets into an archive."""
        data = sshsig.signed_data(NAMESPACE, hash_algorithm, digest)
        flags = RSA_SHA2_512 if self.key.algorithm == "ssh-rsa" else 0
        armored = sshsig.armor(self.key.blob, NAMESPACE, hash_algorithm, self.agent.sign(self.key.blob, data, flags))
        try:
            checked = sshsig.verify(armored, NAMESPACE, digest=lambda name: digest if name == hash_algorithm else b"")
        except sshsig.SshSigError as exc:
            raise AgentError(f"the signature ssh-agent returned does not verify ({exc}); nothing was sealed") from None
        if checked.key.blob != self.key.blob:
            raise AgentError("ssh-agent signed with another key than the one asked for; nothing was sealed")
        return armored

    def sign_bytes(self, message: bytes) -> bytes:
        return self.sign("sha512", hashlib.sha512(message).digest())

    def describe(self) -> dict:
        return {"fingerprint": self.key.fingerprint, "algorithm": self.key.algorithm, "source": self.source}

    def close(self) -> None:
        if self.temporary is not None:
            self.temporary.close()


@dataclass
class Signers:
    """What --sign named: an SSH key (the signed statement and `<archive>.sig`), an OMS key (SEAL/model.sig), or
    one of each."""

    ssh: Signer | None = None
    oms: OmsSigner | None = None

    def close(self) -> None:
        if self.ssh is not None:
            self.ssh.close()


def open_signer(specs: str | Sequence[str], ctx: RunContext | None = None) -> Signers:
    """`ssh:PATH`: a public key (its private half in SSH_AUTH_SOCK's agent) or a private key file;
    `model-signing:PATH`: an EC private key (PEM). At most one of each. UsageError (exit 2) for anything that
    cannot sign."""
    signers = Signers()
    try:
        for spec in [specs] if isinstance(specs, str) else specs:
            scheme, sep, where = spec.partition(":")
            if scheme not in SCHEMES or not sep or not where:
                raise UsageError(f"--sign {spec}: expected ssh:KEY.pub (the key in your ssh-agent), ssh:KEY (a "
                                 "private key file) or model-signing:KEY.pem (an EC private key)")
            if getattr(signers, "ssh" if scheme == "ssh" else "oms") is not None:
                raise UsageError(f"--sign {spec}: one {scheme} key per seal")
            if scheme == "ssh":
                signers.ssh = _open_ssh(spec, where, ctx)
            else:
                path = Path(where).expanduser()
                _refuse_sealed_key(spec, path, _read_key(spec, path), ctx)
                signers.oms = open_oms_signer(spec, path)
    except BaseException:
        signers.close()
        raise
    return signers


def _read_key(spec: str, path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(KEY_FILE_MAX + 1)
    except OSError as exc:
        raise UsageError(f"--sign {spec}: cannot read the key ({exc.strerror or exc})") from None


def _open_ssh(spec: str, where: str, ctx: RunContext | None) -> Signer:
    path = Path(where).expanduser()
    head = _read_key(spec, path)
    if head.lstrip().startswith(b"-----BEGIN") and b"PRIVATE KEY" in head[:100]:
        _refuse_sealed_key(spec, path, head, ctx)
        temporary = TemporaryAgent(path)
        try:
            key = sshsig.parse_public_key(temporary.key_blob)
        except sshsig.SshSigError as exc:
            temporary.close()
            raise UsageError(f"--sign {spec}: {exc}") from None
        return Signer(key, temporary.agent, f"private key file {path.name}", temporary)
    try:
        key = sshsig.parse_public_key_text(head[:KEY_FILE_MAX].decode("utf-8", "replace"))
    except sshsig.SshSigError as exc:
        raise UsageError(f"--sign {spec}: {exc}") from None
    agent = running_agent()
    if key.blob not in agent.identities():
        raise AgentError(f"--sign {spec}: the key {key.fingerprint} is not in the ssh-agent at {agent.socket_path} "
                         "(ssh-add it there, or forward the agent that holds it: ssh -A)")
    return Signer(key, agent, "ssh-agent")


def _refuse_sealed_key(spec: str, path: Path, data: bytes, ctx: RunContext | None) -> None:
    """A private key inside the package, or a copy of it there, would be sealed into the archive."""
    if ctx is None:
        return
    if inside_package(ctx.inventory.root, path):
        raise UsageError(f"--sign {spec}: the private key is inside the package folder and would be sealed with it")
    digest = hashlib.sha256(data).digest()
    for rel, entry in ctx.inventory.files.items():
        if entry.size == len(data):
            try:
                if hashlib.sha256(ctx.inventory.abspath(rel).read_bytes()).digest() == digest:
                    raise UsageError(f"--sign {spec}: the package holds a copy of the private key ({rel}), which "
                                     "would be sealed")
            except OSError:
                continue


def host_facts() -> dict:
    return {"hostname": socket.gethostname(), "system": platform.system(), "release": platform.release(),
            "machine": platform.machine(), "python": platform.python_version()}


def signed_members(signer: Signer, campaign_id: str, sums: bytes, record: bytes | None,
                   model_signature: bytes | None, members: tuple[int, str]) -> dict[str, bytes]:
    """SEAL/statement.json and its signature, for the SHA256SUMS, model.sig and member listing the seal formed."""
    statement = statement_bytes(campaign_id=campaign_id, sums=sums, record=record, model_signature=model_signature,
                                members=members, tool="itera-verify", version=__version__,
                                sealed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), host=host_facts(),
                                signer=signer.key)
    return {STATEMENT: statement, STATEMENT_SIG: signer.sign_bytes(statement)}


def write_signature_file(path: Path, armored: bytes) -> None:
    """The archive's signature under its partial name (new, synced); the seal gives it its name."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(armored)
        fh.flush()
        os.fsync(fh.fileno())
