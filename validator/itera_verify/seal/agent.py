"""Talking to an ssh-agent (the agent protocol, draft-ietf-sshm-ssh-agent): list its keys, ask it to sign.

The private key stays in the agent (on the renter's own machine, through agent forwarding): this process sends
the bytes to sign and gets a signature back. A private key file is loaded into a temporary agent of this
process's own (`ssh-agent -D` on a socket in a private folder, `ssh-add`, killed when the seal ends), so that
both paths sign the same way and the key's bytes never pass through this process.
"""
from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

from ..format.sshsig import string
from ..model import UsageError
from ..runtime.sockets import socket_folder

REQUEST_IDENTITIES, IDENTITIES_ANSWER = 11, 12
SIGN_REQUEST, SIGN_RESPONSE = 13, 14
FAILURE = 5
RSA_SHA2_512 = 4  # the flag asking an RSA key for rsa-sha2-512, as ssh-keygen -Y sign does
MAX_MESSAGE = 256 << 10
KEY_LIFETIME = 86400  # seconds
AGENT_TIMEOUT = 120.0  # seconds: an agent may ask its user to confirm (ssh-add -c)
AGENT_PREFIX, AGENT_SOCKET = "itera-sign-", "agent.sock"  # the temporary agent's private folder and its socket


class AgentError(UsageError):
    """The agent cannot be reached, or refuses: one line, exit 2, nothing sealed."""


class Agent:
    def __init__(self, socket_path: str):
        self.socket_path = socket_path

    def _call(self, kind: int, payload: bytes) -> tuple[int, bytes]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(AGENT_TIMEOUT)
                sock.connect(self.socket_path)
                sock.sendall(struct.pack(">IB", len(payload) + 1, kind) + payload)
                size = struct.unpack(">I", _receive(sock, 4))[0]
                if not 0 < size <= MAX_MESSAGE:
                    raise AgentError(f"ssh-agent ({self.socket_path}) answered a message of {size} bytes")
                answer = _receive(sock, size)
        except OSError as exc:
            raise AgentError(f"cannot talk to ssh-agent at {self.socket_path} ({exc.strerror or exc})") from None
        return answer[0], answer[1:]

    def identities(self) -> list[bytes]:
        """The public key blobs the agent holds."""
        kind, payload = self._call(REQUEST_IDENTITIES, b"")
        if kind != IDENTITIES_ANSWER:
            raise AgentError(f"ssh-agent at {self.socket_path} refused to list its keys")
        try:
            count, pos, blobs = struct.unpack(">I", payload[:4])[0], 4, []
            for _ in range(count):
                blob, pos = _string(payload, pos)
                _, pos = _string(payload, pos)  # the comment
                blobs.append(blob)
        except (struct.error, ValueError):
            raise AgentError(f"ssh-agent at {self.socket_path} answered a malformed key list") from None
        return blobs

    def sign(self, key_blob: bytes, data: bytes, flags: int = 0) -> bytes:
        """The key's signature blob (string algorithm, string bytes) over `data`."""
        kind, payload = self._call(SIGN_REQUEST, string(key_blob) + string(data) + struct.pack(">I", flags))
        if kind != SIGN_RESPONSE:
            raise AgentError(f"ssh-agent at {self.socket_path} refused to sign (was the signature confirmed? a "
                             "key added with ssh-add -c asks first)")
        try:
            return _string(payload, 0)[0]
        except ValueError:
            raise AgentError(f"ssh-agent at {self.socket_path} answered a malformed signature") from None


def _receive(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        piece = sock.recv(size - len(data))
        if not piece:
            raise ConnectionResetError("the agent closed the connection")
        data += piece
    return bytes(data)


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    if pos + 4 > len(data):
        raise ValueError("cut short")
    size = struct.unpack(">I", data[pos:pos + 4])[0]
    if pos + 4 + size > len(data):
        raise ValueError("cut short")
    return data[pos + 4:pos + 4 + size], pos + 4 + size


def running_agent() -> Agent:
    """The agent named by SSH_AUTH_SOCK (the one ssh forwards to the rented machine)."""
    path = os.environ.get("SSH_AUTH_SOCK")
    if not path:
        raise AgentError("--sign ssh:KEY.pub signs with the key in your ssh-agent, and SSH_AUTH_SOCK is not set (start "
                         "one with `eval $(ssh-agent)` and `ssh-add`, or connect with `ssh -A`; or give the private "
                         "key file: --sign ssh:KEY)")
    return Agent(path)


class TemporaryAgent:
    """`ssh-agent -D` on a socket in a private folder, holding one private key file (ssh-add asks for its
    passphrase on the terminal when it has one). close() kills the agent and removes the folder."""

    def __init__(self, key_file: Path):
        for tool in ("ssh-agent", "ssh-add"):
            if shutil.which(tool) is None:
                raise UsageError(f"--sign ssh:{key_file}: signing with a private key file needs OpenSSH's {tool}, "
                                 "which is not installed (or load the key into your ssh-agent and give KEY.pub)")
        self.folder = socket_folder(AGENT_PREFIX, len(AGENT_SOCKET))
        self.agent = Agent(os.path.join(self.folder, AGENT_SOCKET))
        self.process = subprocess.Popen(["ssh-agent", "-D", "-a", self.agent.socket_path],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_for_socket()
            env = {**os.environ, "SSH_AUTH_SOCK": self.agent.socket_path}
            # -t: a bound on how long the key stays loaded should this process die without closing the agent.
            done = subprocess.run(["ssh-add", "-q", "-t", str(KEY_LIFETIME), str(key_file)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace",
                                  timeout=AGENT_TIMEOUT)
            if done.returncode != 0:
                why = " ".join(done.stderr.split())[:200] or f"exit status {done.returncode}"
                raise UsageError(f"--sign ssh:{key_file}: ssh-add could not load the key ({why})")
            blobs = self.agent.identities()
            if len(blobs) != 1:
                raise UsageError(f"--sign ssh:{key_file}: the key file did not load as one key")
            self.key_blob = blobs[0]
        except BaseException:
            self.close()
            raise

    def _wait_for_socket(self) -> None:
        deadline = time.monotonic() + 10
        while not os.path.exists(self.agent.socket_path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise UsageError("ssh-agent did not start (a temporary agent holds the private key file while the "
                                 "seal signs)")
            time.sleep(0.01)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

