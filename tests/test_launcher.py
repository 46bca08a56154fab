"""One launcher for the tool's child processes (issue 24, item 3) and the environment read once (item 2):
one termination handler for the reloads and the seal, one stop event every waiter checks, the fork-order check
in the fork path, and one snapshot of the environment that the children start with and the report records."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from tests.helpers import run_cli
from itera_verify.runtime.environment import Environment
from itera_verify.runtime.launcher import (STOPPED, ForkAfterThreads, Forked, Launcher, Terminated,
                                           termination_unwinds, wait_until)
from itera_verify.runtime.progress import NULL_PROGRESS
from itera_verify import settle
from tests.helpers import context

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_sigterm_during_the_reloads_and_during_the_seal_meet_one_handler(package_dir, tmp_path, monkeypatch,
                                                                         hangup_disposition):
    """The reloads had their own handler (SIGTERM only, a plain KeyboardInterrupt, SIGHUP left fatal) beside
    the seal's: now both unwind through termination_unwinds, SIGTERM and SIGHUP alike."""
    from itera_verify import seal as seal_module
    from itera_verify.reload import runner

    handlers = {}
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a hangup the user does not ignore (not under nohup)

    def signalled_while(phase: str, signum: int):
        def hook(*args, **kwargs):
            handlers[phase] = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP))
            os.kill(os.getpid(), signum)
            time.sleep(30)  # the handler raises here, in this (main) thread
        return hook

    monkeypatch.setattr(runner, "start_zygote", signalled_while("reload", signal.SIGTERM))
    with pytest.raises(Terminated):
        runner.run_reloads(context(package_dir), device="cpu", timeout=60, jobs=1, progress=NULL_PROGRESS,
                           only=set())
    destination = tmp_path / "out" / "demo.tar.zst"
    destination.parent.mkdir()
    monkeypatch.setattr(seal_module, "unchanged_since_discovery", signalled_while("seal", signal.SIGHUP))
    with pytest.raises(Terminated):
        seal_module.seal_package(context(package_dir), "demo", {}, destination)
    assert list(destination.parent.iterdir()) == []  # the partial archive went with the unwinding
    reload_term, reload_hup = handlers["reload"]
    seal_term, seal_hup = handlers["seal"]
    assert reload_term.__code__ is reload_hup.__code__ is seal_term.__code__ is seal_hup.__code__
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # put back afterwards


@pytest.fixture
def hangup_disposition():
    """The test sets SIGHUP's disposition; whatever the run started with (nohup ignores it) is put back."""
    before = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, before)


def test_a_nested_block_puts_back_the_handler_it_found():
    before = signal.getsignal(signal.SIGTERM)
    with termination_unwinds():
        outer = signal.getsignal(signal.SIGTERM)
        with termination_unwinds():
            pass
        assert signal.getsignal(signal.SIGTERM) is outer
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_hangup_ignored_by_nohup_stays_ignored_while_sigterm_still_unwinds(hangup_disposition):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what `nohup itera-verify ...` starts with
    with termination_unwinds():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)  # ignored: the seal goes on
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_the_stop_event_ends_every_waiter_at_once():
    launcher = Launcher(Environment.read())
    children = [launcher.spawn(SLEEPER) for _ in range(2)]
    ends: dict = {}

    def wait_child(index, child):
        ends[index] = launcher.wait(child, 60)

    def wait_plain():  # any other wait of the run (the zygote's imports, a fork request): the same loop
        ends["plain"] = wait_until(lambda pause: time.sleep(pause) or False, stop=launcher.stop)

    waiters = [threading.Thread(target=wait_child, args=item) for item in enumerate(children)]
    waiters.append(threading.Thread(target=wait_plain))
    for thread in waiters:
        thread.start()
    time.sleep(0.5)
    stopped = time.monotonic()
    launcher.stop_all()
    for thread in waiters:
        thread.join(10)
    assert time.monotonic() - stopped < 3
    assert ends["plain"] == STOPPED
    assert all(ends[i].interrupted and ends[i].code == -signal.SIGKILL for i in range(2))
    assert launcher.spawn(SLEEPER) is None  # nothing new starts once the run is stopping


def test_a_child_is_waited_for_with_a_timeout_and_reaped():
    launcher = Launcher(Environment.read())
    end = launcher.wait(launcher.spawn(SLEEPER), 0.3)
    assert end.timed_out and not end.interrupted and end.code == -signal.SIGKILL and end.usage is not None
    end = launcher.wait(launcher.spawn([sys.executable, "-c", "raise SystemExit(3)"]), 60)
    assert (end.code, end.timed_out) == (3, False)


def test_the_fork_path_refuses_while_a_tool_thread_runs_and_a_spawn_does_not():
    """fork copies one thread (a lock another held stays held); a spawn execs a new program, so the launcher
    lets it start while the seal's thread runs, and refuses the fork."""
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="seal", daemon=True)
    thread.start()
    try:
        with pytest.raises(ForkAfterThreads, match="seal"):
            Forked(os.getpid)
        launcher = Launcher(Environment.read())
        assert launcher.wait(launcher.spawn([sys.executable, "-c", "pass"]), 60).code == 0
    finally:
        release.set()
        thread.join()


# ---- the environment, read once ---------------------------------------------------------------------------
def test_reload_children_start_with_the_runs_environment_not_the_live_one(monkeypatch):
    from itera_verify.reload.limits import configured_limit
    from itera_verify.reload.runner import child_env
    from itera_verify.runtime.hfcache import resolve_hf_cache

    snapshot = Environment.read({"PATH": os.environ.get("PATH", ""), "ITERA_PROBE": "at the start",
                                 "ITERA_RELOAD_HOST_MEMORY": "2G", "HF_HOME": "/srv/hf"})
    monkeypatch.setenv("ITERA_PROBE", "changed later")
    monkeypatch.setenv("ITERA_RELOAD_HOST_MEMORY", "1M")
    env = child_env({"hf_cache": "/cache"}, "/work", Launcher(snapshot).environment)
    assert env["ITERA_PROBE"] == "at the start" and env["TMPDIR"] == "/work" and env["HF_HUB_OFFLINE"] == "1"
    assert configured_limit(snapshot) == 2 << 30
    assert str(resolve_hf_cache(None, snapshot)) == "/srv/hf/hub"
    assert snapshot.applied() == {"ITERA_RELOAD_HOST_MEMORY": "2G", "HF_HOME": "/srv/hf"}  # what the tool reads


def test_the_report_records_the_environment_settings_that_applied(package_dir):
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json",
                     env={"ITERA_RELOAD_HOST_MEMORY": "3G", "CUDA_VISIBLE_DEVICES": ""})
    environment = json.loads(result.stdout)["configuration"]["environment"]
    assert environment["ITERA_RELOAD_HOST_MEMORY"] == "3G" and environment["CUDA_VISIBLE_DEVICES"] == ""
    assert environment["NO_COLOR"] == "1" and "HF_HUB_OFFLINE" not in environment  # only what the tool reads


def test_the_api_applies_the_environment_its_config_carries(package_dir):
    from itera_verify import verify
    from itera_verify.flows.config import Config

    report = verify(package_dir, settle(Config(environment=Environment.read({"GITHUB_WORKSPACE": "/ws"})), reload=False, seal=False))
    assert report.configuration["environment"] == {"GITHUB_WORKSPACE": "/ws"}


def test_kill_tree_ends_a_process_and_the_child_it_started_in_its_own_session(tmp_path):
    """A hung proof is killed with its reload child, which runs in its own session (record/proofs.py): killing the
    proof alone left the child running."""
    from itera_verify.runtime.launcher import kill_tree

    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(300)\n")])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    try:
        kill_tree(parent.pid)
        assert parent.wait(10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        for pid in (parent.pid, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (new) parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def test_a_child_forked_by_a_forked_child_holds_none_of_its_result_pipe(tmp_path):
    """The top process learns at once that its child died, though a grandchild that child forked still runs:
    the grandchild closed the pipe its parent hands its result through."""
    from itera_verify.runtime.launcher import ChildLost

    marker = tmp_path / "grandchild"

    def child():
        Forked(lambda: (marker.write_text(str(os.getpid())), time.sleep(30), b"")[2], raw=True)
        while not marker.exists() or not marker.read_text():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)

    outer = Forked(child)
    began = time.monotonic()
    try:
        with pytest.raises(ChildLost):
            outer.result()
        assert time.monotonic() - began < 15, "the grandchild held its parent's result pipe open"
    finally:
        if marker.exists() and marker.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker.read_text()), signal.SIGKILL)
