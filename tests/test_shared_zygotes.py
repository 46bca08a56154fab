"""Zygotes shared by many runs through ITERA_RELOAD_ZYGOTES (reload/shared.py): the second command's reloads are
forked by the first one's server; the folder must be private; a session serves only a peer that holds the token;
the variable never reaches a reload child; removing the folder ends its servers."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from itera_verify.reload.shared import facts, serves, token_of
from itera_verify.runtime.environment import RELOAD_ZYGOTES, RESULTS_KEY, TOOL_FOLDER, Environment, tool_first

from tests.helpers import run_cli
from tests.test_zygote import light_package

pytestmark = pytest.mark.own_zygote  # each test starts its own folder's servers, not the session's


def servers(folder: Path) -> list[int]:
    """The pids of the shared servers listening in `folder`, from their command lines; not their sessions (forks
    of a server, with its command line), one of which may still be ending as the command that used it ends."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
                parent = int(Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if f"listen={folder}/".encode() in command:
                found[int(entry)] = parent
    return sorted(pid for pid, parent in found.items() if parent not in found)


def verify(package_dir, hf_cache, folder, *args, **env) -> dict:
    result = run_cli(package_dir, "--no-seal", "--hf-cache", hf_cache, "--format", "json", *args,
                     env={RELOAD_ZYGOTES: str(folder), **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture
def folder(tmp_path):
    """Deep enough that its sockets' paths pass the 108 bytes of a socket address (reached through the folder's
    descriptor: runtime/sockets.reachable); the session's own folder, short, takes the plain path."""
    made = tmp_path / ("deep-" * 12) / "zygotes"
    made.mkdir(mode=0o700, parents=True)
    assert len(str(made / ("0" * 32 + ".sock"))) > 108
    yield made
    import shutil

    shutil.rmtree(made, ignore_errors=True)


def test_a_second_command_forks_its_reloads_from_the_first_ones_server(package_dir, hf_cache, folder, tmp_path):
    first = verify(package_dir, hf_cache, folder)
    [server] = servers(folder)
    # The second names the tool's folder on its PYTHONPATH already, as a command another run starts does: its
    # zygote's path is the first one's (runtime/environment.tool_first), and so is its server. It reloads two at a
    # time, one thread each: each forked child sets its job's threads (child.py), so that is the same server too.
    pythonpath = os.pathsep.join(filter(None, [TOOL_FOLDER, os.environ.get("PYTHONPATH")]))
    second = verify(package_dir, hf_cache, folder, "--jobs", "2", PYTHONPATH=pythonpath)
    assert servers(folder) == [server]  # the same server, still waiting for the next run
    assert len(list(folder.glob("*.sock"))) == 1
    for report in (first, second):
        assert report["verdict"] == "pass", report["findings"]
        assert [r["ok"] for r in report["reloads"]] == [True] * 4
    # A package of safetensors and a torch-resume file needs torch alone: the server that also imports
    # transformers and peft serves it (reload/shared.serves) instead of a light one of its own.
    light = run_cli(light_package(tmp_path / "light"), "--no-seal", "--format", "json",
                    env={RELOAD_ZYGOTES: str(folder), "PYTHONPATH": pythonpath})
    assert light.returncode == 0, light.stderr[-3000:]
    third = json.loads(light.stdout)
    assert servers(folder) == [server] and [r["ok"] for r in third["reloads"]] == [True, True]
    # Each child names the import it was forked after: the server's one import, paid once for all three commands.
    imports = {r["facts"].get("zygote_import_seconds") for report in (first, second, third) for r in report["reloads"]}
    assert len(imports) == 1 and None not in imports, imports
    assert first["configuration"]["environment"][RELOAD_ZYGOTES] == str(folder)


def test_a_server_serves_a_run_of_the_same_facts_whose_imports_it_covers():
    from itera_verify.reload.preloads import Preloads

    light, full = Preloads(("numpy", "torch"), ("scipy",)), Preloads(("numpy", "torch", "transformers"), ("scipy",))
    env = {"HOME": "/root"}
    assert serves(facts(env, full), facts(env, light)) and serves(facts(env, light), facts(env, light))
    assert not serves(facts(env, light), facts(env, full))  # fewer imports
    assert not serves(facts({"HOME": "/srv"}, full), facts(env, light))  # another environment
    assert not serves(facts(env, Preloads(full.imports, ())), facts(env, light))  # scipy not kept out


@pytest.mark.slow  # three runs, three servers' imports
def test_another_environment_or_priority_gets_its_own_server(package_dir, hf_cache, folder):
    verify(package_dir, hf_cache, folder)
    verify(package_dir, hf_cache, folder, OMP_NUM_THREADS="1")  # read by torch at import: not the same zygote
    assert len(servers(folder)) == 2 and len(list(folder.glob("*.sock"))) == 2
    niced = subprocess.run(["nice", "-n", "5", sys.executable, "-m", "itera_verify", str(package_dir), "--no-seal",
                            "--hf-cache", str(hf_cache), "-q"], capture_output=True, text=True, timeout=600,
                           env={**os.environ, RELOAD_ZYGOTES: str(folder), "HF_HUB_OFFLINE": "1"})
    assert niced.returncode == 0, niced.stderr[-2000:]
    # A server a niced run started would hand its priority to every later run's children: it is its own.
    priorities = sorted(os.getpriority(os.PRIO_PROCESS, pid) for pid in servers(folder))
    assert len(priorities) == 3 and priorities.count(os.getpriority(os.PRIO_PROCESS, 0) + 5) == 1, priorities


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701])
def test_a_folder_others_may_use_is_refused_in_one_line(package_dir, hf_cache, folder, mode):
    folder.chmod(mode)
    result = run_cli(package_dir, "--no-seal", "--hf-cache", hf_cache, env={RELOAD_ZYGOTES: str(folder)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (f"itera-verify: error: {RELOAD_ZYGOTES}={folder}: must be yours and closed "
                                     "to others (chmod 700)")
    assert servers(folder) == [] and list(folder.iterdir()) == []


def test_a_link_or_a_missing_folder_is_refused(package_dir, hf_cache, folder, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(folder)
    for named, words in ((link, "not a folder (a link is not taken)"), (tmp_path / "none", "No such file")):
        result = run_cli(package_dir, "--no-seal", env={RELOAD_ZYGOTES: str(named)})
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr


def _hello(sock_path: Path, token_hex: str) -> bytes:
    from itera_verify.runtime.sockets import reachable

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, reachable(sock_path) as name:
        sock.settimeout(60)
        sock.connect(name)
        sock.sendall(json.dumps({"op": "hello", "token": token_hex}).encode() + b"\n")
        received = b""
        while b"\n" not in received:
            data = sock.recv(4096)
            if not data:
                break
            received += data
        return received


def test_a_session_is_served_only_to_a_peer_holding_the_token(package_dir, hf_cache, folder):
    verify(package_dir, hf_cache, folder)
    [sock_path] = folder.glob("*.sock")
    token = token_of(sock_path)
    assert oct(token.stat().st_mode & 0o777) == "0o600" and oct(sock_path.stat().st_mode & 0o777) == "0o600"
    assert _hello(sock_path, "00" * 32) == b""  # closed without a word
    assert _hello(sock_path, "not hex") == b""
    ready = json.loads(_hello(sock_path, token.read_bytes().hex()))
    assert ready["ready"] is True and ready["threads"] == 1 and ready["cuda_initialised"] is False


def test_the_variable_never_reaches_a_reload_child_but_reaches_the_tools_own(folder, tmp_path):
    key = str(tmp_path / "reviewer.key")
    environment = Environment.read({RELOAD_ZYGOTES: str(folder), "ITERA_RELOAD_HOST_MEMORY": "4GiB",
                                    RESULTS_KEY: key})
    assert RELOAD_ZYGOTES not in environment.for_child() and RESULTS_KEY not in environment.for_child()
    assert environment.for_child()["ITERA_RELOAD_HOST_MEMORY"] == "4GiB"
    # The resume proof runs the tool itself.
    assert environment.for_tool()[RELOAD_ZYGOTES] == str(folder) and environment.for_tool()[RESULTS_KEY] == key


def test_the_tools_folder_is_first_on_a_childs_path_once():
    assert tool_first(None) == tool_first("") == TOOL_FOLDER
    joined = os.pathsep.join
    assert tool_first(joined(["/a", TOOL_FOLDER, "", "/b"])) == joined([TOOL_FOLDER, "/a", "", "/b"])
    assert tool_first(tool_first("/a")) == tool_first(joined([TOOL_FOLDER, TOOL_FOLDER, "/a"])) == tool_first("/a")


def test_removing_the_folder_ends_its_servers(package_dir, hf_cache, folder):
    verify(package_dir, hf_cache, folder)
    [server] = servers(folder)
    import shutil

    shutil.rmtree(folder)
    deadline = time.monotonic() + 30
    while servers(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert servers(folder) == [], "the server outlived its folder"


@pytest.mark.slow  # two servers' imports
def test_a_server_that_is_gone_is_replaced(package_dir, hf_cache, folder):
    verify(package_dir, hf_cache, folder)
    [server] = servers(folder)
    os.kill(server, 9)
    deadline = time.monotonic() + 10
    while servers(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    report = verify(package_dir, hf_cache, folder)  # the stale socket is replaced by a new server
    assert report["verdict"] == "pass"
    [again] = servers(folder)
    assert again != server


def test_a_run_a_server_serves_makes_no_folder_of_its_own(folder, tmp_path, monkeypatch):
    """Its own zygote's folder (log, caches) is made only where it starts its own: a run served by a shared server
    that is then killed (SIGKILL: no close) leaves nothing in the temporary folder."""
    import tempfile

    from itera_verify.reload.preloads import BASE, Preloads
    from itera_verify.reload.zygote_client import Zygote
    from itera_verify.runtime.launcher import Launcher

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    zygote = Zygote(Launcher(Environment.read({})), {"OPENBLAS_NUM_THREADS": "1"}, preloads=Preloads(BASE),
                    shared=str(folder))
    try:
        zygote.wait_ready()
        assert zygote.client is not None and zygote.client.shared, zygote.why
        assert zygote.work is None and list(scratch.iterdir()) == []
    finally:
        zygote.close()


def test_a_server_that_hangs_up_leaves_the_run_its_own_zygote(folder):
    """A socket of the run's key whose server closes every connection at once (a broken or foreign server): the
    run imports its own zygote and forks from it."""
    import threading

    from itera_verify.reload.preloads import BASE, Preloads
    from itera_verify.reload.shared import key
    from itera_verify.runtime.sockets import reachable
    from itera_verify.reload.zygote_client import Zygote
    from itera_verify.runtime.launcher import Launcher

    preloads, env = Preloads(BASE), {"OPENBLAS_NUM_THREADS": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    sock_path = folder / f"{key(env, preloads)}.sock"
    token_of(sock_path).write_bytes(b"\0" * 32)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with reachable(sock_path) as reachable_name:
        listener.bind(reachable_name)
    listener.listen(4)
    hung_up = []

    def hang_up():
        conn, _ = listener.accept()
        hung_up.append(True)
        conn.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    zygote = Zygote(Launcher(Environment.read({})), env, preloads=preloads, shared=str(folder))
    try:
        zygote.wait_ready()
        assert hung_up == [True]
        assert zygote.client is not None and not zygote.client.shared and zygote.client.proc is not None, zygote.why
        assert zygote.work is not None and (zygote.work / "zygote.log").exists()  # its own zygote, its own folder
    finally:
        zygote.close()
        listener.close()
    assert not zygote.work.exists()


def test_a_server_without_a_run_for_its_idle_time_ends_and_takes_its_socket(folder):
    """IDLE_SECONDS (10 minutes) set to 1 in the server's own process: it ends, its socket and token with it."""
    sock_path = folder / ("0" * 32 + ".sock")
    start = ("import sys, itera_verify.reload.shared as shared; shared.IDLE_SECONDS = 1.0; "
             "from itera_verify.reload import zygote; zygote.main(sys.argv)")
    log = folder.parent / "server.log"  # not a pipe: the server would hold it open, and run() wait for its end
    with open(log, "wb") as out:
        first = subprocess.run([sys.executable, "-c", start, f"listen={sock_path}", ".", "--import=", "--without="],
                               stdout=out, stderr=subprocess.STDOUT, timeout=60, start_new_session=True)
    assert first.returncode == 0, log.read_text()[-2000:]
    [server] = servers(folder)
    assert sock_path.exists() and token_of(sock_path).exists()
    deadline = time.monotonic() + 60  # its imports (torch), then one idle second
    while servers(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert servers(folder) == [] and not sock_path.exists() and not token_of(sock_path).exists()
