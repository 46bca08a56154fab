"""Process-level fault injection for `tests/test_faults.py`: start the real command line in its own session,
find its reload children through /proc (no psutil), stop, limit or signal them from outside, and run things
as an unprivileged user or in a private mount namespace — the honest ways to deny a read, make a folder
read-only or fill a disk when the tests run as root.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from itera_verify.runtime.environment import RELOAD_ZYGOTES

TAG_VARIABLE = "ITERA_FAULT_TAG"  # inherited by every process the command line starts: how /proc finds them
RELOAD_CHILD = "itera_verify.reload.child"


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def tagged(tag: str) -> list[int]:
    """Live (non-zombie) processes carrying our tag."""
    marker = f"{TAG_VARIABLE}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and marker in _environ(int(entry.name)).split(b"\0") and _state(int(entry.name)) != "Z":
            pids.append(int(entry.name))
    return pids


def reload_children(tag: str) -> dict[int, str]:
    """pid -> artifact id of every reload child of ours (read from the job file the child was given)."""
    children = {}
    for pid in tagged(tag):
        args = cmdline(pid)
        if RELOAD_CHILD in args and len(args) > args.index(RELOAD_CHILD) + 1:
            try:
                children[pid] = json.loads(Path(args[args.index(RELOAD_CHILD) + 1]).read_text())["artifact"]
            except (OSError, ValueError, KeyError):
                continue  # the job file is not written yet, or already gone
    return children


def wait_until(predicate, timeout: float, pause: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(pause)
    return None


def cli_command(*args, user: str | None = None) -> list[str]:
    command = [sys.executable, "-m", "itera_verify", *map(str, args)]
    if user:
        command = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", "--", *command]
    return command


def ctrl_c_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT at its default, as a terminal starts a command. A test run started in the
    background (`make test &`, nohup) ignores SIGINT, and a child would inherit that and never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Cli:
    """A command started in its own session, output to files (a full pipe must not be the fault)."""

    def __init__(self, command: list, *, tag: str, workdir: Path, env: dict | None = None):
        self.workdir = Path(workdir)
        self.tmp = self.workdir / "tmp"  # TMPDIR: the tool's own temporary folders must be gone afterwards
        self.tmp.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o777)
        os.chmod(self.tmp, 0o777)
        self.out, self.err = open(self.workdir / "stdout", "w+"), open(self.workdir / "stderr", "w+")
        # A run on its own: every process it starts ends with it (a shared zygote, reload/shared.py, outlives the
        # run by design, so the tests' shared folder is not handed on).
        own = {k: v for k, v in os.environ.items() if k != RELOAD_ZYGOTES}
        full_env = {**own, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", TAG_VARIABLE: tag,
                    "TMPDIR": str(self.tmp), **(env or {})}
        self.proc = subprocess.Popen([str(c) for c in command], stdout=self.out, stderr=self.err,
                                     stdin=subprocess.DEVNULL, env=full_env, cwd=self.workdir,
                                     start_new_session=True, preexec_fn=ctrl_c_as_in_a_terminal)

    def wait(self, timeout: float = 600) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
            raise
        self.out.seek(0)
        self.err.seek(0)
        return code, self.out.read(), self.err.read()

    def signal_group(self, signum: int) -> None:
        os.killpg(self.proc.pid, signum)  # what a terminal's Ctrl-C does: the whole foreground group

    def signal_main(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)  # what a job scheduler or `kill PID` does


def can_run_as(user: str = "nobody") -> bool:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return False
    probe = subprocess.run(cli_command("--version", user=user), capture_output=True, text=True)
    return probe.returncode == 0


def mount_namespace() -> list[str] | None:
    """The prefix that runs a command in a private mount namespace (root: `unshare -m`; others: a user
    namespace too), or None where mounting is not allowed."""
    if not shutil.which("unshare"):
        return None
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"], capture_output=True)
    return prefix if probe.returncode == 0 else None


def give_to(user: str, *paths: Path) -> None:
    """chown -R, so the unprivileged user owns (and may change) what the test prepared."""
    subprocess.run(["chown", "-R", f"{user}:nogroup", *map(str, paths)], check=True)


def tree_state(root: Path) -> dict:
    """Every path under root with type, size, mtime and content: proof that nothing was written there."""
    import hashlib

    state = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            digest = ""
            if os.path.isfile(path) and not os.path.islink(path) and st.st_mode & 0o444:
                with open(path, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
            state[os.path.relpath(path, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return state
