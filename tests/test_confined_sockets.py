"""What a reload child is handed and what it may still open (runtime/environment.py CHILD_VARIABLES,
runtime/seccomp.py, reload/child.py cut_network; docs/format.md "Confined reloads"). No mock: real forked children
confine themselves as reload children do and try against real sockets this test owns; a real zygote forks a real
child; "a kernel without seccomp filters" is a real seccomp filter that answers as such a kernel does."""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
import tempfile
from pathlib import Path

import pytest

from itera_verify.model import UsageError
from itera_verify.record.proofs import proof_env
from itera_verify.reload.child import cut_network
from itera_verify.reload.confine import check_mode, confine_child, recorded
from itera_verify.reload.runner import child_env, zygote_env
from itera_verify.runtime import landlock, seccomp
from itera_verify.runtime.environment import Environment
from itera_verify.runtime.launcher import Forked
from tests.confined_child import attempt
from tests.no_landlock import AUDIT_ARCH, BPF_JEQ_K, BPF_LD_W_ABS, BPF_RET_K, SockFilter, SockFprog

ABI, WHY = landlock.abi_version()
FILTERS, NO_FILTERS = seccomp.available()
linux_seccomp = pytest.mark.skipif(not FILTERS, reason=f"no seccomp filter here: {NO_FILTERS}")
SECRETS = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/EXAMPLEKEY",
           "GITHUB_TOKEN": "ghp_example", "HF_TOKEN": "hf_example", "SSH_AUTH_SOCK": "/run/user/1000/agent.sock",
           "XDG_RUNTIME_DIR": "/run/user/1000", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus",
           "HTTPS_PROXY": "http://user:password@proxy.example:3128", "PATH": "/home/reviewer/bin:/usr/bin",
           "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
NEEDED = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
          "CUDA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "4", "ITERA_RELOAD_HOST_MEMORY": "8G",
          "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "HOME": "/home/reviewer"}


# --- the variables -------------------------------------------------------------------------------------------

def test_a_reload_child_the_zygote_and_the_resume_proof_get_what_the_libraries_need_and_no_secret():
    environment = Environment.read({**SECRETS, **NEEDED, "HF_HOME": "/srv/hf", "TMPDIR": "/srv/tmp"})
    child = child_env({"hf_cache": "/cache", "threads": 2}, "/work", environment)
    zygote = zygote_env(environment)
    proof = proof_env("cpu", environment)
    for handed in (child, zygote, proof):
        assert not set(SECRETS) & set(handed), sorted(set(SECRETS) & set(handed))
        assert {k: handed[k] for k in ("LANG", "LC_ALL", "LD_LIBRARY_PATH", "ITERA_RELOAD_HOST_MEMORY",
                                       "PYTORCH_CUDA_ALLOC_CONF", "HOME")} == {
            k: NEEDED[k] for k in ("LANG", "LC_ALL", "LD_LIBRARY_PATH", "ITERA_RELOAD_HOST_MEMORY",
                                   "PYTORCH_CUDA_ALLOC_CONF", "HOME")}
    # The reload child's own: offline, its caches and temporary files in its scratch folder, the given hub cache.
    assert child["HF_HUB_OFFLINE"] == "1" and child["TMPDIR"] == "/work" and child["HF_HUB_CACHE"] == "/cache"
    assert child["HF_HOME"].startswith("/work/") and child["OMP_NUM_THREADS"] == "2"
    # The zygote keeps the user's thread count, read at import, not a run's: a forked child sets its job's own.
    assert zygote["OMP_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in zygote_env(Environment.read({k: v for k, v in NEEDED.items() if k != "OMP_NUM_THREADS"}))
    assert child["CUDA_VISIBLE_DEVICES"] == "1"
    # The proof runs the tool itself: it reads the settings (hub cache, temporary folder), on the CPU.
    assert proof["HF_HOME"] == "/srv/hf" and proof["TMPDIR"] == "/srv/tmp" and proof["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.slow
def test_a_child_the_zygote_forks_holds_none_of_the_reviewers_secrets(monkeypatch, tmp_path):
    """The real path: the zygote starts with the run's environment (its secrets in it), forks a child."""
    from tests.test_zygote import ROOT, ChildProcesses, Zygote, probe

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    children = ChildProcesses(Environment.read({**os.environ, **SECRETS}))
    started = Zygote(children, zygote_env(children.environment), light=True)
    try:
        started.wait_ready()
        assert started.client is not None, started.why
        variables = probe(children, started, tmp_path / "child", "look")["at_start"]["variables"]
    finally:
        started.close()
    assert not set(SECRETS) & set(variables), sorted(set(SECRETS) & set(variables))
    assert "HF_HUB_OFFLINE" in variables and "PYTHONPATH" in variables


# --- the sockets ---------------------------------------------------------------------------------------------

@pytest.fixture
def unix_listener(socket_home):
    """A unix socket with a path, listening, that this test owns (an agent's stand-in)."""
    path = socket_home / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(4)
        yield path


@pytest.fixture
def udp_server():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(1)
        yield server


def received(server) -> bytes:
    try:
        return server.recv(100)
    except socket.timeout:
        return b""


def reach(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))


def x32_socket() -> None:
    """socket(AF_INET, SOCK_DGRAM) under the x32 ABI's number: the same call, another number."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(0x40000000 | 41, socket.AF_INET, socket.SOCK_DGRAM, 0) < 0:
        raise OSError(ctypes.get_errno(), "x32 socket")


def io_uring() -> None:
    """io_uring_setup: a ring can open sockets (IORING_OP_SOCKET) without calling socket()."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    params = (ctypes.c_char * 120)()
    ring = libc.syscall(425, 4, params)
    if ring < 0:
        raise OSError(ctypes.get_errno(), "io_uring_setup")
    os.close(ring)


@linux_seccomp
@pytest.mark.skipif(ABI < landlock.NET_ABI, reason=f"this kernel cannot confine files and TCP: {WHY}")
def test_a_confined_child_opens_no_socket_of_any_family_nor_an_io_uring_and_keeps_its_socket_pairs(
        tmp_path, unix_listener):
    reach(unix_listener)  # the listener answers anyone unconfined
    scratch = tempfile.mkdtemp(prefix="itera-reload-", dir=tmp_path)

    def child() -> dict:
        confine_child({"package_root": str(tmp_path), "device": "cpu", "confine": "required"}, scratch)
        import asyncio

        tried = {"unix path": attempt(lambda: reach(unix_listener)),
                 "udp": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()),
                 "ipv6": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()),
                 "netlink": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()),
                 "io_uring": attempt(io_uring),
                 "pair": attempt(lambda: [end.close() for end in socket.socketpair()]),
                 "asyncio": attempt(lambda: asyncio.run(asyncio.sleep(0)))}
        if platform.machine() == "x86_64":
            tried["x32"] = attempt(x32_socket)
        return tried

    outcome = Forked(child).result()
    assert recorded(scratch) == f"landlock ABI {ABI}: fs, net; seccomp: no sockets"
    refused = {"unix path": "EACCES", "udp": "EACCES", "ipv6": "EACCES", "netlink": "EACCES", "io_uring": "EACCES"}
    assert outcome == {**refused, "pair": "ok", "asyncio": "ok",
                       **({"x32": "EACCES"} if platform.machine() == "x86_64" else {})}


def test_without_the_kernels_refusal_cut_network_refuses_datagrams_and_unix_sockets_by_path(tmp_path, unix_listener,
                                                                                          udp_server):
    """Python's layer alone (a kernel without seccomp): the child sends no datagram, reaches no agent."""
    address = udp_server.getsockname()

    def child() -> dict:
        cut_network()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        pair = socket.socketpair()
        tried = {"sendto": attempt(lambda: udp.sendto(b"AWS_SECRET_ACCESS_KEY=...", address)),
                 "sendmsg": attempt(lambda: udp.sendmsg([b"AWS_SECRET_ACCESS_KEY=..."], [], 0, address)),
                 "udp connect": attempt(lambda: udp.connect(address)),
                 "unix path": attempt(lambda: reach(unix_listener)),
                 "pair": attempt(lambda: pair[0].sendmsg([b"wake"]))}
        tried["pair"] += "" if pair[1].recv(4) == b"wake" else " but nothing arrived"
        return tried

    outcome = Forked(child).result()
    assert outcome == {"sendto": "EACCES", "sendmsg": "EACCES", "udp connect": "EACCES", "unix path": "EACCES",
                       "pair": "ok"}
    assert received(udp_server) == b""


def refuse_seccomp_filters() -> None:
    """From now on this process answers as a kernel built without seccomp filters: prctl(PR_SET_SECCOMP,
    SECCOMP_MODE_FILTER) fails with EINVAL, seccomp(2) with ENOSYS (x86_64 numbers)."""
    prctl, seccomp_call, pr_set_seccomp, first_argument = 157, 317, seccomp.PR_SET_SECCOMP, 16
    program = [SockFilter(BPF_LD_W_ABS, 0, 0, 4), SockFilter(BPF_JEQ_K, 0, 6, AUDIT_ARCH["x86_64"]),
               SockFilter(BPF_LD_W_ABS, 0, 0, 0), SockFilter(BPF_JEQ_K, 5, 0, seccomp_call),
               SockFilter(BPF_JEQ_K, 0, 3, prctl), SockFilter(BPF_LD_W_ABS, 0, 0, first_argument),
               SockFilter(BPF_JEQ_K, 0, 1, pr_set_seccomp),
               SockFilter(BPF_RET_K, 0, 0, seccomp.SECCOMP_RET_ERRNO | errno.EINVAL),
               SockFilter(BPF_RET_K, 0, 0, seccomp.SECCOMP_RET_ALLOW),
               SockFilter(BPF_RET_K, 0, 0, seccomp.SECCOMP_RET_ERRNO | errno.ENOSYS)]
    filters = (SockFilter * len(program))(*program)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(seccomp.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    assert libc.prctl(pr_set_seccomp, seccomp.SECCOMP_MODE_FILTER, ctypes.byref(SockFprog(len(program), filters)),
                      0, 0) == 0


@linux_seccomp
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the stand-in kernel's filter uses x86_64's numbers")
@pytest.mark.skipif(ABI < landlock.NET_ABI, reason=f"this kernel cannot confine files and TCP: {WHY}")
def test_confine_required_on_a_kernel_without_seccomp_filters_is_refused_and_auto_says_what_held(tmp_path):
    scratch = {mode: tempfile.mkdtemp(prefix=f"itera-{mode}-", dir=tmp_path) for mode in ("auto", "required")}

    def child(mode: str):
        def run():
            refuse_seccomp_filters()
            if mode == "check":
                return attempt(lambda: check_mode("required"))
            confine_child({"package_root": str(tmp_path), "device": "cpu", "confine": mode}, scratch[mode])
            return attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close())
        return run

    with pytest.raises(UsageError, match="--confine required: the reloads cannot be confined on this machine: "
                                         r"this kernel takes no seccomp filter \(ENOSYS\)"):
        Forked(child("check")).result()
    with pytest.raises(SystemExit, match="--confine required: this reload could not be confined"):
        Forked(child("required")).result()
    assert Forked(child("auto")).result() == "ok"  # auto goes on, and says so
    for mode in ("auto", "required"):
        assert recorded(scratch[mode]) == f"landlock ABI {ABI}: fs, net; seccomp: none (PR_SET_SECCOMP: EINVAL)"
