"""`audit DIR/ --engine ray`: the same audits as Ray tasks. A local Ray (127.0.0.1, no dashboard, no usage
statistics) starts and stops with the command; RAY_ADDRESS names a cluster the test started itself, on loopback,
stopped by its process group (never `ray stop`, which ends every Ray on the machine); a worker killed while it
audits is retried; a missing Ray is one exit-2 line naming the extra."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.push_stores import free_port

ray = pytest.importorskip("ray")
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_IMPORT_WARNING": "1"}


def delivery(folder: Path, sealed: Path, copies: int) -> Path:
    folder.mkdir()
    for index in range(copies):
        shutil.copy(sealed, folder / f"campaign-{index}.tar.zst")
    (folder / "damaged.tar.zst").write_bytes(os.urandom(1024))
    return folder


def processes_marked(mark: str) -> list[int]:
    """The live processes whose environment holds `mark` (those a command of this test started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_local_ray_audits_the_batch_and_stops_with_the_command(sealed, tmp_path):
    folder = delivery(tmp_path / "delivery", sealed, copies=2)
    mark = f"ITERA_RAY_TEST={uuid.uuid4().hex}"
    # A temporary folder whose path is too long for Ray's sockets: the command puts its Ray under /tmp.
    env = {**RAY_ENV, mark.split("=")[0]: mark.split("=")[1], "TMPDIR": str(tmp_path)}
    result = run_cli("audit", folder, "--engine", "ray", "--jobs", "2", "--format", "jsonl", env=env, timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    rows = {row["key"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert {key: row["verdict"] for key, row in rows.items()} == {
        "campaign-0.tar.zst": "pass", "campaign-1.tar.zst": "pass", "damaged.tar.zst": "fail"}
    assert "FAIL: 3 archives: 2 pass, 1 fail" in result.stderr
    deadline = time.monotonic() + 30  # the raylet and workers exit as ray.shutdown() returns
    while processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_marked(mark) == [], "a Ray process outlived the command"


@pytest.mark.slow
def test_ray_address_names_a_cluster_and_a_worker_killed_mid_audit_is_retried(sealed, tmp_path):
    folder = delivery(tmp_path / "delivery", sealed, copies=3)
    port = free_port()
    scratch = tempfile.mkdtemp(prefix="itera-ray-test-", dir="/tmp")  # Ray's socket paths must stay short
    mark = f"ITERA_RAY_CLUSTER={uuid.uuid4().hex}"
    # The cluster's token (Ray's default mode), given to the head and to the command; the head's workers import
    # this checkout, as a cluster's workers import the installed tool.
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex * 2}
    env = {**os.environ, **RAY_ENV, **auth, mark.split("=")[0]: mark.split("=")[1]}
    log = (tmp_path / "head.log").open("wb")  # what the head said, shown when it does not come up
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                             "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false",
                             "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={scratch}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    killed: list[int] = []
    stop = threading.Event()

    def kill_the_first_audit_worker() -> None:
        while not stop.is_set() and not killed:
            for pid in processes_marked(mark):
                try:
                    title = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if title.startswith(b"ray::audit_entry"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.05)

    try:
        wait_for_the_head(head, port, tmp_path / "head.log")
        killer = threading.Thread(target=kill_the_first_audit_worker, daemon=True)
        killer.start()
        result = run_cli("audit", folder, "--engine", "ray", "--jobs", "1", "--format", "json", "-q",
                         env={**RAY_ENV, **auth, "RAY_ADDRESS": f"127.0.0.1:{port}"}, timeout=300)
        stop.set()
        assert result.returncode == 1 and result.stdout.startswith("["), result.stderr[-3000:]
        rows = {row["key"]: row for row in json.loads(result.stdout)}
        assert killed, "no audit worker was seen running"
        assert [rows[f"campaign-{i}.tar.zst"]["verdict"] for i in range(3)] == ["pass"] * 3  # the killed one again
        assert rows["damaged.tar.zst"]["verdict"] == "fail"
        assert head.poll() is None  # the cluster the command joined is still there: it only left it
    finally:
        stop.set()
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(30)
        for pid in processes_marked(mark):  # what the head started in sessions of its own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)
        log.close()


def wait_for_the_head(head: subprocess.Popen, port: int, log: Path) -> None:
    """Until the head's GCS accepts connections (a loaded machine starts Ray slowly; the command under test
    waits only a bounded time for a cluster); the head's own words when it exits or takes past 180 s."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and head.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the Ray head did not come up (exit {head.poll()}):\n{log.read_text(errors='replace')[-3000:]}")


@pytest.mark.slow
def test_a_cluster_nobody_answers_at_is_one_line_in_bounded_time(sealed, tmp_path):
    folder = delivery(tmp_path / "delivery", sealed, copies=1)
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = run_cli("audit", folder, "--engine", "ray", env={**RAY_ENV, "RAY_ADDRESS": f"127.0.0.1:{port}"},
                     timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("itera-verify: error")]
    assert f"no Ray cluster answers at RAY_ADDRESS=127.0.0.1:{port}" in line
    assert time.monotonic() - started < 90  # Ray's driver alone retries such an address forever


def test_a_missing_ray_is_one_exit_2_line_naming_the_extra(sealed, tmp_path):
    broken = tmp_path / "no-ray" / "ray"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    folder = delivery(tmp_path / "delivery", sealed, copies=1)
    pythonpath = os.pathsep.join([str(broken.parent), os.environ.get("PYTHONPATH", "")])
    result = run_cli("audit", folder, "--engine", "ray", env={"PYTHONPATH": pythonpath})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == "itera-verify: error: --engine ray needs Ray: pip install 'itera-verify[ray]'"
