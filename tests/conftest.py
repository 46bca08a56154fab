"""Shared test harness: the real example package is built once per checkout (shared by xdist workers under a file
lock, kept for later sessions: FIXTURES); each test gets its own copy and plants one defect."""
from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from filelock import FileLock
from itera_verify import settle

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the `fixtures` builders live at the repository root

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# The reviewer's key (runtime/reviewer_key.py) is made on first use under the config folder: the tests' own, never
# the developer's (each xdist worker has one; a test's runs, which share a worker, share its key).
_CONFIG_HOME = tempfile.mkdtemp(prefix="itera-tests-config-")
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME
os.environ.pop("ITERA_RESULTS_KEY", None)
atexit.register(shutil.rmtree, _CONFIG_HOME, True)

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


_getaddrinfo = socket.getaddrinfo


def _guarded_getaddrinfo(host, *args, **kwargs):
    if host is not None and not _local(host):
        _refuse(host)
    return _getaddrinfo(host, *args, **kwargs)


def _guarded(original):
    """socket.connect or connect_ex, refusing an internet address beyond this machine."""
    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
            _refuse(address[0])
        return original(self, address)

    return connect


socket.getaddrinfo = _guarded_getaddrinfo
socket.socket.connect = _guarded(socket.socket.connect)
socket.socket.connect_ex = _guarded(socket.socket.connect_ex)


@pytest.fixture(autouse=True)
def no_network():
    before = len(NETWORK_ATTEMPTS)
    yield
    assert NETWORK_ATTEMPTS[before:] == [], f"the test tried to reach the network: {NETWORK_ATTEMPTS[before:]}"


def pytest_sessionfinish(session, exitstatus):
    if NETWORK_ATTEMPTS and session.exitstatus == 0:  # an attempt in a session fixture's set-up, or at collection
        print(f"\nnetwork access attempted during the tests: {sorted(set(NETWORK_ATTEMPTS))}", file=sys.stderr)
        session.exitstatus = 1


def _sources_digest() -> str:
    """The code a fixture build runs (the builders and the recorder they write packages with): a shared fixture
    built by other code is rebuilt. The shared folders outlive a session on the same machine (CI runs there)."""
    digest = hashlib.sha256()
    package = ROOT / "validator" / "itera_verify"
    for folder in (ROOT / "fixtures", package / "record", package / "integrations", package / "format"):
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


SOURCES_DIGEST = _sources_digest()


@functools.cache
def _libraries_digest() -> str:
    """The interpreter and every installed distribution's version: a fixture saved by another transformers or peft
    (a format that changed) is rebuilt."""
    from importlib import metadata

    installed = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    return hashlib.sha256("\n".join([sys.version, *installed]).encode()).hexdigest()[:16]


def _fixtures_folder() -> Path:
    """Where built_once keeps the shared fixtures from one session to the next: one folder per user and checkout
    in the temporary folder (a test reads the example's hub cache as a path under it, IV201), made private; one
    that is not (a link, another user's, open to others) is refused rather than trusted."""
    folder = Path(os.environ.get("ITERA_TEST_FIXTURES") or Path(tempfile.gettempdir()) /
                  f"itera-test-fixtures-{os.getuid()}-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}")
    folder.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{folder}: not a private folder of this user's; remove it, or set ITERA_TEST_FIXTURES")
    return folder


# The shared fixtures of built_once, kept from one session to the next: built once per clean clone, so
# `make test-fast` after `make test` builds none of them again.
FIXTURES = _fixtures_folder()


def _tree_digest(folder: Path) -> str:
    """Every file's path and bytes and every link's target under `folder` (its info.json aside): a shared fixture
    that a test changed by mistake is rebuilt, never handed to the next session."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if rel == "info.json":
            continue
        if path.is_symlink():
            digest.update(b"L" + rel.encode() + b"\0" + os.readlink(path).encode() + b"\0")
        elif path.is_file():
            digest.update(b"F" + rel.encode() + b"\0")
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        else:
            digest.update(b"D" + rel.encode() + b"\0")
    return digest.hexdigest()


def built_once(tmp_path_factory, name: str, build, version: str | None = None) -> tuple[Path, dict]:
    """(the shared folder, the info `build(folder)` returned): built once for all xdist workers and all later
    sessions of this checkout, under a file lock, in FIXTURES; rebuilt, from an empty folder, when `version`, the
    builders' sources (fixtures/ and the file that defines `build`, a test module's own builder included) or the
    installed libraries changed, or when its files are not those it was built with."""
    shared = FIXTURES / name
    builder = hashlib.sha256(Path(build.__code__.co_filename).read_bytes()).hexdigest()[:16]
    version = f"{version or ''}@{SOURCES_DIGEST}@{builder}@{_libraries_digest()}@{ROOT}"
    with FileLock(str(shared) + ".lock"):
        info_file = shared / "info.json"
        info = json.loads(info_file.read_text()) if info_file.exists() else {}
        if info.get("built_by") != version or info.get("tree") != _tree_digest(shared):
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            info = build(shared)
            info_file.write_text(json.dumps({**info, "built_by": version, "tree": _tree_digest(shared)}, default=str))
    return shared, json.loads(info_file.read_text())


def private_copy(package: str, tmp_path: Path, name: str) -> Path:
    """A private copy of a shared package (links copied as links), for one test to change."""
    return Path(shutil.copytree(package, tmp_path / name, symlinks=True))


def _package_and_cache(shared: Path) -> tuple[Path, Path]:
    """Where a builder writes its package and its hub cache (built_once hands it an empty folder)."""
    return shared / "package", shared / "hf-cache"


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict:
    """The pristine example package and its hub cache, built once for all workers."""
    def build(shared: Path) -> dict:
        from fixtures.build import build_hub_cache, build_package

        package, cache = _package_and_cache(shared)
        build_hub_cache(cache)
        return build_package(package, cache)

    shared, info = built_once(tmp_path_factory, "itera-fixture", build)
    return dict(info, package=str(shared / "package"), hf_cache=str(shared / "hf-cache"))


@pytest.fixture(scope="session")
def hf_cache(built) -> Path:
    return Path(built["hf_cache"])


@pytest.fixture
def package_dir(built, tmp_path) -> Path:
    """A private copy of the clean package, for one test to change."""
    return private_copy(built["package"], tmp_path, "pkg")


@pytest.fixture(scope="session")
def built_classifier(tmp_path_factory) -> dict:
    """The LoRA classification campaign (plain BERT base, SEQ_CLS adapter, Trainer checkpoint) and its hub cache,
    built once for all workers, in its own folder beside the demo's."""
    def build(shared: Path) -> dict:
        from fixtures.classifier_package import build_classifier_package

        return build_classifier_package(*_package_and_cache(shared))

    shared, info = built_once(tmp_path_factory, "itera-classifier-fixture", build)
    return dict(info, package=str(shared / "package"), hf_cache=str(shared / "hf-cache"))


@pytest.fixture
def classifier_dir(built_classifier, tmp_path) -> Path:
    """A private copy of the clean classification campaign, for one test to change."""
    return private_copy(built_classifier["package"], tmp_path, "classifier-pkg")


@pytest.fixture(scope="session")
def built_multigpu(built, tmp_path_factory) -> dict:
    """The example package plus the multi-GPU layouts (DDP, DeepSpeed ZeRO-2/3, FSDP/DCP, accelerate, Lightning),
    written on the CPU by 2 gloo processes with the real libraries (fixtures/multigpu.py), built once for all
    workers in its own folder; `extras` holds what is not in the package (the weights-only Lightning file)."""
    from fixtures.multigpu import build_multigpu_package, fixture_version

    shared, info = built_once(tmp_path_factory, "itera-multigpu-fixture",
                              lambda folder: build_multigpu_package(Path(built["package"]), folder),
                              version=fixture_version())
    return dict(info, package=str(shared / "package"), extras=str(shared / "extras"), hf_cache=built["hf_cache"])


@pytest.fixture
def multigpu_dir(built_multigpu, tmp_path) -> Path:
    """A private copy of the package with the multi-GPU layouts, for one test to change."""
    return private_copy(built_multigpu["package"], tmp_path, "multigpu-pkg")


@pytest.fixture(scope="session")
def sealed(built, tmp_path_factory) -> Path:
    """The clean example package, verified (without reloads) and sealed by the tool itself, once per session:
    the audit tests read it and write their hostile variants elsewhere."""
    from itera_verify import verify

    folder = tmp_path_factory.mktemp("sealed")
    shutil.copytree(built["package"], folder / "pkg", symlinks=True)
    campaign = json.loads((folder / "pkg" / "manifest.json").read_text())["campaign_id"]
    report = verify(folder / "pkg", settle(reload=False, output=folder / f"{campaign}.tar.zst"))
    assert report.sealed, [f.to_json() for f in report.findings]
    return folder / f"{campaign}.tar.zst"


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """This test's own temporary folder, where the audit makes its private one (and must remove it)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def socket_home(tmp_path) -> Path:
    """Where a test binds a unix socket of its own, `agent.sock`: a private folder in the test's, or in /tmp where
    a deep --basetemp would pass the 108 bytes of a socket address (runtime/sockets.py); removed after."""
    from itera_verify.runtime.sockets import socket_folder

    folder = Path(socket_folder("sock-", len("agent.sock"), str(tmp_path)))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# Every reload of the session forks its children from zygotes shared through ITERA_RELOAD_ZYGOTES (reload/shared.py):
# the tests' own runs, and the command line's in child processes (run_cli, the recorder's resume proofs). One folder
# for the whole session: the first process (the xdist controller, or the only one) makes it before any worker starts,
# so every worker inherits it and one import serves each environment and set of libraries in all of them; removing
# it at the session's end ends its servers. A test that watches a zygote's own start or end marks itself
# `own_zygote`: its runs start and end their own.
if "PYTEST_XDIST_WORKER" not in os.environ:
    from itera_verify.runtime.environment import RELOAD_ZYGOTES

    os.environ[RELOAD_ZYGOTES] = tempfile.mkdtemp(prefix="itera-shared-zygotes-")
    atexit.register(shutil.rmtree, os.environ[RELOAD_ZYGOTES], True)
# scikit-learn (imported with sentence-transformers) sets these two at its import, with setdefault: set first, every
# run of the session hands its zygote one environment, before that import and after it.
os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True")
os.environ.setdefault("KMP_INIT_AT_FORK", "FALSE")


@pytest.fixture(autouse=True)
def own_zygote(request, monkeypatch):
    if request.node.get_closest_marker("own_zygote") is not None:
        from itera_verify.runtime.environment import RELOAD_ZYGOTES

        monkeypatch.delenv(RELOAD_ZYGOTES, raising=False)
    yield


def pytest_configure(config):
    config.addinivalue_line("markers", "own_zygote: its reloads start and end their own zygote, not a shared one")


# `make test-fast` leaves out what builds or runs several training processes (the multi-GPU layouts written by
# gloo ranks, DeepSpeed's tensor and pipeline parallel runs, the torchrun recorder) and the tests marked slow;
# `make test` runs everything.
MULTIPROCESS_FIXTURES = {"built_multigpu", "multigpu_dir"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if MULTIPROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.multiprocess)


# What keeps `make test-fast` a third of `make test`: a test not marked slow that runs longer than this is named at
# the end of the run (marked slow, or made faster, it stops being named).
FAST_LANE_BUDGET_SECONDS = 10.0
_OVER_BUDGET: list[tuple[float, str]] = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.duration > FAST_LANE_BUDGET_SECONDS and "slow" not in report.keywords \
            and "multiprocess" not in report.keywords:
        _OVER_BUDGET.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if _OVER_BUDGET:
        terminalreporter.write_sep("-", f"not marked slow, over {FAST_LANE_BUDGET_SECONDS:.0f} s")
        for seconds, nodeid in sorted(_OVER_BUDGET, reverse=True):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")


# The object stores the push tests start on loopback (tests/push_stores.py). SeaweedFS: one per test process,
# started by the first module that asks and stopped at the session's end (each start is ~2.6 CPU-s and 5 s); every
# module finds it empty, its buckets removed as the module before it ended. rclone: one per module that asks.
# `proxy` stands between the client and SeaweedFS to plant faults.
@pytest.fixture(scope="session")
def _seaweedfs_process():
    started: list = []  # the running store, once a module asked for it
    yield started
    for store in started:
        store.stop()


@pytest.fixture(scope="module")
def seaweedfs(_seaweedfs_process, tmp_path_factory):
    from tests.push_stores import empty_store, start_seaweedfs

    if _seaweedfs_process and _seaweedfs_process[0].process.poll() is not None:
        _seaweedfs_process.pop().stop()  # it exited: the next module gets a fresh one
    if not _seaweedfs_process:
        _seaweedfs_process.append(start_seaweedfs(tmp_path_factory.mktemp("seaweedfs")))
    store = _seaweedfs_process[0]
    yield store
    try:
        empty_store(store)
    except Exception:  # noqa: BLE001 - a store that cannot be emptied is replaced, never handed on half-full
        _seaweedfs_process.pop().stop()


@pytest.fixture(scope="module")
def rclone(tmp_path_factory):
    from tests.push_stores import start_rclone

    store = start_rclone(tmp_path_factory.mktemp("rclone"))
    yield store
    store.stop()


@pytest.fixture
def proxy(seaweedfs):
    from tests.push_stores import FaultProxy

    between = FaultProxy(seaweedfs.endpoint)
    yield between
    between.close()


@pytest.fixture(scope="session")
def built_truth(built, tmp_path_factory) -> dict:
    """The declared-facts campaign (fixtures/truth.py): real tiny Trainer and PEFT runs recorded by the tool's own
    recorder; `clean` holds the correct controls, `planted` adds runs whose history is not one story, `extras`
    real saves a test swaps in. Built once for all workers, on the demo's hub cache."""
    from fixtures.truth import build_truth

    shared, info = built_once(tmp_path_factory, "itera-truth-fixture",
                              lambda folder: build_truth(folder, Path(built["hf_cache"])))
    return dict(info, clean=str(shared / "clean"), planted=str(shared / "planted"), extras=str(shared / "extras"))


@pytest.fixture
def truth_dir(built_truth, tmp_path) -> Path:
    """A private copy of the clean declared-facts campaign, for one test to change."""
    return private_copy(built_truth["clean"], tmp_path, "truth-pkg")
