"""A pytest worker's warm command line: `python -m itera_verify` with its imports already done.

Each command a test runs through tests.helpers.run_cli used to start an interpreter and import the tool (~0.2
CPU-s of ~0.3 for a static verify of the example package, several hundred commands a run). This server imports
the tool's modules once, then forks a process per command: that process takes the test's standard streams,
folder, environment and arguments and runs `itera_verify` as `python -m` does (runpy, `__main__`, the current
folder first on sys.path), and ends as the tool's command line ends (itera_verify/runtime/ending.py): threads
joined, atexit handlers run, the standard streams flushed, the exit status the command's, and no teardown of
every object after that.

What the interpreter reads only as it starts (PYTHON* variables, the locale, TZ) cannot be changed in a fork:
run_cli starts a real interpreter for an environment that differs there, and for every command when
ITERA_TEST_CLI=spawn. tests/test_cli_fork.py shows both ways give the same output, byte for byte.

Protocol, over a SOCK_SEQPACKET socket pair the worker made: the worker sends one request (JSON: module, args, cwd,
env) with four descriptors (a private socket for the answer, stdin, stdout, stderr). A forked handler forks the
command, sends its pid on the private socket, waits for it and sends its exit status. The server ends when the
worker closes its end or dies (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import pkgutil
import signal
import socket
import sys
import tempfile
import time

# Everything a command may import lazily, but the callbacks' integrations, which import torch and transformers.
PRELOADED = ("cli", "flows", "report", "rules", "package", "archive", "seal", "format", "runtime", "reload", "push",
             "record")
# The libraries its modules import only where a command needs them (a schema, a table, a bar).
LIBRARIES = ("jsonschema", "rich.console", "rich.progress", "rich.table", "rich.text", "rich.box", "rich.measure",
             "idna", "encodings.idna", "pprint")
# What the real command never imports at its start: were one preloaded, a fork would differ from it.
NEVER_PRELOADED = ("torch", "transformers", "numpy", "huggingface_hub", "ray", "boto3", "botocore")
PR_SET_PDEATHSIG = 1
MAX_REQUEST = 8 << 20


def preload() -> None:
    for name in PRELOADED:
        package = importlib.import_module(f"itera_verify.{name}")
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)
    for name in LIBRARIES:
        importlib.import_module(name)
    heavy = [name for name in NEVER_PRELOADED if name in sys.modules]
    assert not heavy, f"preloading the tool imported {heavy}"


def die_with_the_worker(worker: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != worker:  # it died before prctl
        os._exit(0)


def reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def serve(control: socket.socket) -> tuple[dict, list[int]]:
    """Returns only in a command's process, with its request and its (stdin, stdout, stderr)."""
    while True:
        message, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 4)
        if not message:
            os._exit(0)  # the worker closed its end
        reap()  # handlers that ended
        if os.fork() == 0:
            control.close()
            return handle(json.loads(message), fds)
        for fd in fds:
            os.close(fd)


def handle(request: dict, fds: list[int]) -> tuple[dict, list[int]]:
    answer, streams = socket.socket(fileno=fds[0]), fds[1:]
    command = os.fork()
    if command == 0:
        answer.detach()
        os.close(fds[0])
        return request, streams
    try:
        for fd in streams:
            os.close(fd)
        answer.send(json.dumps({"pid": command}).encode())
        _, status = os.waitpid(command, 0)
        answer.send(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
    except OSError:
        pass  # the worker is gone, or stopped waiting for a command it killed
    finally:
        os._exit(0)


def become_the_command(request: dict, streams: list[int]) -> None:
    """The process state `python -m itera_verify ARGS` starts with, in the test's folder and environment."""
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    tempfile.tempdir = None  # read from TMPDIR again, as a new interpreter does
    sys.argv = ["-m", *request["args"]]
    sys.path[0] = os.getcwd()  # `python -m` puts the current folder first


def run_the_command(module: str) -> None:
    """`python -m MODULE` (the tool, or tests/test_cli_fork.py's probe), ended as the tool's own command line ends
    (itera_verify/runtime/ending.py): the interpreter's end as far as a command can see it, not the teardown of
    every object, which in a fork of this server costs ~75 ms of CPU a command (each page it touches is copied).
    The tool's `__main__` ends so itself; a probe ends here."""
    import runpy

    from itera_verify.runtime.ending import end_program

    end_program(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))


if __name__ == "__main__":
    worker, control = os.getppid(), socket.socket(fileno=int(sys.argv[1]))
    die_with_the_worker(worker)
    preload()
    gc.freeze()  # a collection in a command then never walks (and so copies) the pages of what was preloaded
    control.send(b"ready")
    request, streams = serve(control)
    become_the_command(request, streams)
    module = request.get("module", "itera_verify")
    del worker, control, request, streams
    run_the_command(module)
