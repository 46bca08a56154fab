"""The harness the properties run in: one scratch copy of the example package reused across thousands of
examples, the real command line in-process, a hang alarm, and an audit hook that sees any unpickling,
process start or file written while the tool runs.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HANG_SECONDS = 20.0  # far above any reader's real cost on the example package: past it, the input hangs the tool


class Hang(Exception):
    """The tool was still working on one input after HANG_SECONDS."""


@contextlib.contextmanager
def time_limit(seconds: float = HANG_SECONDS):
    def _alarm(signum, frame):
        raise Hang(f"still running after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------------------------- audit hook

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_SPAWN_EVENTS = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "subprocess.Popen", "os.startfile"}


class _Watch:
    """Records, while armed, what a static check must never do: unpickle, start a process, write a file
    outside the places it was told to write (Python's audit events see every one of them)."""

    def __init__(self):
        self.armed = False
        self.allowed_roots: tuple[str, ...] = ()
        self.events: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if not self.armed:
            return
        if event == "pickle.find_class":
            self.events.append(f"unpickled a global: {args[0]}.{args[1]}")
        elif event in _SPAWN_EVENTS:
            self.events.append(f"started a process: {event} {args[:2]!r}")
        elif event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and os.path.isabs(args[0]):
            # Relative names may be relative to a folder descriptor (the audit's extraction): the tree snapshots
            # of the properties judge those; the command runs in an empty folder that must stay empty.
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE_FLAGS
            target = os.path.abspath(os.fsdecode(path))
            if writes and not target.endswith(".pyc") and "__pycache__" not in target \
                    and not target.startswith(self.allowed_roots) and target != os.devnull:
                self.events.append(f"wrote a file: {target}")

    @contextlib.contextmanager
    def armed_for(self, *allowed: Path):
        # The hook sees this process only: checks forked into a child (on a big package, or beside a seal) would
        # escape it, so a watched run keeps them in this process (the rules see no fork available).
        # tests/test_parallel_checks.py shows the forked path finds the same; a fork from anywhere else is still
        # recorded.
        from itera_verify.flows import checks

        saved = checks.can_fork
        checks.can_fork = lambda: False
        self.events, self.allowed_roots, self.armed = [], tuple(str(Path(a).resolve()) for a in allowed), True
        try:
            yield self.events
        finally:
            self.armed = False
            checks.can_fork = saved


_watch: _Watch | None = None


def watch() -> _Watch:
    global _watch
    if _watch is None:
        _watch = _Watch()
    return _watch


# ---------------------------------------------------------------------------------------------- the package

@dataclass
class Outcome:
    exit_code: int | None
    stdout: str
    error: str | None  # the traceback of an uncaught exception, or a Hang
    stderr: str = ""
    events: list[str] = field(default_factory=list)
    reports: dict[str, str] = field(default_factory=dict)  # format -> text of the --report file


REPORT_FORMATS = ("text", "html", "junit", "github")


def _lighten(root: Path) -> None:
    """Swap the checkpoint pickles for tiny plain ones. Static checks never load them, and scanning the real
    optimizer states on every example would halve the examples a run can afford; the pickle readers fuzz
    the scanner itself."""
    from itera_verify.package.pickles import PICKLE_EXTENSIONS

    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.name.endswith(PICKLE_EXTENSIONS):
            path.write_bytes(pickle.dumps({"step": 4, "state": [0.0, 1.0]}, protocol=2))


def _names(root: Path, skip: tuple[str, ...]) -> set[str]:
    names = set()
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel.split(os.sep)[0] in skip:
            dirs[:] = []
            continue
        names.update(os.path.join(rel, n) for n in dirs + files)
    return names


class Workspace:
    """A private copy of the example package; each example swaps files in and the originals back."""

    def __init__(self, source: Path, hf_cache: Path, scratch: Path, light: bool = True):
        self.scratch = Path(scratch)
        self.root = self.scratch / "pkg"
        self.out = self.scratch / "out"
        self.hf_cache = Path(hf_cache)
        if not self.root.exists():
            shutil.copytree(source, self.root, symlinks=True)
            if light:
                _lighten(self.root)
        self.out.mkdir(parents=True, exist_ok=True)
        self.eval_ids = (self.root / "corpus/eval_ids.txt").read_text().split()

    def document(self, rel: str):
        return json.loads((self.root / rel).read_text(encoding="utf-8"))

    @contextlib.contextmanager
    def replaced(self, files: dict[str, bytes]):
        """Put `files` (relative path -> bytes) in the package for the duration; restore byte for byte."""
        saved: dict[str, bytes | None] = {}
        try:
            for rel, data in files.items():
                path = self.root / rel
                saved[rel] = path.read_bytes() if path.is_file() else None
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            yield self.root
        finally:
            for rel, original in saved.items():
                path = self.root / rel
                if original is None:
                    path.unlink(missing_ok=True)
                else:
                    path.write_bytes(original)

    def cli(self, *args: str, writable: tuple[Path, ...] = ()) -> Outcome:
        """The real command line, in-process (click's runner), under the hang alarm and the audit hook."""
        from click.testing import CliRunner

        from itera_verify.cli import main

        for stale in self.out.iterdir():
            stale.unlink()
        runner = CliRunner()
        cwd = self.scratch / "cwd"
        cwd.mkdir(exist_ok=True)
        previous = os.getcwd()
        os.chdir(cwd)
        try:
            with watch().armed_for(self.out, *writable) as events, time_limit():
                try:
                    result = runner.invoke(main, list(args), catch_exceptions=True)
                except Hang:
                    return Outcome(None, "", traceback.format_exc(), events=list(events))
        finally:
            os.chdir(previous)
        events += [f"wrote into its working folder: {p.name}" for p in cwd.iterdir()]
        error = None
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            error = "".join(traceback.format_exception(*result.exc_info))
        reports = {p.stem: p.read_text(encoding="utf-8", errors="replace") for p in self.out.iterdir()}
        return Outcome(result.exit_code, result.stdout, error, result.stderr, list(events), reports)

    def sealed_base(self) -> tuple[bytes, str]:
        """(the uncompressed tar of the example package as the tool seals it, campaign id); sealed once."""
        import zstandard

        folder = self.scratch / "sealed"
        if not folder.exists():
            folder.mkdir()
            outcome = self.cli(str(self.root), "--no-reload", "-o", str(folder), writable=(folder,))
            assert outcome.exit_code == 0 and outcome.error is None, (outcome.error, outcome.stdout[-2000:])
        archive = next(folder.glob("*.tar.zst"))
        with open(archive, "rb") as fh:
            tar = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
        return tar, archive.name[: -len(".tar.zst")]

    def audit(self, data: bytes) -> tuple[Outcome, list[str]]:
        """`itera-verify audit` on these archive bytes; also returns what was left or escaped on disk."""
        import tempfile

        folder, tmp = self.scratch / "audit", self.scratch / "audit-tmp"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        tmp.mkdir(exist_ok=True)
        archive = folder / "campaign.tar.zst"
        archive.write_bytes(data)
        before = _names(self.scratch, skip=("out", "audit-tmp", "cwd"))
        reports = [arg for fmt in REPORT_FORMATS for arg in ("--report", f"{fmt}={self.out / fmt}.out")]
        previous, tempfile.tempdir = tempfile.tempdir, str(tmp)  # the audit's private folder goes here
        try:
            outcome = self.cli("audit", str(archive), "--format", "json", *reports, writable=(self.scratch,))
        finally:
            tempfile.tempdir = previous
        damage = [f"left in the temporary folder: {p.name}" for p in tmp.iterdir()]
        damage += [f"written outside the extraction folder: {p}"
                   for p in sorted(_names(self.scratch, skip=("out", "audit-tmp", "cwd")) - before)]
        for leftover in tmp.iterdir():  # the next example starts clean even after a failure
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink()
        return outcome, damage

    def verify_static(self) -> Outcome:
        """`itera-verify PKG --no-reload --no-seal --format json` with every other format written as a report."""
        reports = [arg for fmt in REPORT_FORMATS for arg in ("--report", f"{fmt}={self.out / fmt}.out")]
        return self.cli(str(self.root), "--no-reload", "--no-seal", "--format", "json",
                        "--hf-cache", str(self.hf_cache), *reports)
