"""Shared test harness: the real example package is built once per test session (shared by xdist workers
under a file lock); each test gets its own copy and plants one defect."""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the `fixtures` builders live at the repository root

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# No test may reach the network. Beside the variables above (which a library reads once, at import), this
# process refuses any name lookup or connection beyond this machine, and remembers the attempt: a library that
# swallows the error (PEFT asking the hub for a base's config) still fails the test that caused it.
NETWORK_ATTEMPTS: list[str] = []
LOCAL_NAMES = {"", "localhost", "0.0.0.0", "::", "::1", socket.gethostname()}


def _local(host) -> bool:
    host = host.decode() if isinstance(host, bytes) else str(host)
    return host in LOCAL_NAMES or host.startswith("127.")


def _refuse(host) -> None:
    NETWORK_ATTEMPTS.append(str(host))
    raise OSError(f"network access from a test refused: {host}")


_getaddrinfo, _connect, _connect_ex = socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex


def _guarded_getaddrinfo(host, *args, **kwargs):
    if host is not None and not _local(host):
        _refuse(host)
    return _getaddrinfo(host, *args, **kwargs)


def _guarded_connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        _refuse(address[0])
    return _connect(self, address)


def _guarded_connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        _refuse(address[0])
    return _connect_ex(self, address)


socket.getaddrinfo = _guarded_getaddrinfo
socket.socket.connect, socket.socket.connect_ex = _guarded_connect, _guarded_connect_ex


@pytest.fixture(autouse=True)
def no_network():
    before = len(NETWORK_ATTEMPTS)
    yield
    assert NETWORK_ATTEMPTS[before:] == [], f"the test tried to reach the network: {NETWORK_ATTEMPTS[before:]}"


def pytest_sessionfinish(session, exitstatus):
    if NETWORK_ATTEMPTS and session.exitstatus == 0:  # an attempt in a session fixture's set-up, or at collection
        print(f"\nnetwork access attempted during the tests: {sorted(set(NETWORK_ATTEMPTS))}", file=sys.stderr)
        session.exitstatus = 1


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict:
    """The pristine example package and its hub cache, built once for all workers."""
    shared = tmp_path_factory.getbasetemp().parent / "itera-fixture"
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared) + ".lock"):
        info_file = shared / "info.json"
        if not info_file.exists():
            from fixtures.build import build_hub_cache, build_package

            for stale in ("package", "hf-cache"):
                shutil.rmtree(shared / stale, ignore_errors=True)
            build_hub_cache(shared / "hf-cache")
            info = build_package(shared / "package", shared / "hf-cache")
            info_file.write_text(json.dumps(info, default=str))
    info = json.loads(info_file.read_text())
    info["package"] = str(shared / "package")
    info["hf_cache"] = str(shared / "hf-cache")
    return info


@pytest.fixture(scope="session")
def hf_cache(built) -> Path:
    return Path(built["hf_cache"])


@pytest.fixture
def package_dir(built, tmp_path) -> Path:
    """A private copy of the clean package (links copied as links), for one test to change."""
    dest = tmp_path / "pkg"
    shutil.copytree(built["package"], dest, symlinks=True)
    return dest


@pytest.fixture(scope="session")
def built_classifier(tmp_path_factory) -> dict:
    """The LoRA classification campaign (plain BERT base, SEQ_CLS adapter, Trainer checkpoint) and its hub cache,
    built once for all workers, in its own folder beside the demo's."""
    shared = tmp_path_factory.getbasetemp().parent / "itera-classifier-fixture"
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared) + ".lock"):
        info_file = shared / "info.json"
        if not info_file.exists():
            from fixtures.classifier_package import build_classifier_package

            for stale in ("package", "hf-cache"):
                shutil.rmtree(shared / stale, ignore_errors=True)
            info = build_classifier_package(shared / "package", shared / "hf-cache")
            info_file.write_text(json.dumps(info, default=str))
    info = json.loads(info_file.read_text())
    info["package"] = str(shared / "package")
    info["hf_cache"] = str(shared / "hf-cache")
    return info


@pytest.fixture
def classifier_dir(built_classifier, tmp_path) -> Path:
    """A private copy of the clean classification campaign, for one test to change."""
    dest = tmp_path / "classifier-pkg"
    shutil.copytree(built_classifier["package"], dest, symlinks=True)
    return dest


@pytest.fixture(scope="session")
def built_multigpu(built, tmp_path_factory) -> dict:
    """The example package plus the multi-GPU layouts (DDP, DeepSpeed ZeRO-2/3, FSDP/DCP, accelerate, Lightning),
    written on the CPU by 2 gloo processes with the real libraries (fixtures/multigpu.py), built once for all
    workers in its own folder; `extras` holds what is not in the package (the weights-only Lightning file)."""
    shared = tmp_path_factory.getbasetemp().parent / "itera-multigpu-fixture"
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared) + ".lock"):
        info_file = shared / "info.json"
        from fixtures.multigpu import build_multigpu_package, fixture_version

        if not info_file.exists() or json.loads(info_file.read_text()).get("version") != fixture_version():
            info = build_multigpu_package(Path(built["package"]), shared)
            info_file.write_text(json.dumps(info, default=str))
    info = json.loads(info_file.read_text())
    info.update(package=str(shared / "package"), extras=str(shared / "extras"), hf_cache=built["hf_cache"])
    return info


@pytest.fixture
def multigpu_dir(built_multigpu, tmp_path) -> Path:
    """A private copy of the package with the multi-GPU layouts, for one test to change."""
    dest = tmp_path / "multigpu-pkg"
    shutil.copytree(built_multigpu["package"], dest, symlinks=True)
    return dest


@pytest.fixture(scope="session")
def sealed(built, tmp_path_factory) -> Path:
    """The clean example package, verified (without reloads) and sealed by the tool itself, once per session:
    the audit tests read it and write their hostile variants elsewhere."""
    from itera_verify import verify

    folder = tmp_path_factory.mktemp("sealed")
    shutil.copytree(built["package"], folder / "pkg", symlinks=True)
    campaign = json.loads((folder / "pkg" / "manifest.json").read_text())["campaign_id"]
    report = verify(folder / "pkg", reload=False, output=folder / f"{campaign}.tar.zst")
    assert report.sealed, [f.to_json() for f in report.findings]
    return folder / f"{campaign}.tar.zst"


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """This test's own temporary folder, where the audit makes its private one (and must remove it)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder
