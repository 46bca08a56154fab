"""Confined reloads (docs/format.md): each reload child confines itself with Linux Landlock before it opens an
artifact. The kernel itself refuses what a package could make a library do: write outside the child's scratch
folder, read the user's files, open a TCP connection. No mock: a real forked child confines itself exactly as a
reload child does (reload/confine.py `confine_child`) and then tries; a real reload runs the attack through its
library; "no Landlock" is a real seccomp filter that answers Landlock's system calls as such a kernel does
(tests/no_landlock.py), under which the tool's own probe runs.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from itera_verify.reload.confine import confine_child, recorded
from itera_verify.runtime import landlock
from itera_verify.runtime.launcher import Forked
from tests.confined_child import attempt, confined, package  # noqa: F401 - package: a fixture
from tests.helpers import run_cli

ABI, WHY = landlock.abi_version()
HELD = f"landlock ABI {ABI}: fs, net; seccomp: no sockets"  # what a reload child says held (reload/confine.py)
pytestmark = pytest.mark.skipif(ABI < landlock.NET_ABI, reason=f"this kernel cannot confine files and TCP: {WHY}")
ROOT = Path(__file__).resolve().parents[1]


def write(path: Path) -> None:
    path.write_text("planted")


def test_a_child_that_writes_outside_its_scratch_folder_is_refused_by_the_kernel(tmp_path, package):
    outside = tmp_path / "outside"
    outside.mkdir()

    def tries(scratch: Path) -> dict:
        return {"outside file": attempt(lambda: write(outside / "planted")),
                "outside folder": attempt(lambda: os.mkdir(outside / "offload")),
                "into the package": attempt(lambda: write(package / "artifacts/model.safetensors")),
                "shared memory": attempt(lambda: write(Path("/dev/shm") / f"itera-{os.getpid()}")),
                "scratch": attempt(lambda: write(scratch / "offload.dat")),
                "read the package": attempt(lambda: (package / "artifacts/model.safetensors").read_bytes())}

    held, outcome = confined(tmp_path, {"package_root": str(package)}, tries, cut=False)
    assert held == HELD
    assert outcome == {"outside file": "EACCES", "outside folder": "EACCES", "into the package": "EACCES",
                       "shared memory": "EACCES", "scratch": "ok", "read the package": "ok"}
    assert list(outside.iterdir()) == [] and (package / "artifacts/model.safetensors").read_bytes() == b"weights"


def test_a_child_that_reads_the_ssh_keys_of_its_home_is_refused(tmp_path, package, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_x").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    monkeypatch.setenv("HOME", str(home))

    def tries(scratch: Path) -> dict:
        return {"key": attempt(lambda: Path("~/.ssh/id_x").expanduser().read_text()),
                "listing": attempt(lambda: os.listdir(Path("~/.ssh").expanduser())),
                "the package": attempt(lambda: (package / "artifacts/model.safetensors").read_bytes())}

    held, outcome = confined(tmp_path, {"package_root": str(package / "artifacts")}, tries, cut=False)
    assert held.startswith("landlock ABI")
    assert outcome == {"key": "EACCES", "listing": "EACCES", "the package": "ok"}


@pytest.fixture
def listener():
    """A TCP listener on loopback that this test owns (and closes)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    yield server.getsockname()
    server.close()


def connect(address) -> None:
    """A plain connect: create_connection would import encodings.idna first, a read the child may be refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(address)


def bind_any_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))


def test_a_child_that_connects_to_or_binds_a_tcp_port_is_refused(tmp_path, package, listener):
    connect(listener)  # the listener answers anyone unconfined

    def tries(_scratch: Path) -> dict:
        return {"connect": attempt(lambda: connect(listener)), "bind": attempt(bind_any_port)}

    held, outcome = confined(tmp_path, {"package_root": str(package)}, tries, cut=False)
    assert held == HELD
    assert outcome == {"connect": "EACCES", "bind": "EACCES"}


def test_a_thread_started_before_the_confinement_fails_the_child_under_confine_required(tmp_path, package):
    """Landlock reaches the calling thread and what it starts later: one already running stays free, so the
    child says so, and under `required` stops before loading anything."""
    import threading

    scratch = tempfile.mkdtemp(prefix="itera-reload-", dir=tmp_path)

    def child():
        threading.Thread(target=threading.Event().wait, args=(30,), daemon=True).start()
        confine_child({"package_root": str(package), "device": "cpu", "confine": "required"}, scratch)
        return "loaded"

    with pytest.raises(SystemExit, match="--confine required: this reload could not be confined"):
        Forked(child).result()
    assert recorded(scratch) == f"landlock ABI {ABI}: fs, net (1 earlier thread(s) unconfined); seccomp: no sockets"


@pytest.mark.parametrize("abi", [1, 3])
def test_a_kernel_with_an_older_landlock_confines_files_and_the_report_says_tcp_is_open(tmp_path, package,
                                                                                       listener, abi):
    """What the ruleset of an older ABI gets from the kernel (the same rights an ABI-`abi` kernel knows)."""
    outside = tmp_path / "outside"
    outside.mkdir()

    def tries() -> tuple[str, dict]:
        held = landlock.confine([(str(package), landlock.READ)], [str(tmp_path / "scratch")], abi_cap=abi)
        return held.describe(), {"write": attempt(lambda: write(outside / "x")),
                                 "connect": attempt(lambda: connect(listener))}

    (tmp_path / "scratch").mkdir()
    held, outcome = Forked(tries).result()
    assert held == f"landlock ABI {abi}: fs"
    assert outcome == {"write": "EACCES", "connect": "ok"}


@pytest.mark.slow
def test_a_sentence_transformers_offload_folder_outside_the_package_gets_nothing_written(tmp_path):
    """sentence_bert_config.json `model_args` makes the library spread the model with accelerate and create its
    offload folder where the file says (unconfined, the reload makes that folder); confined, the kernel refuses
    it whatever the loader lets through."""
    from fixtures.extra_loaders import reload_package, write_package, write_sentence_transformer

    root, outside = tmp_path / "package", tmp_path / "outside"
    (root / "artifacts").mkdir(parents=True)
    outside.mkdir()
    folder = write_sentence_transformer(root / "artifacts/st", tmp_path / "work")
    config = json.loads((folder / "sentence_bert_config.json").read_text())
    config["model_args"] = {"device_map": "auto", "max_memory": {"cpu": 1000},
                            "offload_folder": str(outside / "offload")}
    (folder / "sentence_bert_config.json").write_text(json.dumps(config))
    write_package(root, [("st", "sentence-transformers-model", "artifacts/st", {"loader": "sentence-transformers"})])
    results, _ = reload_package(root)
    assert results["st"].confinement == HELD
    assert list(outside.iterdir()) == []
    assert not results["st"].ok


@pytest.mark.slow
def test_the_clean_package_reloads_confined_and_every_report_says_so(package_dir, hf_cache, tmp_path):
    json_report, html_report = tmp_path / "report.json", tmp_path / "report.html"
    done = run_cli(package_dir, "--no-seal", "--hf-cache", hf_cache, "--confine", "required",
                   "--report", f"json={json_report}", "--report", f"html={html_report}")
    assert done.returncode == 0, done.stdout + done.stderr
    said = HELD
    reloads = json.loads(json_report.read_text())["reloads"]
    assert reloads and all(r["ok"] and r["confinement"] == said for r in reloads)
    assert f"confinement: {said}" in done.stdout and f"confinement: {said}" in html_report.read_text()


def without_landlock(*args, disabled: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
    """The command line on a kernel without Landlock (ENOSYS), or with it left out at boot (EOPNOTSUPP)."""
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
    env.update(HF_HUB_OFFLINE="1", NO_COLOR="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "validator"), str(ROOT), env.get("PYTHONPATH", "")]))
    flag = ["--disabled"] if disabled else []
    return subprocess.run([sys.executable, "-m", "tests.no_landlock", *flag, sys.executable, "-m", "itera_verify",
                           *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("disabled", [False, True], ids=["kernel-without-landlock", "landlock-left-out-at-boot"])
def test_confine_required_without_landlock_exits_2_with_one_line_before_any_work(package_dir, tmp_path, disabled):
    archive = tmp_path / "delivered" / "campaign.tar.zst"
    archive.parent.mkdir()
    archive.write_bytes(b"not read: the machine is refused first")
    for args in ([package_dir, "--confine", "required"], ["audit", archive, "--reload", "--confine", "required"]):
        done = without_landlock(*args, disabled=disabled)
        assert done.returncode == 2, done.stdout + done.stderr
        [line] = done.stderr.strip().splitlines()
        assert "--confine required: the reloads cannot be confined on this machine" in line
        assert ("no Landlock (ENOSYS)" if not disabled else "disabled on this kernel (EOPNOTSUPP") in line
        assert done.stdout == ""
    assert not list(package_dir.parent.glob("*.tar.zst"))  # nothing sealed


@pytest.mark.slow
def test_without_landlock_the_reloads_run_as_before_and_the_report_says_none(package_dir, hf_cache, tmp_path):
    json_report = tmp_path / "report.json"
    done = without_landlock(package_dir, "--no-seal", "--hf-cache", hf_cache, "--report", f"json={json_report}")
    assert done.returncode == 0, done.stdout + done.stderr
    reloads = json.loads(json_report.read_text())["reloads"]
    said = "none (this kernel has no Landlock (ENOSYS)); seccomp: no sockets"  # seccomp holds without Landlock
    assert reloads and all(r["ok"] and r["confinement"] == said for r in reloads)
    assert f"confinement: {said}" in done.stdout

