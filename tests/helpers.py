"""Helpers tests import: `from tests.helpers import static_findings, codes, run_cli`."""
from __future__ import annotations

import json
import locale
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def context(package_dir, **options):
    """The run context of a package as the workflows build it: these options (RunOptions' names), settled
    without a configuration file."""
    from itera_verify.flows.config import Config, settle
    from itera_verify.package import RunContext, discover

    return RunContext(discover(package_dir), settle(Config(), **options))


def static_findings(package_dir: Path, **selection):
    """Every static finding of a package, through the library: no subprocess, no reload."""
    from itera_verify.flows.checks import run_checks
    from itera_verify.rules import Selection

    return run_checks(context(package_dir), Selection(**selection), "static")


def codes(findings) -> set[str]:
    return {f.code for f in findings}


def run_cli(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The real command line in a child process, offline: forked from this worker's warm command line
    (tests/cli_server.py) where the environment allows it, else a new interpreter."""
    full_env = cli_environment(env)
    argv = [sys.executable, "-m", "itera_verify", *map(str, args)]
    if forkable(full_env):
        return warm_cli().run(argv, cwd, full_env, timeout)
    return subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


# What an interpreter reads only as it starts (tests/cli_server.py): a command whose environment differs from the
# warm command line's here is run in a new interpreter.
STARTUP_VARIABLES = re.compile(r"PYTHON.*|LC_.*|LANG|LANGUAGE|TZ")


def _startup_variables(env: dict) -> dict:
    return {k: v for k, v in env.items() if STARTUP_VARIABLES.fullmatch(k)}


def forkable(env: dict) -> bool:
    return os.environ.get("ITERA_TEST_CLI") != "spawn" and _startup_variables(env) == _startup_variables(
        cli_environment())


def cli_environment(env: dict | None = None) -> dict:
    """A command's environment: this process's, offline, without colour, and `env` over it."""
    base = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}  # CI must not switch the format
    return {**base, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", **(env or {})}


class WarmCli:
    """This worker's tests/cli_server.py: started at the first command, ended with the worker."""

    def __init__(self) -> None:
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.lock = threading.Lock()
        root = Path(__file__).resolve().parents[1]
        errors = tempfile.TemporaryFile()  # what it says if it cannot import the tool
        self.server = subprocess.Popen([sys.executable, "-m", "tests.cli_server", str(theirs.fileno())], cwd=root,
                                       env=cli_environment(), pass_fds=[theirs.fileno()],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors)
        theirs.close()
        self.control.settimeout(120)
        ready = self.control.recv(16)
        self.control.settimeout(None)
        if ready != b"ready":
            self.server.kill()
            errors.seek(0)
            raise RuntimeError(f"tests/cli_server.py did not start (exit status {self.server.wait()}):\n"
                               f"{errors.read().decode(errors='replace')}")

    def run(self, argv: list[str], cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
        folder = os.path.abspath(cwd) if cwd is not None else os.getcwd()
        if not os.path.isdir(folder):
            raise FileNotFoundError(2, "No such file or directory", str(cwd))
        request = json.dumps({"module": argv[2], "args": argv[3:], "cwd": folder, "env": env}).encode()
        answer, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        (out, out_w), (err, err_w) = os.pipe(), os.pipe()
        stdin = 0 if _is_open(0) else os.open(os.devnull, os.O_RDONLY)
        try:
            with self.lock:
                socket.send_fds(self.control, [request], [theirs.fileno(), stdin, out_w, err_w])
        finally:
            for fd in (out_w, err_w, *([stdin] if stdin else [])):
                os.close(fd)
            theirs.close()
        with answer:
            pid = json.loads(answer.recv(4096))["pid"]
            deadline = time.monotonic() + timeout
            chunks: dict[int, list[bytes]] = {out: [], err: []}
            with selectors.DefaultSelector() as streams:
                for fd in chunks:
                    streams.register(fd, selectors.EVENT_READ)
                while streams.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        for key in list(streams.get_map().values()):
                            os.close(key.fd)
                        _kill(pid, answer, argv, timeout)
                    for key, _ in streams.select(left):
                        data = os.read(key.fd, 1 << 16)
                        if data:
                            chunks[key.fd].append(data)
                        else:
                            streams.unregister(key.fd)
                            os.close(key.fd)
            answer.settimeout(max(1.0, deadline - time.monotonic()))
            try:
                status = json.loads(answer.recv(4096))["status"]
            except TimeoutError:  # it closed its output but runs on
                _kill(pid, answer, argv, timeout)
        stdout, stderr = (_as_text(b"".join(chunks[fd])) for fd in (out, err))
        return subprocess.CompletedProcess(argv, status, stdout, stderr)


def _kill(pid: int, answer, argv: list[str], timeout: float):
    """What subprocess.run does past its timeout: the command (not what it started) killed, and waited for."""
    os.kill(pid, signal.SIGKILL)
    answer.settimeout(60)
    answer.recv(4096)
    raise subprocess.TimeoutExpired(argv, timeout)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _as_text(data: bytes) -> str:
    """What subprocess.run(text=True) makes of a stream: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


_WARM: list[WarmCli] = []
_WARM_LOCK = threading.Lock()


def warm_cli() -> WarmCli:
    with _WARM_LOCK:
        if not _WARM or _WARM[0].server.poll() is not None:
            _WARM[:] = [WarmCli()]
        return _WARM[0]


def torchrun_two(script: str, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node 2 SCRIPT` from the venv, on a free port (other test sessions may run torchrun
    too), its output captured; the caller checks the return code. Its temporary folder (torchelastic's log folder)
    is under `cwd`, removed with the test's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    torchrun = Path(__file__).resolve().parents[1] / ".venv/bin/torchrun"
    scratch = Path(cwd) / ".torchrun-tmp"
    scratch.mkdir(exist_ok=True)
    return subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", port, script], cwd=cwd,
                          env={**env, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=timeout, check=False)
