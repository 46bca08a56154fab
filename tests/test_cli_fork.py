"""run_cli forks most commands from the worker's warm command line (tests/cli_server.py) instead of starting an
interpreter: these show that a forked command writes what a new interpreter writes, byte for byte, and exits
with its status; that it runs in the test's folder and environment; that what only an interpreter's start reads
sends the command to a new one; and that a command past its timeout is killed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import cli_environment, forkable, run_cli, warm_cli

ROOT = Path(__file__).resolve().parents[1]


def both_ways(monkeypatch, *args, **options) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    with monkeypatch.context() as forking:
        forking.delenv("ITERA_TEST_CLI", raising=False)
        forked = run_cli(*args, **options)
    with monkeypatch.context() as spawning:
        spawning.setenv("ITERA_TEST_CLI", "spawn")
        spawned = run_cli(*args, **options)
    return forked, spawned


def same(forked, spawned) -> None:
    assert (forked.returncode, forked.stdout, forked.stderr) == (spawned.returncode, spawned.stdout, spawned.stderr)


@pytest.mark.parametrize("args", [
    ["--help"],
    ["verify", "--no-such-option"],
    ["rules", "IV201"],
    ["audit", "/nonexistent/archive.tar.zst"],
], ids=["help", "usage-error", "rules", "missing-archive"])
def test_a_forked_command_writes_what_a_new_interpreter_writes(monkeypatch, args):
    forked, spawned = both_ways(monkeypatch, *args)
    same(forked, spawned)


def test_a_forked_verify_reports_what_a_new_interpreter_reports_in_text_and_json(monkeypatch, built):
    package = built["package"]
    same(*both_ways(monkeypatch, package, "--no-reload", "--no-seal"))
    forked, spawned = both_ways(monkeypatch, package, "--no-reload", "--no-seal", "--format", "json")
    assert (forked.returncode, forked.stderr) == (spawned.returncode, spawned.stderr) == (0, "")
    first, second = json.loads(forked.stdout), json.loads(spawned.stdout)
    del first["elapsed_seconds"], second["elapsed_seconds"]
    assert first == second


def test_the_command_runs_in_the_tests_folder_and_environment(monkeypatch, built, tmp_path):
    """A relative package path is read from `cwd`; GITHUB_ACTIONS in `env` switches the format to annotations."""
    os.symlink(built["package"], tmp_path / "pkg")
    forked, spawned = both_ways(monkeypatch, "pkg", "--no-reload", "--no-seal", cwd=tmp_path,
                                env={"GITHUB_ACTIONS": "true"})
    same(forked, spawned)
    assert forked.returncode == 0 and "::" in forked.stdout, forked.stdout


def test_what_an_interpreter_reads_as_it_starts_sends_the_command_to_a_new_one(monkeypatch):
    monkeypatch.delenv("ITERA_TEST_CLI", raising=False)
    environment = cli_environment()
    assert forkable(environment)
    assert forkable({**environment, "ITERA_ANYTHING": "1"})
    for name, value in (("PYTHONPATH", "/elsewhere"), ("LANG", "C"), ("LC_ALL", "C"), ("TZ", "Asia/Tokyo"),
                        ("PYTHONIOENCODING", "latin-1")):
        assert not forkable({**environment, name: value}), name
    monkeypatch.setenv("ITERA_TEST_CLI", "spawn")
    assert not forkable(environment)


def test_a_forked_command_past_its_timeout_is_killed(monkeypatch, tmp_path, built):
    """A configuration file that is a FIFO no one writes: the command waits on its open until it is killed."""
    monkeypatch.delenv("ITERA_TEST_CLI", raising=False)
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    before = warm_cli()
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(built["package"], "--no-reload", "--no-seal", "--config", fifo, timeout=2)
    # Nothing of the killed command holds the FIFO: a writer opening it now would block, so open it without.
    with pytest.raises(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert warm_cli() is before and run_cli("rules", "IV201").returncode == 0


def test_commands_run_at_once_from_several_threads_each_get_their_own_output(built):
    results: dict[str, subprocess.CompletedProcess] = {}

    def run(code: str) -> None:
        results[code] = run_cli("rules", code)

    threads = [threading.Thread(target=run, args=(code,)) for code in ("IV201", "IV301", "IV504", "IV801")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for code, result in results.items():
        assert result.returncode == 0 and code in result.stdout, result
        assert all(other not in result.stdout.split("\n")[0] for other in results if other != code)


@pytest.mark.parametrize("how", ["threads-and-atexit", "exit-status", "exit-message", "uncaught", "interrupted",
                                 "stdout-closed", "unflushable"])
def test_a_forked_command_ends_as_a_new_interpreter_ends(how):
    """The tool's command line skips the interpreter's teardown of every object (runtime/ending.py, which the
    warm command line ends its commands with), not what a command can see of its end: threads joined, then
    atexit handlers, output flushed (status 120 and the interpreter's words when it cannot be), the exit status,
    and the message of sys.exit or of an uncaught exception (its traceback's frames differ: runpy's, ours)."""
    argv = [sys.executable, "-m", "tests.cli_exit_probe", how]
    environment = cli_environment()
    forked = warm_cli().run(argv, ROOT, environment, timeout=60)
    spawned = subprocess.run(argv, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
    assert (forked.returncode, forked.stdout) == (spawned.returncode, spawned.stdout)
    assert forked.stdout.startswith("buffered, no newline"), forked.stdout
    last = [result.stderr.rstrip("\n").rsplit("\n", 1)[-1] for result in (forked, spawned)]
    assert last[0] == last[1] and forked.stderr.startswith("to stderr\n"), (forked.stderr, spawned.stderr)
    expected = {"threads-and-atexit": (0, " | main done | thread done | atexit ran\n"), "exit-status": (3, ""),
                "exit-message": (1, ""), "uncaught": (1, ""), "interrupted": (-signal.SIGINT, ""),
                "stdout-closed": (0, ""), "unflushable": (120, "")}[how]  # the original stdout is flushed too
    if how == "unflushable":
        assert forked.stderr == spawned.stderr, (forked.stderr, spawned.stderr)
        assert "Exception ignored in: <_io.TextIOWrapper name=" in forked.stderr and "BrokenPipeError" in forked.stderr
    assert (forked.returncode, forked.stdout[len("buffered, no newline"):]) == expected
    if how == "uncaught":
        assert last[0] == "RuntimeError: uncaught"
    elif how == "exit-message":
        assert last[0] == "a message instead of a status"
