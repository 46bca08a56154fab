"""Sealing: the archive's layout and interoperability, and that no bad archive ever gets the final name."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from itera_verify.rules.archive import seal_findings
import zstandard

from itera_verify.archive import ArchiveReader
from itera_verify.model import UsageError
from itera_verify.package import discover
from itera_verify.runtime.progress import Progress
from itera_verify import seal as seal_module
from itera_verify.seal import SealRefused, seal_package
from tests.fuzz.processes import ctrl_c_as_in_a_terminal
from tests.helpers import codes, run_cli, static_findings, context
from itera_verify import settle

CAMPAIGN = "reviews-lora-2026-11"
VALIDATOR = str(Path(__file__).resolve().parents[1] / "validator")


def sealed_names(archive: Path) -> list[str]:
    with open(archive, "rb") as source, ArchiveReader(source) as reader:
        return [member.name for member in reader]


def no_leftovers(folder: Path, final: Path) -> bool:
    """Nothing under the final name, no partial file, no checksum file."""
    names = sorted(p.name for p in folder.iterdir())
    return not final.exists() and not [n for n in names if n.endswith(".partial") or n.startswith(final.name)]


def seal_directly(package_dir: Path, destination: Path, **options):
    package = context(package_dir)
    return seal_package(package, CAMPAIGN, {"SEAL/verification.json": b'{"verdict": "pass"}\n'}, destination,
                       **options)


# ---- the archive -------------------------------------------------------------------------------------------
def test_verified_package_is_sealed_with_the_layout_of_the_spec(package_dir, tmp_path):
    from itera_verify import verify

    (package_dir / "checkpoints" / "latest").symlink_to("control/checkpoint-4")
    (tmp_path / "out").mkdir()  # -o FOLDER: the archive gets its campaign name inside
    report = verify(package_dir, settle(reload=False, output=tmp_path / "out"))
    assert report.verdict == "pass" and report.sealed, [f.to_json() for f in report.findings]
    archive = tmp_path / "out" / f"{CAMPAIGN}.tar.zst"
    assert report.archive["path"] == str(archive) and archive.exists()
    names = sealed_names(archive)
    assert names[0] == f"{CAMPAIGN}/" and all(n.startswith(f"{CAMPAIGN}/") for n in names)
    package_part = [n for n in names if not n.startswith(f"{CAMPAIGN}/SEAL")]
    assert package_part == sorted(package_part, key=lambda n: n.encode())
    assert names[-4:] == [f"{CAMPAIGN}/SEAL/", f"{CAMPAIGN}/SEAL/SHA256SUMS", f"{CAMPAIGN}/SEAL/report.html",
                          f"{CAMPAIGN}/SEAL/verification.json"]
    data = zstandard.ZstdDecompressor().decompress(archive.read_bytes(), max_output_size=1 << 30)
    with tarfile.open(fileobj=__import__("io").BytesIO(data)) as tar:
        infos = {info.name: info for info in tar.getmembers()}
    assert all((i.uid, i.gid, i.uname, i.gname) == (0, 0, "", "") for i in infos.values())
    assert all(i.mode in (0o644, 0o755, 0o777) for i in infos.values())
    latest = infos[f"{CAMPAIGN}/checkpoints/latest"]
    assert latest.issym() and latest.linkname == "control/checkpoint-4"
    manifest = infos[f"{CAMPAIGN}/manifest.json"]
    assert manifest.mtime == int((package_dir / "manifest.json").stat().st_mtime)  # times kept
    recorded = json.loads(tar_member(data, f"{CAMPAIGN}/SEAL/verification.json"))
    assert recorded["verdict"] == "pass" and recorded["sealed"] is True


def tar_member(data: bytes, name: str) -> bytes:
    import io

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.extractfile(name).read()


def test_gnu_tar_and_coreutils_alone_verify_the_archive(package_dir, tmp_path):
    (package_dir / "analysis" / "with space é.md").write_text("notes\n")
    archive = tmp_path / f"{CAMPAIGN}.tar.zst"
    result = seal_directly(package_dir, archive)
    assert result["path"] == str(archive) and result["bytes"] == archive.stat().st_size
    check = subprocess.run(["sha256sum", "-c", archive.name + ".sha256"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for how, command in (("tar-zstd", f"tar --zstd -xf {archive}"), ("zstd-pipe", f"zstd -dc {archive} | tar -x")):
        target = tmp_path / how
        target.mkdir()
        subprocess.run(command, shell=True, cwd=target, check=True)
        sums = subprocess.run(["sha256sum", "-c", "SEAL/SHA256SUMS"], cwd=target / CAMPAIGN, capture_output=True,
                              text=True)
        assert sums.returncode == 0, sums.stdout + sums.stderr
        assert sums.stdout.count(": OK") == len(discover(package_dir).files) + 1  # + verification.json
        diff = subprocess.run(["diff", "-r", "--no-dereference", str(package_dir), CAMPAIGN, "-x", "SEAL"],
                              cwd=target, capture_output=True, text=True)
        assert diff.returncode == 0, diff.stdout  # the package, unchanged


def test_cli_seals_and_never_overwrites_without_overwrite(package_dir, tmp_path):
    archive = tmp_path / "delivery.tar.zst"
    first = run_cli(package_dir, "--no-reload", "-o", archive, "--format", "json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["archive"]["sha256"] == (tmp_path / "delivery.tar.zst.sha256").read_text()[:64]
    before = archive.stat().st_mtime_ns, archive.read_bytes()
    again = run_cli(package_dir, "--no-reload", "-o", archive)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert (archive.stat().st_mtime_ns, archive.read_bytes()) == before
    replaced = run_cli(package_dir, "--no-reload", "-o", archive, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_no_seal_writes_nothing(package_dir, tmp_path):
    result = run_cli(package_dir, "--no-reload", "--no-seal", "-o", tmp_path / "x.tar.zst")
    assert result.returncode == 0 and not (tmp_path / "x.tar.zst").exists()


def test_package_holding_SEAL_folder_is_IV706_and_not_sealed(package_dir, tmp_path):
    (package_dir / "SEAL").mkdir()
    (package_dir / "SEAL" / "SHA256SUMS").write_text("")
    assert "IV706" in codes(static_findings(package_dir))
    result = run_cli(package_dir, "--no-reload", "-o", tmp_path / "x.tar.zst")
    assert result.returncode == 1 and "IV706" in result.stdout
    assert not (tmp_path / "x.tar.zst").exists()
    with pytest.raises(SealRefused) as refused:
        seal_directly(package_dir, tmp_path / "y.tar.zst")
    assert codes(seal_findings(refused.value.problems)) == {"IV706"}


def test_archive_inside_the_package_is_refused(package_dir):
    with pytest.raises(UsageError, match="inside the package"):
        seal_directly(package_dir, package_dir / "analysis" / "x.tar.zst")


def test_fifo_in_the_package_cannot_be_sealed(package_dir, tmp_path):
    os.mkfifo(package_dir / "analysis" / "pipe")
    with pytest.raises(SealRefused) as refused:
        seal_directly(package_dir, tmp_path / "x.tar.zst")
    assert codes(seal_findings(refused.value.problems)) == {"IV703"}
    assert no_leftovers(tmp_path, tmp_path / "x.tar.zst")


def test_absolute_link_inside_the_package_is_stored_relative(package_dir, tmp_path):
    (package_dir / "artifacts" / "best").symlink_to(package_dir / "artifacts" / "control-model")
    seal_directly(package_dir, tmp_path / "x.tar.zst")
    with open(tmp_path / "x.tar.zst", "rb") as source, ArchiveReader(source) as reader:
        links = {m.name: m.linkname for m in reader if m.kind == "symlink"}
    assert links == {f"{CAMPAIGN}/artifacts/best": "control-model"}


# ---- IV704: a file changed between check and seal -----------------------------------------------------
def test_file_appended_after_the_check_is_IV704(package_dir, tmp_path):
    package = context(package_dir)
    with open(package_dir / "metrics" / "control.jsonl", "a") as fh:
        fh.write('{"step": 99, "name": "train_loss", "value": 1.0}\n')
    with pytest.raises(SealRefused) as refused:
        seal_package(package, CAMPAIGN, {}, tmp_path / "x.tar.zst")
    assert [(f.code, f.path) for f in seal_findings(refused.value.problems)] == [("IV704", "metrics/control.jsonl")]
    assert no_leftovers(tmp_path, tmp_path / "x.tar.zst")


def test_content_differing_from_a_digest_a_check_computed_is_IV704(package_dir, tmp_path):
    package = context(package_dir)
    package.documents.sha256("params/control.json")  # what IV304 computes for config_sha256
    package.documents.digests["params/control.json"] = "0" * 64  # as if the check had read other bytes than the seal
    with pytest.raises(SealRefused) as refused:
        seal_package(package, CAMPAIGN, {}, tmp_path / "x.tar.zst")
    assert [(f.code, f.path) for f in seal_findings(refused.value.problems)] == [("IV704", "params/control.json")]
    assert "differs from what the checks read" in seal_findings(refused.value.problems)[0].message
    assert no_leftovers(tmp_path, tmp_path / "x.tar.zst")


def test_same_size_same_mtime_rewrite_of_a_checked_file_is_IV704(package_dir, tmp_path):
    package = context(package_dir)
    params = package_dir / "params" / "control.json"
    package.documents.sha256("params/control.json")
    stat = params.stat()
    text = params.read_bytes()
    params.write_bytes(text[:-2] + bytes([text[-2] ^ 1]) + text[-1:])
    os.utime(params, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert params.stat().st_size == stat.st_size and params.stat().st_mtime_ns == stat.st_mtime_ns
    with pytest.raises(SealRefused) as refused:
        seal_package(package, CAMPAIGN, {}, tmp_path / "x.tar.zst")
    assert [(f.code, f.path) for f in seal_findings(refused.value.problems)] == [("IV704", "params/control.json")]


class ModifyDuringSeal(Progress):
    """Changes a file the moment the seal reports its first bytes."""

    def __init__(self, path: Path):
        self.path, self.done = path, False

    def advance(self, key, amount=1):
        if key == "seal" and not self.done:
            self.done = True
            with open(self.path, "ab") as fh:
                fh.write(b"\n")


def test_file_modified_during_the_seal_is_IV704(package_dir, tmp_path):
    later = package_dir / "stops.json"  # sorted after most of the package
    with pytest.raises(SealRefused) as refused:
        seal_directly(package_dir, tmp_path / "x.tar.zst", progress=ModifyDuringSeal(later))
    assert ("IV704", "stops.json") in [(f.code, f.path) for f in seal_findings(refused.value.problems)]
    assert no_leftovers(tmp_path, tmp_path / "x.tar.zst")


def test_file_modified_while_it_is_read_is_IV704(tmp_path):
    package_dir = big_package(tmp_path / "pkg", megabytes=24)
    with pytest.raises(SealRefused) as refused:
        seal_package(context(package_dir), "big", {}, tmp_path / "x.tar.zst",
                     progress=ModifyDuringSeal(package_dir / "a-weights.bin"))
    assert [(f.code, f.path) for f in seal_findings(refused.value.problems)] == [("IV704", "a-weights.bin")]
    assert no_leftovers(tmp_path, tmp_path / "x.tar.zst")


def test_vanished_file_is_IV704(package_dir, tmp_path):
    package = context(package_dir)
    (package_dir / "analysis" / "errors.md").unlink()
    with pytest.raises(SealRefused) as refused:
        seal_package(package, CAMPAIGN, {}, tmp_path / "x.tar.zst")
    assert [(f.code, f.path) for f in seal_findings(refused.value.problems)] == [("IV704", "analysis/errors.md")]


def _checks_then(monkeypatch, action):
    """verify's checks, followed by `action` while the seal begun beside them is still open."""
    from itera_verify.flows import verify as verify_flow

    real_checks = verify_flow.check_package

    def checks_then_action(*args, **kwargs):
        result = real_checks(*args, **kwargs)
        action()
        return result

    monkeypatch.setattr(verify_flow, "check_package", checks_then_action)
    return verify_flow


def test_a_file_changed_while_the_checks_ran_beside_the_seal_is_IV704(package_dir, tmp_path, monkeypatch):
    """The seal starts before the checks; a file rewritten after the seal read it but before the checks ended
    would make the report describe bytes the archive does not hold: refused, nothing published."""
    target = package_dir / "metrics" / "control.jsonl"
    verify_flow = _checks_then(monkeypatch, lambda: target.write_bytes(target.read_bytes()))  # same bytes, new ctime
    report = verify_flow.verify(package_dir, settle(reload=False, output=tmp_path / "x.tar.zst"))
    assert report.verdict == "fail" and not report.sealed
    assert ("IV704", "metrics/control.jsonl") in [(f.code, f.path) for f in report.findings]
    assert no_leftovers(tmp_path, tmp_path / "x.tar.zst")


def test_a_seal_begun_beside_failing_checks_leaves_nothing(package_dir, tmp_path):
    from itera_verify.flows import verify as verify_flow

    (package_dir / "stops.json").write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    report = verify_flow.verify(package_dir, settle(reload=False, output=out / "x.tar.zst"))
    assert report.verdict == "fail" and not report.sealed and report.seal_skipped
    assert list(out.iterdir()) == []  # no archive, no partial file


def test_ctrl_c_during_the_checks_removes_the_seal_begun_beside_them(package_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()

    def interrupt():
        assert [p for p in out.iterdir() if p.name.endswith(".partial")], "the seal had begun"
        raise KeyboardInterrupt

    verify_flow = _checks_then(monkeypatch, interrupt)
    with pytest.raises(KeyboardInterrupt):
        verify_flow.verify(package_dir, settle(reload=False, output=out / "x.tar.zst"))
    assert list(out.iterdir()) == []


# ---- a full disk -------------------------------------------------------------------------------------------
class FullDisk:
    """The partial archive's file object, failing with ENOSPC after `room` bytes."""

    def __init__(self, real, room: int):
        self.real, self.room = real, room

    def write(self, data):
        if self.room < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.real.write(data)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("room", [0, 100_000, 3_000_000])
def test_full_disk_leaves_no_archive_and_no_partial_file(tmp_path, monkeypatch, room):
    package_dir = big_package(tmp_path / "pkg", megabytes=8)
    real_open = seal_module._open_output
    monkeypatch.setattr(seal_module, "_open_output", lambda path: FullDisk(real_open(path), room))
    destination = tmp_path / "out" / "big.tar.zst"
    destination.parent.mkdir()
    with pytest.raises(UsageError, match="No space left on device"):
        seal_package(context(package_dir), "big", {}, destination)
    assert list(destination.parent.iterdir()) == []


# ---- killed or interrupted ---------------------------------------------------------------------------------
def big_package(root: Path, megabytes: int = 64) -> Path:
    """A package-shaped folder (not a valid campaign: the seal does not care) with one large file."""
    (root / "b-small").mkdir(parents=True)
    with open(root / "a-weights.bin", "wb") as fh:
        for _ in range(megabytes):
            fh.write(os.urandom(1 << 20))
    for index in range(200):
        (root / "b-small" / f"{index:04d}.json").write_text(json.dumps({"index": index}) * 20)
    (root / "c-metrics.jsonl").write_text('{"step": 1, "name": "loss", "value": 0.5}\n' * 50_000)
    return root


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {validator!r})
    from pathlib import Path
    from itera_verify.flows.config import Config, settle
    from itera_verify.package import RunContext, discover
    from itera_verify.runtime.progress import Progress
    from itera_verify.seal import seal_package

    def context(package):
        return RunContext(discover(package), settle(Config()))

    class Announce(Progress):
        def start(self, key, description, total=None, unit=""):
            print("start", key, flush=True)
        def advance(self, key, amount=1):
            print("advance", key, flush=True)
            time.sleep(0.002)  # widen the window a kill can land in

    seal_package(RunContext(discover({package!r}), settle(Config())), "big", {{}}, Path({destination!r}), progress=Announce())
    print("sealed", flush=True)
""")


def run_child_until(package_dir: Path, destination: Path, line: str):
    code = CHILD.format(validator=VALIDATOR, package=str(package_dir), destination=str(destination))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=ctrl_c_as_in_a_terminal)
    seen = []
    for output in child.stdout:
        seen.append(output.strip())
        if output.strip() == line:
            return child, seen
    child.wait()
    pytest.fail(f"the child never printed {line!r}: {seen[-5:]} {child.stderr.read()[-2000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["start seal", "advance seal", "start seal-verify", "advance seal-verify"])
def test_kill_9_at_any_point_leaves_nothing_under_the_final_name(tmp_path, moment):
    package_dir = big_package(tmp_path / "pkg")
    destination = tmp_path / "out" / "big.tar.zst"
    destination.parent.mkdir()
    child, _ = run_child_until(package_dir, destination, moment)
    child.kill()
    child.wait()
    assert not destination.exists() and not Path(str(destination) + ".sha256").exists()
    leftovers = [p for p in destination.parent.iterdir()]
    assert all(p.name.endswith(".partial") for p in leftovers)
    # The next seal in that folder removes what the killed process left, and succeeds.
    seal_package(context(package_dir), "big", {}, destination)
    assert sorted(p.name for p in destination.parent.iterdir()) == ["big.tar.zst", "big.tar.zst.sha256"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("moment", ["advance seal", "advance seal-verify"])
def test_sigterm_or_ctrl_c_removes_the_partial_file(tmp_path, signum, moment):
    package_dir = big_package(tmp_path / "pkg")
    destination = tmp_path / "out" / "big.tar.zst"
    destination.parent.mkdir()
    child, _ = run_child_until(package_dir, destination, moment)
    child.send_signal(signum)
    rest = child.stdout.read()
    child.wait(timeout=60)
    assert child.returncode != 0 and "sealed" not in rest
    assert list(destination.parent.iterdir()) == []


def test_archive_damaged_on_disk_before_the_read_back_is_never_published(tmp_path, monkeypatch):
    from itera_verify.archive import parallel

    package_dir = big_package(tmp_path / "pkg", megabytes=4)
    real_read_full = parallel._read_full
    damaged = []

    def damage_then_read(fd, buffer, want, offset, direct):
        """A byte of the archive on the device changes after it was written, before it is read back."""
        if not damaged:
            path = os.readlink(f"/proc/self/fd/{fd}")
            with open(path, "r+b") as fh:  # through the page cache: the direct read below then sees it
                fh.seek(offset + want // 2)
                byte = fh.read(1)
                fh.seek(-1, os.SEEK_CUR)
                fh.write(bytes([byte[0] ^ 0x20]))
                fh.flush()
                os.fsync(fh.fileno())
            damaged.append(offset + want // 2)
        return real_read_full(fd, buffer, want, offset, direct)

    monkeypatch.setattr(parallel, "_read_full", damage_then_read)
    destination = tmp_path / "out" / "big.tar.zst"
    destination.parent.mkdir()
    with pytest.raises(UsageError, match="read-back verification"):
        seal_package(context(package_dir), "big", {}, destination)
    assert damaged and list(destination.parent.iterdir()) == []


def test_rewrite_restoring_size_and_mtime_is_IV704_when_discovery_records_the_ctime(package_dir, tmp_path):
    """No check hashed the weights; the inode change time still moves."""
    package = context(package_dir)
    rel = "artifacts/control-model/model.safetensors"
    assert package.inventory.files[rel].ctime_ns == os.stat(package.inventory.abspath(rel)).st_ctime_ns
    weights = package_dir / rel
    stat = weights.stat()
    time_before = stat.st_ctime_ns
    __import__("time").sleep(0.05)  # file times tick coarsely (a few ms): make the change visible
    with open(weights, "r+b") as fh:
        first = fh.read(1)
        fh.seek(0)
        fh.write(bytes([first[0] ^ 1]))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_mtime_ns == stat.st_mtime_ns and weights.stat().st_ctime_ns != time_before
    with pytest.raises(SealRefused) as refused:
        seal_package(package, CAMPAIGN, {}, tmp_path / "x.tar.zst")
    assert [(f.code, f.path) for f in seal_findings(refused.value.problems)] == [("IV704", rel)]


def test_a_file_replaced_by_a_fifo_after_discovery_is_IV704_without_waiting_for_a_writer(package_dir, tmp_path):
    package = context(package_dir)
    target = package_dir / "stops.json"
    target.unlink()
    os.mkfifo(target)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SealRefused) as refused:
        seal_package(package, CAMPAIGN, {}, out / "x.tar.zst")
    assert [(f.code, f.path) for f in seal_findings(refused.value.problems)] == [("IV704", "stops.json")]
    assert list(out.iterdir()) == []


def test_ctrl_c_while_the_seal_thread_starts_leaves_nothing(package_dir, tmp_path, monkeypatch):
    """Ctrl-C can land between the partial file's creation and its thread's start."""
    import threading

    out = tmp_path / "out"
    out.mkdir()

    real_start = threading.Thread.start

    def interrupted_start(self):
        if self.name == "seal":  # the seal's own thread; the writer's threads start as usual
            raise KeyboardInterrupt
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    sealing = seal_module.Sealing(context(package_dir), CAMPAIGN, out / "x.tar.zst")
    with pytest.raises(KeyboardInterrupt):
        sealing.start()
    assert list(out.iterdir()) == []
