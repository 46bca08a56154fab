"""The reload child: `python -m itera_verify.reload.child JOB.json RESULT.json`, or `forked(argv)` in a process
the zygote forked (zygote.py: the libraries already imported, the same job and result files).

One fresh process per artifact, so a crash, a leak or a hang costs one artifact and nothing else. It reads the
job, sets its host memory limit on itself (limits.py), confines itself with Landlock and seccomp (confine.py:
read-only the package, the hub cache and the libraries, read-write its scratch folder, no TCP, no new socket), cuts
itself off the network,
runs one loader and writes what it proved as JSON; an allocation its limit refused is reported as that limit. It
never prints findings. A gated child (spawned GPU reloads, one at a time) imports its libraries, then waits for
one byte on its standard input before it touches the device: the parent starts the next child while the current
one loads, so library start-up overlaps the previous reload instead of adding to it.
"""
from __future__ import annotations

import errno
import json
import os
import resource
import socket
import sys
import time
from pathlib import Path

STARTED, STARTED_AT = time.monotonic(), time.time()


def cut_network() -> None:
    """HF_HUB_OFFLINE already keeps the libraries quiet; this makes any other attempt fail loudly instead. Python's
    layer over the kernel's (confine.py: Landlock refuses TCP, seccomp every new socket): no internet connection,
    no datagram sent, no unix socket reached by its path, no name looked up. A connected pair of unix sockets
    (socketpair: asyncio's and multiprocessing's wake-ups) reaches nothing and stays usable."""
    def refuse(*_args, **_kwargs):
        raise OSError(errno.EACCES, "network access is disabled while reloading (itera-verify)")

    internet, unix = (socket.AF_INET, socket.AF_INET6), getattr(socket, "AF_UNIX", None)
    original = {name: getattr(socket.socket, name) for name in ("connect", "connect_ex", "sendto", "sendmsg")}

    def guarded(name: str, refused):
        def method(self, *args, **kwargs):
            if self.family in internet or refused(self, args, kwargs):
                refuse()
            return original[name](self, *args, **kwargs)
        method.__name__ = name
        return method

    socket.socket.connect = guarded("connect", lambda sock, _args, _kw: sock.family == unix)
    socket.socket.connect_ex = guarded("connect_ex", lambda sock, _args, _kw: sock.family == unix)
    socket.socket.sendto = guarded("sendto", lambda _sock, _args, _kw: True)  # always to an address
    # sendmsg(buffers, ancdata, flags, address): on a connected pair no address is given.
    socket.socket.sendmsg = guarded("sendmsg", lambda _sock, args, kw: len(args) > 3 or "address" in kw)
    socket.getaddrinfo = refuse
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"


def rss_peak_bytes() -> int:
    """This process's peak resident memory. Linux: VmHWM, the high-water mark of its own memory since exec;
    ru_maxrss also counts the parent a spawned child was forked from before its exec (a whole pytest or tool
    process: 0.5 GiB that was never the reload's)."""
    from .limits import status_bytes

    peak = status_bytes("VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def rss_now_bytes() -> int | None:
    """Resident memory now (Linux): the baseline a load's host peak is compared with (imports included)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def pre_import(job: dict) -> None:
    """A spawned child's libraries, as a zygote would have imported them (preloads.py): library start-up is
    process start-up, not reload time; the libraries its run keeps out stay out, as in a forked child."""
    import importlib

    from .preloads import IMPORTS, keep_out

    keep_out(job.get("without") or ())
    for module in IMPORTS.get(job["loader"], ()):
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # a loader's optional library: its require() names the extra that installs it


def run(job: dict, started: float = STARTED, started_at: float = STARTED_AT) -> dict | None:
    """Load one artifact as the job says; what it proved, or None when the gate closed without a go.
    `started`: when this process began (a forked child begins at its fork, not at the zygote's start)."""
    import torch

    from .common import Outcome, Stop, short
    from .loaders import loader_module

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    pre_import(job)  # nothing left to import in a forked child: its zygote did
    imported = time.monotonic()
    if job.get("gated") and not sys.stdin.buffer.read(1):
        return None  # the parent closed the gate without a go: nothing to do
    let_through = time.monotonic()
    device, gpus = torch.device(job["device"]), []
    if device.type == "cuda":
        gpus = [int(gpu) for gpu in job.get("gpus") or [device.index or 0]]  # several: a model spread over them
        torch.cuda.set_device(gpus[0])
        for gpu in gpus:
            torch.cuda.reset_peak_memory_stats(gpu)
        device = torch.device("cuda", torch.cuda.current_device())
    rss_before = rss_now_bytes()
    outcome = Outcome(job)
    ready = time.monotonic()
    try:
        loader_module(job["loader"]).reload(job, device, outcome)
    except Stop as stop:
        if stop.failure:
            outcome.fail(stop.failure, stop.message, stop.file)
    except torch.cuda.OutOfMemoryError as exc:
        outcome.fail("crash", f"out of device memory on {device}: {short(exc, 200)}")
    except MemoryError:
        outcome.fail("crash", "out of memory (MemoryError)")
    except Exception as exc:  # noqa: BLE001 - a library error we did not foresee is still a failed reload, with its words
        outcome.fail("load", f"{type(exc).__name__}: {short(exc)}")
    _name_the_limit(outcome, job)
    loaded = time.monotonic()
    device_peak = sum(torch.cuda.max_memory_allocated(gpu) for gpu in gpus) if gpus else None
    peak = device_peak if gpus else rss_peak_bytes()
    devices = outcome.facts.pop("devices", None) or [str(device)]
    first = outcome.problems[0] if outcome.problems else {}
    return {
        "ok": outcome.ok, "failure": first.get("failure"), "error": first.get("message"),
        "problems": outcome.problems, "forward": outcome.forward, "facts": outcome.facts,
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "peak_memory_bytes": int(peak), "peak_rss_bytes": rss_peak_bytes(), "devices": devices,
        "host_peak_memory_bytes": rss_peak_bytes(), "device_peak_memory_bytes": device_peak,
        "host_rss_before_load_bytes": rss_before,
        "startup_seconds": round((imported - started) + (ready - let_through), 3),
        "gate_wait_seconds": round(let_through - imported, 3), "load_seconds": round(loaded - ready, 3),
        "started_at": started_at, "ended_at": time.time(),
    }


def _name_the_limit(outcome, job: dict) -> None:
    """An allocation refused under the job's limit (RLIMIT_DATA) says so, with the words the library used."""
    from .common import short
    from .limits import over_limit, refused_by_limit

    limit = job.get("memory_limit")
    for problem in outcome.problems:
        if limit and refused_by_limit(problem.get("message") or "", limit):
            problem["failure"] = "load"
            problem["message"] = (f"{over_limit(limit, job.get('memory_limit_source') or '')} "
                                  f"({short(problem['message'], 200)})")


def main(argv: list[str], started: float = STARTED, started_at: float = STARTED_AT) -> int:
    from .confine import confine_child
    from .limits import apply_in_child

    job_path, result_path = Path(argv[1]), Path(argv[2])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    apply_in_child(job)  # first: nothing of the artifact has been opened yet
    # Still one thread (a fresh interpreter, or a fork of the single-threaded zygote): every thread the libraries
    # start later inherits the confinement. The result, job and log live in the scratch folder.
    confine_child(job, str(result_path.parent))
    cut_network()
    result = run(job, started, started_at)
    if result is None:
        return 0
    partial = result_path.with_suffix(".partial")
    partial.write_text(json.dumps(result, default=str), encoding="utf-8")
    os.replace(partial, result_path)  # the parent never reads half a result
    return 0


def forked(argv: list[str]) -> int:
    """The entry a zygote's forked child runs (zygote.py): the same job, timed from the fork."""
    return main(argv, time.monotonic(), time.time())


if __name__ == "__main__":
    from ..runtime.ending import end_child

    end_child(lambda: main(sys.argv))  # as a forked child ends (zygote.py): no teardown of torch, ~1 CPU-s
