"""Faults injected into real runs of the command line: unreadable files, files changing between check and
seal, a read-only package, Ctrl-C and SIGTERM mid-reload and mid-seal, a hung or memory-starved reload child,
a full disk. Each must end in a clear exit code and message, with nothing half-written left behind: no final
archive, no partial file, no stray reload process, no temporary folder of ours.

How each fault is made real while CI runs as root (where chmod 000 denies nothing):
- unreadable files: the command line runs as `nobody` (setpriv) on a root-owned copy with one entry mode 000;
- read-only package: a read-only bind mount in a private mount namespace (`unshare -m`);
- full disk: a 64 KiB tmpfs mounted at the destination in a private mount namespace;
- hung reload: the first reload child is stopped with SIGSTOP from outside (found through /proc);
- memory limit: RLIMIT_AS set on the zygote with prlimit(2), as a container or an admin imposes it, tighter
  than each child's own limit (reload/limits.py, tested in test_reload_limits.py), while a child reloads a
  2 GiB tensor (a sparse file);
- between check and seal: the progress sink's start("seal"), which fires after every check and before the
  first archive byte, changes the file.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.fuzz.processes import (TAG_VARIABLE, Cli, can_run_as, cli_command, cmdline, give_to, mount_namespace,
                                  reload_children, tagged, tree_state, wait_until)

CAMPAIGN = "reviews-lora-2026-11"
ARCHIVE = f"{CAMPAIGN}.tar.zst"
# Who runs the tool when a read must be denied: ourselves when not root (chmod 000 denies the owner), `nobody`
# when root (root reads anything); False when root cannot switch user here.
DENIED_USER = None if os.geteuid() != 0 else ("nobody" if can_run_as("nobody") else False)
NAMESPACE = mount_namespace()  # a private mount namespace: a read-only bind mount, a tiny tmpfs
needs_denial = pytest.mark.skipif(DENIED_USER is False, reason="root without setpriv: no way to deny a read")


@pytest.fixture
def shared_dir():
    """A folder outside pytest's private (0700) temp root, so that `nobody` can reach what is inside."""
    path = Path(tempfile.mkdtemp(prefix="faults-shared-"))
    os.chmod(path, 0o755)
    yield path
    subprocess.run(["chmod", "-R", "u+rwX", str(path)], check=False)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tag() -> str:
    value = uuid.uuid4().hex
    yield value
    for pid in tagged(value):  # never leave a process of ours behind, whatever the test found
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def copy_package(built, dest: Path) -> Path:
    shutil.copytree(built["package"], dest, symlinks=True)
    # Readable by all, so that `nobody` meets exactly the entry a test denies (the libraries write some 0600).
    subprocess.run(["chmod", "-R", "a+rX", str(dest)], check=True)
    return dest


def error_line(err: str) -> str:
    """The one line the tool ends with when it cannot run (progress lines may come before it)."""
    lines = err.strip().splitlines()
    return lines[-1] if lines else ""


def ours_left(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []


# ---- unreadable ------------------------------------------------------------------------------------------------
@needs_denial
@pytest.mark.parametrize("rel", ["params/control.json", "metrics/control.jsonl", "corpus/eval_ids.txt",
                                 "checkpoints/control/checkpoint-4/optimizer.pt", "analysis/errors.md", "analysis"])
def test_entry_unreadable_at_check_exits_2_naming_it(built, shared_dir, tag, rel):
    package = copy_package(built, shared_dir / "pkg")
    os.chmod(package / rel, 0)
    cli = Cli(cli_command(package, "--no-reload", "--no-seal", user=DENIED_USER), tag=tag,
              workdir=shared_dir / "run")
    code, out, err = cli.wait(120)
    assert code == 2, out[-1500:] + err[-1500:]
    assert "Traceback" not in err and error_line(err).startswith("itera-verify: error: "), err
    assert rel in error_line(err) and "permission denied" in error_line(err).lower()


@needs_denial
def test_weights_unreadable_are_never_sealed_and_exit_2(built, shared_dir, tag):
    package = copy_package(built, shared_dir / "pkg")
    os.chmod(package / "artifacts/control-model/model.safetensors", 0)
    dest = shared_dir / "dest"
    dest.mkdir()
    if DENIED_USER:
        give_to(DENIED_USER, dest)
    cli = Cli(cli_command(package, "--no-reload", "-o", dest, user=DENIED_USER), tag=tag,
              workdir=shared_dir / "run")
    code, out, err = cli.wait(120)
    assert code == 2 and "Traceback" not in err and "model.safetensors" in error_line(err), err
    assert list(dest.iterdir()) == []


SEAL_HOOK = textwrap.dedent("""
    # Runs the real command line. The seal begins beside the checks: "deny" makes one file unreadable when it
    # begins; the other actions change one file once every check has run, before the seal is finished.
    import contextlib, os, sys
    from itera_verify import cli
    from itera_verify.flows import verify as verify_flow
    from itera_verify.runtime.progress import Progress
    target, action = sys.argv[1], sys.argv[2]
    class Hook(Progress):
        def start(self, key, description, total=None, unit=""):
            if key == "seal" and action == "deny":
                os.chmod(target, 0)
            if key == "seal" and action == "fifo":  # before the seal opens it; the checks (forked) may be earlier
                os.mkfifo(target + ".fifo")
                os.replace(target + ".fifo", target)  # at once: a reader sees the file or the fifo, never nothing
    real_build_report = verify_flow.build_report
    def build_report_then_change(*args, **kwargs):
        change()
        return real_build_report(*args, **kwargs)
    verify_flow.build_report = build_report_then_change
    def change():
        if action in ("deny", "fifo"):
            return
        if action == "delete":
            os.unlink(target)
        elif action == "grow":
            with open(target, "ab") as fh:
                fh.write(b"\\n")
        elif action == "replace":
            data = open(target, "rb").read()
            os.unlink(target)
            open(target, "wb").write(data)
        elif action == "rewrite-same-size-and-mtime":
            st = os.stat(target)
            with open(target, "r+b") as fh:
                first = fh.read(1)
                fh.seek(0)
                fh.write(bytes([first[0] ^ 1]))
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert hasattr(cli, "_make_progress"), "the CLI's progress factory moved: this hook needs updating"
    cli._make_progress = lambda quiet, verbose: contextlib.nullcontext(Hook())
    sys.argv = ["itera-verify", *sys.argv[3:]]
    cli.main()
""")


def run_with_seal_hook(target: Path, action: str, args, *, workdir: Path, tag: str, user: str | None = None):
    prefix = []
    if user:
        prefix = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", "--"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "ITERA_FAULT_TAG": tag}
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run([*prefix, sys.executable, "-c", SEAL_HOOK, str(target), action, *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=workdir, timeout=300)


@needs_denial
def test_file_unreadable_at_seal_exits_2_and_leaves_no_archive(built, shared_dir, tag):
    package = copy_package(built, shared_dir / "pkg")
    dest = shared_dir / "dest"
    dest.mkdir()
    if DENIED_USER:
        give_to(DENIED_USER, package, dest)  # the hook, running as that user, must be allowed to chmod the file
    target = package / "metrics/control.jsonl"
    result = run_with_seal_hook(target, "deny", [package, "--no-reload", "-o", dest], workdir=shared_dir / "run",
                                tag=tag, user=DENIED_USER)
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    assert "Traceback" not in result.stderr and "metrics/control.jsonl" in error_line(result.stderr)
    assert list(dest.iterdir()) == []


# ---- changed between check and seal ----------------------------------------------------------------------------
@pytest.mark.parametrize("action,rel", [
    ("delete", "analysis/errors.md"),
    ("grow", "metrics/control.jsonl"),
    ("replace", "artifacts/control-model/model.safetensors"),
    ("grow", "checkpoints/control/checkpoint-4/optimizer.pt"),
    ("rewrite-same-size-and-mtime", "artifacts/control-model/model.safetensors"),
])
def test_file_changed_between_check_and_seal_is_IV704_and_nothing_is_sealed(built, tmp_path, tag, action, rel):
    package = copy_package(built, tmp_path / "pkg")
    dest = tmp_path / "dest"
    dest.mkdir()
    result = run_with_seal_hook(package / rel, action, [package, "--no-reload", "-o", dest, "--format", "json"],
                                workdir=tmp_path / "run", tag=tag)
    assert result.returncode == 1, result.stdout[-1500:] + result.stderr[-2500:]
    report = json.loads(result.stdout)
    assert any(f["code"] == "IV704" and f.get("path") == rel for f in report["findings"]), report["findings"]
    assert report["archive"] in (None, {}) or not report["archive"].get("path")
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("level", ["warning", "info", "off"])
def test_a_refused_seal_fails_whatever_the_configured_level(built, tmp_path, tag, level):
    """`levels` can lower a finding, never make a seal that did not happen a pass: exit 1, verdict fail."""
    package = copy_package(built, tmp_path / "pkg")
    dest = tmp_path / "dest"
    dest.mkdir()
    config = tmp_path / "itera-verify.toml"
    config.write_text(f'[levels]\nIV704 = "{level}"\n')
    result = run_with_seal_hook(package / "metrics/control.jsonl", "grow",
                                [package, "--no-reload", "-o", dest, "--format", "json", "--config", config],
                                workdir=tmp_path / "run", tag=tag)
    assert result.returncode == 1, result.stdout[-1500:] + result.stderr[-2500:]
    report = json.loads(result.stdout)
    assert report["verdict"] == "fail" and report["sealed"] is False
    assert [f["severity"] for f in report["findings"] if f["code"] == "IV704"] == ["error"], report["findings"]
    assert list(dest.iterdir()) == []


def test_file_replaced_by_a_fifo_after_discovery_blocks_nothing_and_nothing_is_sealed(built, tmp_path, tag):
    """Opening a fifo for reading waits for a writer: neither the checks nor the seal may wait forever. The
    checks read it as an empty file (IV104), or read the file before the swap; the seal refuses it as changed
    (IV704). Either way stops.json has an error and nothing is sealed."""
    package = copy_package(built, tmp_path / "pkg")
    dest = tmp_path / "dest"
    dest.mkdir()
    result = run_with_seal_hook(package / "stops.json", "fifo", [package, "--no-reload", "-o", dest, "--format",
                                                                 "json"], workdir=tmp_path / "run", tag=tag)
    assert result.returncode == 1, result.stdout[-1500:] + result.stderr[-2500:]
    report = json.loads(result.stdout)
    assert any(f.get("path") == "stops.json" and f["severity"] == "error" for f in report["findings"]), \
        report["findings"]
    assert list(dest.iterdir()) == []


# ---- read-only package -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def read_only_run(built, tmp_path_factory):
    """The whole tool (reloads and seal) on a package bind-mounted read-only; one run shared by two tests."""
    if NAMESPACE is None:
        pytest.skip("needs a private mount namespace (unshare) to bind-mount the package read-only")
    base = tmp_path_factory.mktemp("readonly")
    package = copy_package(built, base / "pkg")
    dest = base / "dest"
    dest.mkdir()
    before = tree_state(package)
    tool = shlex.join(cli_command(package, "--hf-cache", built["hf_cache"], "--device", "cpu", "-o", dest,
                                  "--timeout", "300"))
    pkg = shlex.quote(str(package))
    # exit 97 if the mount is not read-only after all: the test would prove nothing
    script = (f"mount --bind {pkg} {pkg} && mount -o remount,bind,ro {pkg} || exit 98; "
              f"touch {pkg}/probe 2>/dev/null && exit 97; exec {tool}")
    tag = uuid.uuid4().hex
    cli = Cli([*NAMESPACE, "sh", "-c", script], tag=tag, workdir=base / "run")
    code, out, err = cli.wait(600)
    return {"code": code, "out": out, "err": err, "before": before, "package": package, "dest": dest,
            "tmp": cli.tmp, "left": tagged(tag)}


@pytest.mark.slow
def test_read_only_package_is_checked_reloaded_and_sealed_and_nothing_is_written_inside(read_only_run):
    run = read_only_run
    assert run["code"] == 0, run["out"][-3000:] + run["err"][-3000:]
    assert (run["dest"] / ARCHIVE).is_file() and (run["dest"] / f"{ARCHIVE}.sha256").is_file()
    assert tree_state(run["package"]) == run["before"], "the tool changed something inside the package"
    assert run["left"] == []


def test_a_full_run_leaves_nothing_in_the_temporary_folder(read_only_run):
    """Reload children and the seal clean up after themselves, third-party caches included."""
    assert ours_left(read_only_run["tmp"]) == []


# ---- signals -----------------------------------------------------------------------------------------------------
def reload_run(built, workdir: Path, tag: str, *extra) -> tuple[Cli, Path]:
    package = copy_package(built, workdir / "pkg")
    dest = workdir / "dest"
    dest.mkdir()
    cli = Cli(cli_command(package, "--hf-cache", built["hf_cache"], "--device", "cpu", "-o", dest,
                          "--format", "json", *extra), tag=tag, workdir=workdir / "run")
    return cli, dest


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c to the group", "sigterm to the main process"])
def test_signal_during_a_slow_reload_ends_the_children_promptly_and_leaves_nothing(built, tmp_path, tag, how):
    cli, dest = reload_run(built, tmp_path, tag, "--timeout", "300")
    children = wait_until(lambda: reload_children(tag), 120)
    assert children, "no reload child ever started"
    for pid in children:
        os.kill(pid, signal.SIGSTOP)  # a reload that takes long (a big model on a slow disk)
    if how.startswith("ctrl-c"):
        cli.signal_group(signal.SIGINT)  # the child runs in its own session: Ctrl-C reaches the tool only
    else:
        cli.signal_main(signal.SIGTERM)
    code, out, err = cli.wait(30)  # far less than the reload timeout: the interrupted tool must not wait for it
    assert code != 0 and "Traceback" not in err, err[-2000:]
    assert wait_until(lambda: not tagged(tag), 10), f"processes left running: {tagged(tag)}"
    assert [n for n in ours_left(cli.tmp) if n.startswith("itera")] == []
    assert list(dest.iterdir()) == []


def big_file_package(built, root: Path, megabytes: int = 48) -> Path:
    """The example package plus one incompressible file, so that a seal at level 19 lasts long enough."""
    package = copy_package(built, root)
    with open(package / "analysis" / "raw-scores.dat", "wb") as fh:
        fh.write(b"DATA")  # no pickle, zip or numpy magic: a plain data file
        for _ in range(megabytes):
            fh.write(os.urandom(1 << 19).hex().encode())  # hex text: level 19 searches it slowly (random bytes it skips)
    return package


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c to the group", "sigterm to the main process"])
def test_signal_during_the_seal_leaves_no_archive_and_no_partial_file(built, tmp_path, tag, how):
    package = big_file_package(built, tmp_path / "pkg")
    dest = tmp_path / "dest"
    dest.mkdir()
    cli = Cli(cli_command(package, "--no-reload", "-o", dest, "--level", "19", "--threads", "1"), tag=tag,
              workdir=tmp_path / "run")
    partial = wait_until(lambda: [p for p in dest.iterdir() if p.name.endswith(".partial")], 120, pause=0.01)
    assert partial, "the seal never started writing"
    if how.startswith("ctrl-c"):
        cli.signal_group(signal.SIGINT)
    else:
        cli.signal_main(signal.SIGTERM)
    code, out, err = cli.wait(60)
    assert code != 0 and "Traceback" not in err, err[-2000:]
    assert list(dest.iterdir()) == [], "a partial or final archive was left"
    assert [n for n in ours_left(cli.tmp) if n.startswith("itera")] == []


# ---- reload children that hang or run out of memory --------------------------------------------------------------
@pytest.mark.slow
def test_hung_reload_child_times_out_as_IV504_and_the_others_still_reload(built, tmp_path, tag):
    cli, _ = reload_run(built, tmp_path, tag, "--no-seal", "--timeout", "10")
    children = wait_until(lambda: reload_children(tag), 120)
    assert children, "no reload child ever started"
    hung_pid, hung = next(iter(children.items()))
    os.kill(hung_pid, signal.SIGSTOP)  # stopped: alive, silent, never finishing — a hang as the runner sees it
    code, out, err = cli.wait(400)
    report = json.loads(out)
    results = {r["artifact"]: r for r in report["reloads"]}
    assert results[hung]["failure"] == "timeout" and not results[hung]["ok"]
    assert any(f["code"] == "IV504" and f.get("artifact") == hung for f in report["findings"])
    assert all(r["ok"] for name, r in results.items() if name != hung), results
    assert code == 1 and not tagged(tag)


def huge_safetensors(path: Path, gib: float = 1.0) -> None:
    """A valid safetensors file holding one float32 tensor of `gib` GiB, all zeros, written sparse."""
    count = int(gib * (1 << 30)) // 4
    header = json.dumps({"huge": {"dtype": "F32", "shape": [count], "data_offsets": [0, count * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + count * 4)


def zygote_address_space() -> int:
    """Peak address space of a process that imported what the run's zygote imports (its preload)."""
    probe = ("from itera_verify.reload.zygote import preload; preload(['gpt2']); "
             "print(open('/proc/self/status').read())")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    status = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            env=env).stdout
    return int(next(line for line in status.splitlines() if line.startswith("VmPeak")).split()[1]) * 1024


def zygotes(tag: str) -> list[int]:
    return [pid for pid in tagged(tag) if "itera_verify.reload.zygote" in cmdline(pid)]


@pytest.mark.slow
def test_reload_child_over_its_memory_limit_is_IV504_and_the_others_still_reload(built, tmp_path, tag):
    cli_dir = tmp_path / "w"
    package = copy_package(built, cli_dir / "pkg")
    huge_safetensors(package / "artifacts" / "huge.safetensors", gib=2.0)
    manifest = json.loads((package / "manifest.json").read_text())
    manifest["artifacts"].append({"id": "huge", "run": "control", "kind": "safetensors",
                                  "path": "artifacts/huge.safetensors"})
    (package / "manifest.json").write_text(json.dumps(manifest, indent=2))
    spec = json.loads((package / "reload.json").read_text())
    spec["artifacts"]["huge"] = {"loader": "safetensors"}
    (package / "reload.json").write_text(json.dumps(spec, indent=2))
    # Room for a small model's reload beside the libraries, not for mapping and copying a 2 GiB tensor. Set on the
    # zygote while it imports (seconds before its first fork), so every child inherits it: no race with a child
    # that loads in milliseconds, and the small reloads prove they run under the same limit.
    limit = zygote_address_space() + (768 << 20)
    cli = Cli(cli_command(package, "--hf-cache", built["hf_cache"], "--device", "cpu", "--no-seal", "--format",
                          "json", "--timeout", "300", "--jobs", "1"), tag=tag, workdir=cli_dir / "run")
    zygote = wait_until(lambda: zygotes(tag), 120)
    assert zygote, "the run's zygote never started"
    import resource

    resource.prlimit(zygote[0], resource.RLIMIT_AS, (limit, limit))
    assert not reload_children(tag), "a reload child was forked before the limit: the test would race"
    code, out, err = cli.wait(600)
    report = json.loads(out)
    results = {r["artifact"]: r for r in report["reloads"]}
    assert {r["facts"].get("isolation") for r in results.values()} == {"fork"}, results
    assert not results["huge"]["ok"] and results["huge"]["failure"] in ("crash", "load"), results["huge"]
    assert re.search(r"memory|allocat", results["huge"].get("error") or "", re.I), results["huge"]
    assert any(f["code"] == "IV504" and f.get("artifact") == "huge" for f in report["findings"])
    assert all(r["ok"] for name, r in results.items() if name != "huge"), results
    assert code == 1 and not tagged(tag)


# ---- full disk ---------------------------------------------------------------------------------------------------
def test_full_disk_at_the_destination_exits_2_and_leaves_nothing(built, tmp_path, tag):
    package = copy_package(built, tmp_path / "pkg")
    dest = tmp_path / "dest"
    dest.mkdir()
    if NAMESPACE:  # a real full disk: a 64 KiB tmpfs over the destination, in a private namespace
        tool = shlex.join(cli_command(package, "--no-reload", "-o", dest))
        script = f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(dest))} || exit 98; {tool}; code=$?; " \
                 f"ls -A {shlex.quote(str(dest))} > {shlex.quote(str(tmp_path / 'left'))}; exit $code"
        cli = Cli([*NAMESPACE, "sh", "-c", script], tag=tag, workdir=tmp_path / "run")
        code, out, err = cli.wait(300)
        left = (tmp_path / "left").read_text().split()
    else:  # injected through the writer: the partial file's writes fail with ENOSPC after 64 KiB
        code, err, left = _full_disk_through_the_writer(package, dest)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err and error_line(err).startswith("itera-verify: error: "), err
    assert "No space left on device" in error_line(err)
    assert left == [], f"left in the destination: {left}"


def _full_disk_through_the_writer(package: Path, dest: Path):
    import errno

    from click.testing import CliRunner

    from itera_verify import seal as seal_module
    from itera_verify.cli import main

    class FullDisk:
        def __init__(self, real):
            self.real, self.room = real, 64 << 10

        def write(self, data):
            if len(data) > self.room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.room -= len(data)
            return self.real.write(data)

        def __getattr__(self, name):
            return getattr(self.real, name)

    real_open = seal_module._open_output
    seal_module._open_output = lambda path: FullDisk(real_open(path))
    try:
        result = CliRunner().invoke(main, [str(package), "--no-reload", "-o", str(dest)])
    finally:
        seal_module._open_output = real_open
    return result.exit_code, result.stderr, sorted(p.name for p in dest.iterdir())


# ---- a timeout that never expires --------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_timeout_that_can_never_expire_is_refused_with_exit_2(built, tmp_path, value):
    """A hung reload child is only stopped by its timeout: `nan` never compares past a deadline and `inf` never
    arrives, so either would let one hung artifact hold the rented machine forever."""
    from tests.helpers import run_cli

    result = run_cli(built["package"], "--no-reload", "--no-seal", "--timeout", value, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stdout[-1000:]
    assert "Traceback" not in result.stderr and "timeout" in error_line(result.stderr).lower()
    (tmp_path / "itera-verify.toml").write_text(f"timeout = {value}\n")
    result = run_cli(built["package"], "--no-reload", "--no-seal", cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "timeout" in error_line(result.stderr).lower(), result.stderr[-1000:]


SIGNAL_TO_A_WORKER_THREAD = textwrap.dedent("""
    import os, signal, sys, threading
    sys.path.insert(0, sys.argv[3])
    from tests.fuzz.processes import reload_children, wait_until
    from itera_verify import settle, verify

    def poke():  # the reloads stall; SIGTERM reaches the thread that waits for them, not the main thread
        children = wait_until(lambda: reload_children(sys.argv[4]), 120)
        for pid in children or ():
            os.kill(pid, signal.SIGSTOP)
        worker = next(t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor"))
        signal.pthread_kill(worker.ident, signal.SIGTERM)

    threading.Thread(target=poke, daemon=True).start()
    try:
        verify(sys.argv[1], settle(device="cpu", hf_cache=sys.argv[2], seal=False, timeout=300))
    except KeyboardInterrupt:
        print("interrupted")
""")


@pytest.mark.slow
@pytest.mark.own_zygote  # every process the run starts must end with it: no shared zygote (reload/shared.py)
def test_sigterm_the_kernel_hands_to_a_worker_thread_still_ends_a_stalled_reload(built, tmp_path, tag):
    """The kernel may deliver a process-wide signal to any thread; Python runs the handler in the main thread
    only once that thread wakes. Waiting on the reloads without a bound, the tool hung with children stopped."""
    package = copy_package(built, tmp_path / "pkg")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", TAG_VARIABLE: tag}
    child = subprocess.run([sys.executable, "-c", SIGNAL_TO_A_WORKER_THREAD, str(package), built["hf_cache"],
                            str(Path(__file__).resolve().parents[1]), tag],
                           env=env, capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "interrupted", child.stderr[-2000:]
    assert wait_until(lambda: not tagged(tag), 10), f"processes left running: {tagged(tag)}"
