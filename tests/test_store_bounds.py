"""`itera-verify audit s3://...` from a store that lies (tests/lying_store.py, on loopback): every answer is read
with the length asked for and no more, in bounded time; a store that answers wrongly is its own one line (exit 2),
never "cannot be reached" and never advice to resume; the audit's memory stays bounded whatever the store sends."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.lying_store import LyingStore
from tests.push_stores import store_env

pytestmark = pytest.mark.slow  # each case runs the command line, about 3 s

MiB = 1 << 20
OBJECT = os.urandom(8 * MiB + 4096)  # two ranges: 8 MiB and 4 KiB
PEAK_MB = 300  # the audit's own peak is about 90 MB; reading whole answers took 700 MB to 1.1 GB here
# Peak RSS of the command line, its child processes included: the wrapper's only child is the command.
_MEASURED = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
             "print('peak-rss-kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
             "sys.exit(code)")


@pytest.fixture
def lying():
    """Make a lying store (stopped at the end of the test)."""
    made = []

    def make(data=OBJECT, **behaviour) -> LyingStore:
        made.append(LyingStore(data, **behaviour))
        return made[-1]

    yield make
    for store in made:
        store.stop()


def audit(store: LyingStore, *extra, cwd) -> tuple[subprocess.CompletedProcess, int]:
    """The command line against `store`, in a child process; (its result, its peak RSS in MB)."""
    env = {**os.environ, **store_env(store.endpoint), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    result = subprocess.run([sys.executable, "-c", _MEASURED, sys.executable, "-m", "itera_verify", "audit",
                             store.url, *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    lines = result.stderr.splitlines()
    peak = [int(line.split()[1]) for line in lines if line.startswith("peak-rss-kb ")]
    result.stderr = "\n".join(line for line in lines if not line.startswith("peak-rss-kb "))
    return result, peak[0] // 1024


def the_one_line(result: subprocess.CompletedProcess) -> str:
    """Exit 2 and one line: the store answered, so nothing about reaching it, nothing about resuming."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("itera-verify")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "cannot be reached" not in errors[0] and "resume" not in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("lie, said", [
    ("oversized", "the store answered 167772160 bytes for a range of 8388608 while reading the archive"),
    ("unannounced", "the store answered more than 8388608 bytes for a range of 8388608 while reading the archive"),
], ids=["content-length-says-160-MiB", "no-content-length-160-MiB"])
def test_a_store_answering_160_MiB_for_each_8_MiB_range_is_one_line_in_bounded_memory(lying, tmp_path, lie, said):
    store = lying(lie=lie, oversize=160 * MiB)
    result, peak = audit(store, cwd=tmp_path)
    assert said in the_one_line(result)
    assert peak < PEAK_MB, f"peak RSS {peak} MB"


@pytest.mark.parametrize("lie, said", [
    ("error-body", "the store sent an error answer to GetObject (HTTP 403) of 104857698 bytes (at most 65536 "
                   "are read) while reading the archive"),
    ("error-unannounced", "the store sent an error answer to GetObject (HTTP 403) of more than 65536 bytes "
                          "while reading the archive"),
], ids=["content-length-says-100-MB", "no-content-length"])
def test_a_100_MB_xml_error_body_is_one_line_in_bounded_memory(lying, tmp_path, lie, said):
    store = lying(lie=lie, oversize=100 * MiB)
    result, peak = audit(store, cwd=tmp_path)
    assert said in the_one_line(result)
    assert peak < PEAK_MB, f"peak RSS {peak} MB"


@pytest.mark.parametrize("lie, said", [
    ("short", "the store answered 8388607 bytes for a range of 8388608 while reading the archive"),
    ("cut", "the store answered 4194304 bytes for a range of 8388608 while reading the archive (its answer "
            "stopped 3 times"),
], ids=["content-length-one-short", "connection-closed-halfway"])
def test_a_store_answering_fewer_bytes_than_the_range_is_one_line(lying, tmp_path, lie, said):
    result, _ = audit(lying(lie=lie), cwd=tmp_path)
    assert said in the_one_line(result)


@pytest.mark.parametrize("lie", ["changed", "ignores-if-match"])
def test_an_object_replaced_after_its_head_is_refused_not_mixed(lying, tmp_path, lie):
    """Replaced between the HEAD and the first range: a store that honours If-Match answers 412; one that ignores
    it serves the new object under its new ETag, which the answer names."""
    result, _ = audit(lying(lie=lie), cwd=tmp_path)
    assert ("s3://reviews/campaign.tar.zst: the object changed while it was read (its ETag is no longer the one "
            "seen first)") in the_one_line(result)


def test_a_redirect_to_another_host_is_not_followed(lying, tmp_path):
    elsewhere = lying(b"what the other host would serve")
    store = lying(lie="redirect", redirect_to=elsewhere.endpoint)
    result, _ = audit(store, cwd=tmp_path)
    assert "the store answered 307 while reading the archive" in the_one_line(result)
    assert store.requests and elsewhere.requests == []  # nothing asked of the other host


def test_a_head_answer_with_a_thousand_headers_is_one_line(lying, tmp_path):
    result, _ = audit(lying(lie="many-headers"), cwd=tmp_path)
    assert "the store's answer is not one HTTP allows (got more than 100 headers)" in the_one_line(result)


def test_an_honest_store_on_loopback_serves_an_audit_that_passes(lying, sealed, tmp_path):
    """The same server, telling the truth about the session's sealed archive: the audit reads it and passes."""
    result, peak = audit(lying(sealed.read_bytes()), "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"verdict": "pass"' in result.stdout and peak < PEAK_MB


# ---- time: a store that trickles or stalls, with limits a test can wait for --------------------------------
@pytest.mark.parametrize("lie, said", [
    ("slow", "of 65536 bytes in 1 s (slower than 1048576 bytes/s after 1 s) while reading the archive"),
    ("stall", "the store answered 0 bytes for a range of 65536 while reading the archive (its answer stopped 3 "
              "times: Read timeout"),
], ids=["one-byte-every-0.2-s", "nothing-after-the-headers"])
def test_a_store_that_trickles_or_stalls_stops_the_audit_within_its_limits(lying, monkeypatch, lie, said):
    """An endless body at one byte every 0.2 s never trips a read timeout: the body's deadline (silence + length
    at the slowest rate) stops it. Here the limits are 1 s and 1 MiB/s (the defaults: 60 s and 32 KiB/s)."""
    from itera_verify.push.answers import StoreLimits
    from itera_verify.push.remote import open_remote
    from itera_verify.push.store import PushError

    store = lying(os.urandom(64 << 10), lie=lie, trickle=0.2)
    for name, value in store_env(store.endpoint).items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    remote = open_remote(store.url, store.endpoint, limits=StoreLimits(silence_seconds=1, slowest_rate=1 << 20))
    with pytest.raises(PushError) as refused:
        with remote.open() as reader:
            while reader.read(MiB):
                pass
    assert said in str(refused.value) and "resume" not in str(refused.value)
    assert time.monotonic() - started < 20
