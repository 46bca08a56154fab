"""Fork before threads, checked by code: a child forked while the tool's own threads run could inherit a lock
one of them held. runtime/launcher.py refuses such a fork; the checks then run in this process."""
from __future__ import annotations

import os
import threading

import pytest
from itera_verify.runtime.launcher import ForkAfterThreads, Forked
from tests.helpers import context


def hold_a_thread(name: str):
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name=name, daemon=True)
    thread.start()
    return release, thread


@pytest.mark.parametrize("name", ["seal", "archive-compress_0", "push-part_1", "push-follow"])
def test_a_fork_while_the_tools_threads_run_is_refused(name):
    release, thread = hold_a_thread(name)
    try:
        with pytest.raises(ForkAfterThreads, match=name):
            Forked(os.getpid)
    finally:
        release.set()
        thread.join()
    assert Forked(os.getpid).result() != os.getpid()  # once they are gone, the fork goes ahead


def test_the_checks_run_in_this_process_when_a_fork_is_refused(package_dir):
    from itera_verify.rules import Selection
    from itera_verify.flows.checks import StartedChecks

    expected = StartedChecks(context(package_dir), Selection(), "static", detached=True).result()
    release, thread = hold_a_thread("seal")
    try:
        checks = StartedChecks(context(package_dir), Selection(), "static", detached=True)
        assert checks._forked == []  # nothing forked: the share runs here
        found = checks.result()
    finally:
        release.set()
        thread.join()
    assert [(f.code, f.path, f.message) for f in found] == [(f.code, f.path, f.message) for f in expected]
