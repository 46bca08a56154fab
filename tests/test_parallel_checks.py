"""The static checks split over forked processes: same findings, same order, digests handed back, a lost child's
share run in the parent, a child's error raised in the parent; and the allocator setting of the command line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from itera_verify import rules
from itera_verify.runtime.launcher import ChildLost, Forked
from itera_verify.model import UsageError
from itera_verify.rules import Selection, families
from itera_verify.flows import checks
from itera_verify.flows.checks import run_checks
from itera_verify.flows.verify import PARALLEL_MIN_FILES, check_processes
from tests.helpers import context
from itera_verify import settle

CAMPAIGN = "reviews-lora-2026-11"


def as_rows(findings) -> list[tuple]:
    return [(f.code, f.path, f.pointer, f.line, f.column, f.severity.value, f.message) for f in findings]


@pytest.fixture
def defective(package_dir):
    """Defects for several families at once: a temporary path (paths), an empty file (structure), a params file
    that no longer matches its config_sha256 (identity)."""
    (package_dir / "analysis" / "notes.json").write_text(json.dumps({"scratch": "/tmp/run-7/ckpt"}))
    (package_dir / "analysis" / "empty.json").write_bytes(b"")
    params = package_dir / "params" / "control.json"
    params.write_text(params.read_text().replace("}", ', "changed": true}', 1))
    return package_dir


def test_forked_result_comes_from_another_process():
    assert Forked(os.getpid).result() != os.getpid()


def test_forked_raises_what_the_child_raised_and_loses_nothing_unpicklable():
    def refuse():
        raise UsageError("metrics/control.jsonl: cannot read (Permission denied)")

    with pytest.raises(UsageError, match="Permission denied"):
        Forked(refuse).result()
    with pytest.raises(RuntimeError, match="cannot be pickled"):
        Forked(lambda: (lambda: None)).result()


def test_forked_child_killed_is_child_lost_and_cancel_reaps():
    with pytest.raises(ChildLost):
        Forked(lambda: os.kill(os.getpid(), signal.SIGKILL)).result()
    child = Forked(lambda: __import__("time").sleep(60))
    pid = child.pid
    child.cancel()
    child.cancel()  # twice is harmless
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left


def test_a_ctrl_c_landing_in_the_childs_after_fork_hooks_is_handed_to_the_parent_not_printed():
    # The race a clean-clone run hit once: Ctrl-C to the group while the child ran the interpreter's after-fork
    # hooks (random reseeds itself there) printed "Exception ignored ... KeyboardInterrupt" with a traceback.
    # Made certain here: a hook in a fresh interpreter sends the child SIGINT from inside the hooks.
    code = textwrap.dedent("""
        import os, signal, sys
        from itera_verify.runtime.launcher import Forked
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts it ignored
        os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGINT))
        try:
            value = Forked(lambda: 42).result()
        except KeyboardInterrupt:
            value = "interrupted"
        print(value)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted"  # the child's Ctrl-C reached the parent as one
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_families_are_really_split_and_the_heaviest_leaves_the_parent():
    static = [m for m in families() if getattr(m, "PHASE", "static") == "static"]
    shares = checks._balanced(static, 3)
    units = [(module.__name__, part) for share in shares for module, part in share]
    assert len(shares) == 3 and sorted({name for name, _ in units}) == sorted(m.__name__ for m in static)
    # A family that declares SPLIT comes in one part per process; the others whole.
    for module in static:
        parts = sorted(part for name, part in units if name == module.__name__)
        assert parts == ([(i, 3) for i in range(3)] if getattr(module, "SPLIT", False) else [None])
    heaviest = max((m for m in static if not getattr(m, "SPLIT", False)), key=lambda m: getattr(m, "COST", 1))
    assert heaviest not in [module for module, _ in shares[0]]  # the parent's share is the lightest


@pytest.mark.parametrize("count", [2, 3, 4])
def test_the_parts_of_a_split_family_in_order_are_the_whole_family(defective, count):
    """structure's parts share the files by cost and the package-wide findings go to the first and last: their
    findings, concatenated in order, are exactly those of one call."""
    from itera_verify.rules import structure

    (defective / "analysis" / "broken.json").write_text('{"a": ')
    (defective / "analysis" / "traces.jsonl").write_text('{"ok": 1}\n' * 5000 + "{nope\n")
    def rows(findings):  # straight from the family: no severity set yet
        return [(f.code, f.path, f.pointer, f.line, f.column, f.message) for f in findings]

    package = context(defective)
    whole = rows(structure.check(package))
    assert {"IV102", "IV104"} <= {row[0] for row in whole}
    parts = [rows(structure.check(context(defective), part=(index, count))) for index in range(count)]
    assert [row for part in parts for row in part] == whole
    files = [structure._part_of_files(package, index, count) for index in range(count)]
    assert [rel for part in files for rel in part] == sorted(package.inventory.files)
    assert sum(1 for part in files if part) >= 2  # the files really are shared


@pytest.mark.parametrize("processes", [2, 3])
def test_parallel_checks_find_exactly_what_one_process_finds_in_the_same_order(defective, processes):
    serial = run_checks(context(defective), Selection(), "static")
    parallel = run_checks(context(defective), Selection(), "static", processes=processes)
    assert {"IV201", "IV102", "IV304"} <= {f.code for f in serial}
    assert as_rows(parallel) == as_rows(serial)


def test_selection_and_levels_apply_in_the_children(defective):
    selection = Selection(ignore=("IV102",), levels={"IV201": rules.Severity.WARNING})
    parallel = run_checks(context(defective), selection, "static", processes=3)
    assert "IV102" not in {f.code for f in parallel}
    assert {f.severity for f in parallel if f.code == "IV201"} == {rules.Severity.WARNING}


def test_digests_a_child_computed_reach_the_parent(defective, monkeypatch):
    from itera_verify.rules import identity

    monkeypatch.setattr(identity, "COST", 10_000, raising=False)  # the heaviest: it runs in a child
    package = context(defective)
    run_checks(package, Selection(), "static", processes=2)
    assert "params/control.json" in package.documents.digests and "corpus/eval_ids.txt" in package.documents.digests


def test_a_child_that_dies_has_its_share_run_in_the_parent(defective, monkeypatch):
    from itera_verify.rules import paths

    parent = os.getpid()
    original = paths.check

    def dies_in_a_child(package):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(package)

    monkeypatch.setattr(paths, "COST", 10_000, raising=False)
    monkeypatch.setattr(paths, "check", dies_in_a_child)
    serial = run_checks(context(defective), Selection(), "static")
    parallel = run_checks(context(defective), Selection(), "static", processes=2)
    assert "IV201" in {f.code for f in parallel} and as_rows(parallel) == as_rows(serial)


def test_an_error_in_a_child_is_raised_in_the_parent(defective, monkeypatch):
    from itera_verify.rules import paths

    def unreadable(package):
        raise UsageError("analysis/notes.json: cannot read (Permission denied)")
        yield  # a generator, like every check

    monkeypatch.setattr(paths, "COST", 10_000, raising=False)
    monkeypatch.setattr(paths, "check", unreadable)
    with pytest.raises(UsageError, match="notes.json: cannot read"):
        run_checks(context(defective), Selection(), "static", processes=2)


def test_only_a_big_package_is_checked_in_several_processes(package_dir):
    assert check_processes(context(package_dir)) == 1
    many = package_dir / "analysis" / "samples"
    many.mkdir()
    for index in range(PARALLEL_MIN_FILES):
        (many / f"{index:05d}.json").write_text('{"id": %d}' % index)
    cores = len(os.sched_getaffinity(0))
    assert check_processes(context(package_dir)) == min(cores, 3)


def test_audit_of_a_big_package_rechecks_in_several_processes_and_still_finds_a_planted_path(package_dir, tmp_path,
                                                                                             monkeypatch):
    from itera_verify import verify
    from itera_verify.flows import audit as audit_flow
    from itera_verify.seal import seal_package

    many = package_dir / "analysis" / "samples"
    many.mkdir()
    for index in range(PARALLEL_MIN_FILES):
        (many / f"{index:05d}.json").write_text('{"id": %d}' % index)
    report = verify(package_dir, settle(reload=False, output=tmp_path / "clean.tar.zst"))
    assert report.sealed
    asked = []
    real = audit_flow.check_processes
    monkeypatch.setattr(audit_flow, "check_processes", lambda package: asked.append(real(package)) or 2)
    assert audit_flow.audit(tmp_path / "clean.tar.zst").verdict == "pass" and asked and asked[0] >= 1
    # The same package with a temporary path planted in one of the many files, sealed as it is.
    (many / "00777.json").write_text(json.dumps({"cache": "/tmp/hf-home/x"}))
    seal_package(context(package_dir), CAMPAIGN, {"SEAL/verification.json": b"{}"},
                 tmp_path / "dirty.tar.zst")
    found = audit_flow.audit(tmp_path / "dirty.tar.zst")
    assert [(f.code, f.path) for f in found.findings if f.code == "IV201"] == [
        ("IV201", "analysis/samples/00777.json")]


ALLOCATION_ROUNDS = textwrap.dedent("""
    import resource, sys
    from itera_verify.runtime.allocator import keep_freed_buffers
    applied = keep_freed_buffers() if sys.argv[1] == "tuned" else None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):  # rounds of 20 buffers of 4 MiB in flight, all freed: what the seal's frames do
        buffers = [bytearray(4 << 20) for _ in range(20)]
        del buffers
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                    reason="glibc only")
def test_the_audit_command_keeps_freed_buffers_instead_of_faulting_them_in_again():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}

    def faults(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", ALLOCATION_ROUNDS, mode], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0], int(out[1])

    applied, tuned = faults("tuned")
    _, default = faults("default")
    assert applied == "True"
    assert tuned * 4 < default  # about 20,000 faults (one round) against about 200,000 (every round)
    user_choice = subprocess.run([sys.executable, "-c", "from itera_verify.runtime.allocator import keep_freed_buffers;"
                                  "print(keep_freed_buffers())"], env={**env, "MALLOC_TRIM_THRESHOLD_": "1"},
                                 capture_output=True, text=True, check=True).stdout.strip()
    assert user_choice == "False"  # a user who tuned malloc keeps their settings


def test_only_the_audit_command_changes_the_allocator(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from itera_verify import cli

    calls = []
    monkeypatch.setattr(cli, "keep_freed_buffers", lambda: calls.append(1) or True)
    missing = tmp_path / "missing.tar.zst"
    assert CliRunner().invoke(cli.main, ["audit", str(missing)]).exit_code == 2
    assert calls == [1]
    assert CliRunner().invoke(cli.main, [str(tmp_path / "no-such-package"), "--no-reload"]).exit_code == 2
    assert calls == [1]  # verify keeps glibc's defaults


def test_a_fork_refused_by_the_system_runs_that_share_here(defective, monkeypatch):
    def refused():
        raise BlockingIOError(11, "Resource temporarily unavailable")  # what fork(2) says at a process limit

    serial = run_checks(context(defective), Selection(), "static")
    monkeypatch.setattr(os, "fork", refused)
    parallel = run_checks(context(defective), Selection(), "static", processes=3)
    assert as_rows(parallel) == as_rows(serial)


# ---- checks detached beside a seal -----------------------------------------------------------------------------
def test_detached_checks_run_every_family_in_a_child_and_find_what_one_process_finds(defective, monkeypatch):
    from itera_verify.flows.checks import StartedChecks

    parent = os.getpid()
    ran_here = []
    for module in families():
        original = module.check

        def recording(package, _original=original, _name=module.__name__, **options):  # phase= (rules/reload.py)
            if os.getpid() == parent:
                ran_here.append(_name)
            return _original(package, **options)

        monkeypatch.setattr(module, "check", recording)
    serial_package = context(defective)
    serial = run_checks(serial_package, Selection(), "static")
    assert ran_here  # the recording works: one process runs every family here
    ran_here.clear()
    package = context(defective)
    started = StartedChecks(package, Selection(), "static", detached=True)
    try:
        detached = started.result()
    finally:
        started.cancel()
    assert ran_here == [] and len(started._forked) == 1
    assert as_rows(detached) == as_rows(serial)
    assert package.documents.digests == serial_package.documents.digests  # config_sha256 and the like (IV704)


def test_verify_beside_a_seal_forks_the_checks_before_the_seal_starts_its_threads(package_dir, tmp_path,
                                                                                 monkeypatch):
    """A child forked while the seal's threads run could inherit a lock one of them held (and hang): the checks
    are forked first. The order is observed, not assumed: the fork records how many threads were running."""
    import threading

    from itera_verify.runtime import launcher
    from itera_verify import verify

    threads_at_fork = []
    real_fork = os.fork

    def recording_fork():
        threads_at_fork.append(sorted(t.name for t in threading.enumerate() if t.ident not in before))
        return real_fork()

    monkeypatch.setattr(launcher.os, "fork", recording_fork)
    before = {thread.ident for thread in threading.enumerate()}  # earlier tests' threads are not this run's
    report = verify(package_dir, settle(reload=False, output=tmp_path / "a.tar.zst"))
    assert report.sealed and report.verdict == "pass"
    assert len(threads_at_fork) == 1  # one child
    assert threads_at_fork[0] == [], threads_at_fork[0]  # no thread of this run existed yet, the seal's least


def test_a_signal_the_kernel_hands_to_another_thread_interrupts_the_wait_for_a_child():
    """Python runs a signal handler in the main thread only once that thread wakes: waiting for a child's result
    without a bound would hold Ctrl-C or SIGTERM back until the child ends."""
    import threading
    import time

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, handler)
    child = Forked(lambda: time.sleep(20))
    poker = threading.Thread(target=lambda: (time.sleep(0.3), signal.pthread_kill(threading.get_ident(),
                                                                                   signal.SIGUSR1)))
    started = time.monotonic()
    try:
        poker.start()
        with pytest.raises(Interrupted):
            child.result()
    finally:
        child.cancel()
        poker.join()
        signal.signal(signal.SIGUSR1, previous)
    assert time.monotonic() - started < 5


def test_select_runs_only_the_families_that_have_an_enabled_code(defective, monkeypatch):
    from itera_verify.flows.checks import StartedChecks

    ran = []
    for module in families():
        original, name = module.check, module.__name__.rsplit(".", 1)[-1]

        def recording(package, _original=original, _name=name, **kwargs):
            ran.append(_name)
            return _original(package, **kwargs)

        monkeypatch.setattr(module, "check", recording)
    findings = run_checks(context(defective), Selection(select=("IV201",)), "static")
    assert set(ran) == {"paths"}
    assert {f.code for f in findings} == {"IV201"}
    started = StartedChecks(context(defective), Selection(select=("IV1", "IV506")), "static")
    started.cancel()
    assert [m.__name__.rsplit(".", 1)[-1] for m in started.modules] == ["pickles", "structure", "template_files"]


def test_a_detached_child_hands_back_its_pickle_scan_and_parsed_run_files(defective, monkeypatch):
    """The parent builds the report and plans the reloads from what the child already read: it must not scan
    the pickles or parse the metrics a second time."""
    from itera_verify.package import pickles
    from itera_verify.flows.checks import StartedChecks

    package = context(defective)
    started = StartedChecks(package, Selection(), "static", detached=True)
    try:
        started.result()
    finally:
        started.cancel()
    scanned = package.documents.cache(pickles.SCAN_SETTING)
    assert any(rel.endswith(".pt") or rel.endswith(".bin") for rel in scanned), sorted(scanned)[:5]
    assert package.documents.cache("reader_scans"), "the parsed run files stayed in the child"

    def no_second_scan(path):
        raise AssertionError(f"{path} scanned again in the parent")

    monkeypatch.setattr(pickles, "scan_file", no_second_scan)
    assert pickles.scan_package(package) == scanned  # everything already known: nothing is opened again
    metrics_rel = package.documents.manifest["runs"][0]["metrics"]
    scans = package.documents.cache("reader_scans")
    assert any(key[1] == metrics_rel for key in scans), sorted(scans)[:5]
