"""Fourth red team (independent): what a reload child could still reach if a package ever made a library run code
in it. The confinement (reload/confine.py, runtime/landlock.py) is the layer that should hold then. No mock: a
real forked child confines itself exactly as a reload child does (`confine_child`, then `cut_network`), with the
variables a reload child is given (reload/runner.py `child_env`), and tries; the services it reaches are real
(a real ssh-agent holding a real key, a UDP socket this test owns). Safe outcomes are asserted."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from itera_verify.reload.runner import child_env
from itera_verify.runtime import landlock
from itera_verify.runtime.environment import Environment
from tests.confined_child import attempt, confined, package  # noqa: F401 - package: a fixture

ABI, WHY = landlock.abi_version()
HELD = f"landlock ABI {ABI}: fs, net; seccomp: no sockets"  # what a reload child says held (reload/confine.py)
pytestmark = pytest.mark.skipif(ABI < landlock.NET_ABI, reason=f"this kernel cannot confine files and TCP: {WHY}")
needs_ssh = pytest.mark.skipif(not (shutil.which("ssh-agent") and shutil.which("ssh-keygen")),
                               reason="needs OpenSSH's ssh-agent and ssh-keygen")
SECRETS = {"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "GITHUB_TOKEN": "ghp_example",
           "SSH_AUTH_SOCK": "/run/user/1000/ssh-agent.sock"}


def test_a_reload_child_is_not_handed_the_reviewers_secrets(tmp_path):
    environment = Environment.read({**os.environ, **SECRETS})
    env = child_env({"hf_cache": None, "threads": 1}, str(tmp_path), environment)
    handed = sorted(set(SECRETS) & set(env))
    assert not handed, handed


@pytest.fixture
def agent(tmp_path, socket_home):
    """A real ssh-agent on a socket of this test, holding the reviewer's key; stopped by its pid."""
    key = tmp_path / "keys" / "reviewer"
    key.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "reviewer@example.com", "-f", str(key)],
                   check=True)
    sock = socket_home / "agent.sock"
    started = subprocess.run(["ssh-agent", "-a", str(sock), "-s"], check=True, capture_output=True, text=True)
    pid = int(started.stdout.split("SSH_AGENT_PID=", 1)[1].split(";", 1)[0])
    try:
        subprocess.run(["ssh-add", "-q", str(key)], check=True, env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                       capture_output=True)
        yield sock, key
    finally:
        os.kill(pid, 15)


@needs_ssh
def test_a_confined_child_cannot_sign_with_the_reviewers_ssh_agent(tmp_path, package, agent):
    sock, key = agent
    env = child_env({"hf_cache": None, "threads": 1}, str(tmp_path),
                    Environment.read({**os.environ, "SSH_AUTH_SOCK": str(sock)}))

    def tries(scratch: Path) -> str:
        listed = subprocess.run(["ssh-add", "-L"], capture_output=True, text=True)
        if listed.returncode != 0:
            return f"no key: {listed.stderr.strip()}"
        (scratch / "reviewer.pub").write_text(listed.stdout.splitlines()[0] + "\n")
        (scratch / "statement.json").write_text('{"campaign_id": "forged", "verdict": "pass"}\n')
        signed = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(scratch / "reviewer.pub"), "-n",
                                 "itera-verify-seal@v1", str(scratch / "statement.json")], capture_output=True,
                                text=True)
        if signed.returncode != 0:
            return f"not signed: {signed.stderr.strip()[-200:]}"
        return "signed" if (scratch / "statement.json.sig").read_text().startswith("-----BEGIN SSH SIGNATURE") \
            else "no signature"

    held, outcome = confined(tmp_path, {"package_root": str(package)}, tries, env)
    assert held == HELD
    if outcome == "signed":  # OpenSSH itself accepts it as the reviewer's signature
        (signature,) = tmp_path.glob("itera-reload-*/statement.json.sig")
        allowed = tmp_path / "allowed_signers"
        allowed.write_text(f"reviewer@example.com {key.with_suffix('.pub').read_text()}")
        with open(signature.with_name("statement.json"), "rb") as statement:
            verified = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", "reviewer@example.com",
                                       "-n", "itera-verify-seal@v1", "-s", str(signature)], stdin=statement,
                                      capture_output=True, text=True)
        assert verified.returncode != 0, f"the child signed with the reviewer's key: {verified.stdout.strip()}"
    assert outcome != "signed"


def test_a_confined_child_sends_no_udp_datagram(tmp_path, package):
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(2)
    address = server.getsockname()

    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
            out.sendto(b"AWS_SECRET_ACCESS_KEY=...", address)

    def tries(_scratch: Path) -> str:
        return attempt(send)

    try:
        held, outcome = confined(tmp_path, {"package_root": str(package)}, tries)
        try:
            received = server.recv(100)
        except socket.timeout:
            received = b""
    finally:
        server.close()
    assert held == HELD
    assert outcome != "ok" and received == b"", (outcome, received)


def test_a_confined_gpu_child_cannot_rewrite_an_audit_extraction_in_shared_memory(tmp_path, package):
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    extraction = Path(tempfile.mkdtemp(prefix="itera-audit-", dir="/dev/shm"))  # as flows/audit.py makes it
    try:
        manifest = extraction / "other-campaign" / "manifest.json"
        manifest.parent.mkdir()
        manifest.write_text('{"campaign_id": "other-campaign"}\n')

        def tries(_scratch: Path) -> str:
            return attempt(lambda: manifest.write_text('{"campaign_id": "rewritten"}\n'))

        held, outcome = confined(tmp_path, {"package_root": str(package), "device": "cuda:0"}, tries)
        assert held.startswith("landlock ABI")
        assert outcome == "EACCES" and manifest.read_text() == '{"campaign_id": "other-campaign"}\n'
    finally:
        shutil.rmtree(extraction, ignore_errors=True)


def test_a_confined_child_cannot_read_its_parents_environment_or_signal_it(tmp_path, package):
    """Refused right: the parent's variables in /proc and a signal to the parent stay out of reach."""
    parent = os.getpid()

    def tries(_scratch: Path) -> dict:
        return {"environ": attempt(lambda: Path(f"/proc/{parent}/environ").read_bytes()),
                "signal": attempt(lambda: os.kill(parent, 0))}

    held, outcome = confined(tmp_path, {"package_root": str(package)}, tries)
    assert held == HELD
    assert outcome == {"environ": "EACCES", "signal": "EPERM"}
