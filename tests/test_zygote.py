"""The zygote (issue 17): one preloaded interpreter forks every reload child, and each child is still a fresh,
separate process: nothing one child changes reaches the next, each is its own session with its own folder, a
zygote that cannot fork safely (a thread) or dies mid-run leaves the reloads to spawned children, and fork and
spawn prove the same things about the same package."""
from __future__ import annotations
from dataclasses import replace

import json
import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest
from itera_verify.model import UsageError
from itera_verify.runtime.progress import NULL_PROGRESS
from itera_verify.reload import run_reloads
from itera_verify.runtime.launcher import Launcher as ChildProcesses
from itera_verify.reload.runner import zygote_env
from itera_verify.reload.zygote_client import ForkedChild, Zygote
from itera_verify.rules import reload as reload_rules
from tests.helpers import context
from itera_verify.runtime.environment import Environment

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/stat").exists(),
                                reason="the zygote forks (Linux)")
TIMING = {"startup_seconds", "gate_wait_seconds", "load_seconds", "peak_rss_bytes", "started_at", "ended_at",
          "launched_at", "wall_seconds", "isolation", "zygote_import_seconds", "host_rss_before_load_bytes",
          "fork_refused"}


def reload(package_dir, hf_cache, *only, **options):
    package = context(package_dir, hf_cache=Path(hf_cache))
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=options.pop("timeout", 300), jobs=1,
                                  progress=NULL_PROGRESS, only=set(only) or None, **options))
    # A subset leaves accepted runs without their other artifacts: IV509 is not what these tests judge.
    return {r.artifact: r for r in package.reloads}, [f for f in reload_rules.check(package)
                                                      if f.code != "IV509" or not only]


def with_hook(monkeypatch, tmp_path, code: str) -> None:
    """A sitecustomize on the children's path: test-only behaviour from outside the product's code."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(code))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))


# --- the zygote itself, with a probe for an entry ---------------------------------------------------------

def _started_zygote(folder: Path, light: bool = False):
    """A zygote of its own under `folder` (`light`: torch alone); closed after, its folder gone and its process
    ended."""
    import tempfile

    temp = folder / "tmp"
    temp.mkdir()
    with pytest.MonkeyPatch.context() as patch:  # while it starts: it takes its folder and environment then
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        patch.setattr(tempfile, "tempdir", str(temp))
        children = ChildProcesses(Environment.read())
        started = Zygote(children, zygote_env(children.environment), light=light)
        started.wait_ready()
    assert started.client is not None, started.why
    yield children, started
    started.close()
    assert list(temp.iterdir()) == [], "the zygote's folder was left behind"
    assert started.client.proc.returncode is not None, "the zygote still runs"


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    """One zygote for the tests that only fork probes from it: a child changes nothing in its zygote (the first
    test below shows it), and each start imports torch and the modelling libraries again (5-8 s)."""
    yield from _started_zygote(tmp_path_factory.mktemp("zygote"))


@pytest.fixture
def own_started_zygote(tmp_path):
    """A zygote for a test that stops it: a light one, since what it imports plays no part there."""
    yield from _started_zygote(tmp_path, light=True)


def probe(children: ChildProcesses, zygote: Zygote, work: Path, action: str, env: dict | None = None) -> dict:
    work.mkdir()
    out = work / "probe.json"
    child = zygote.client.fork({"entry": "tests.zygote_probe:probe", "argv": ["probe", str(out), action],
                                "work": str(work), "log": str(work / "log"),
                                "env": {"TMPDIR": str(work), **(env or {})},
                                "title": ["-m", "itera_verify.reload.child", str(work / "job.json"), action]})
    assert isinstance(child, ForkedChild), child
    end = children.wait(child, 120)
    assert end.code == 0, (work / "log").read_text()
    assert end.usage.ru_maxrss > 0
    return json.loads(out.read_text())


def test_nothing_one_forked_child_changes_reaches_the_next(zygote, tmp_path):
    children, started = zygote
    first = probe(children, started, tmp_path / "first", "mutate")
    second = probe(children, started, tmp_path / "second", "look")
    before, after, fresh = first["at_start"], first["after"], second["at_start"]
    # The first child really changed its process: a patched function, a held tensor, a new module, moved RNGs.
    assert not after["gelu_is_torch"] and after["held_tensor"] and after["new_module"]
    assert after["torch_rng"] != before["torch_rng"] and after["numpy_rng"] != before["numpy_rng"]
    # The next child starts from the zygote, not from there.
    assert fresh["gelu_is_torch"] and not fresh["held_tensor"] and not fresh["new_module"]
    assert fresh["torch_rng"] == before["torch_rng"] and fresh["numpy_rng"] == before["numpy_rng"]


def test_a_zygote_that_does_not_answer_a_fork_is_given_up_in_bounded_time(own_started_zygote, tmp_path,
                                                                          monkeypatch):
    """Stopped (SIGSTOP here) or stuck, the zygote never answers: the fork gives it up after
    FORK_ANSWER_SECONDS instead of holding the run forever, and it is dead to every later fork (the run's
    children are spawned) and to the warm zygotes (never kept)."""
    from itera_verify.reload import zygote_client
    from itera_verify.reload.warm import alive

    children, started = own_started_zygote
    monkeypatch.setattr(zygote_client, "FORK_ANSWER_SECONDS", 1.0)
    work = tmp_path / "unanswered"
    work.mkdir()
    os.kill(started.client.proc.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        answer = started.client.fork({"entry": "tests.zygote_probe:probe",
                                      "argv": ["probe", str(work / "probe.json"), "look"], "work": str(work),
                                      "log": str(work / "log"), "env": {"TMPDIR": str(work)}, "title": ["probe"]})
        assert answer == "the zygote did not answer a fork in 1 s", answer
        assert time.monotonic() - began < 10
        assert started.client.dead and not alive(started)
        assert started.client.fork({"entry": "tests.zygote_probe:probe", "argv": [], "work": str(work),
                                    "log": str(work / "log"), "env": {}, "title": ["probe"]}) == "the zygote is gone"
    finally:
        os.kill(started.client.proc.pid, signal.SIGCONT)


def test_each_forked_child_reads_the_hub_cache_its_job_names_not_the_zygotes(zygote, tmp_path):
    """The zygote starts without any run's hub cache (so one warm zygote serves packages over different caches);
    huggingface_hub read its own empty one at import, and each child follows the one its job names, as a
    spawned child would."""
    children, started = zygote
    assert "HF_HUB_CACHE" not in zygote_env(children.environment)
    at_import = probe(children, started, tmp_path / "plain", "look")["at_start"]["hub_cache"]
    assert at_import.startswith(str(started.work)), at_import
    seen = [probe(children, started, tmp_path / name, "look", {"HF_HUB_CACHE": str(tmp_path / f"hub-{name}")})
            for name in ("a", "b")]
    assert [report["at_start"]["hub_cache"] for report in seen] == [str(tmp_path / "hub-a"), str(tmp_path / "hub-b")]


def test_each_forked_child_is_its_own_session_with_its_folder_and_its_job_on_its_command_line(zygote, tmp_path):
    children, started = zygote
    seen = [probe(children, started, tmp_path / name, "look")["at_start"] for name in ("a", "b")]
    zygote_pid = started.client.proc.pid
    assert seen[0]["pid"] != seen[1]["pid"]
    for state, name in zip(seen, ("a", "b")):
        assert state["ppid"] == zygote_pid and state["sid"] == state["pgid"] == state["pid"] != zygote_pid
        assert state["tmpdir"] == state["cwd"] == str(tmp_path / name)
        args = state["cmdline"]
        assert args[1:] == ["-m", "itera_verify.reload.child", str(tmp_path / name / "job.json"), "look"]


# --- through the runner -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_fork_and_spawn_prove_the_same_of_every_artifact(package_dir, hf_cache):
    forked, forked_findings = reload(package_dir, hf_cache, isolation="fork")
    spawned, spawned_findings = reload(package_dir, hf_cache, isolation="spawn")
    assert forked_findings == spawned_findings == []
    assert {r.facts["isolation"] for r in forked.values()} == {"fork"}
    assert {r.facts["isolation"] for r in spawned.values()} == {"spawn"}
    for name, result in forked.items():
        other = spawned[name]
        assert (result.ok, result.forward, result.failure) == (other.ok, other.forward, other.failure)
        assert {k: v for k, v in result.facts.items() if k not in TIMING} == \
               {k: v for k, v in other.facts.items() if k not in TIMING}, name
        assert result.facts["startup_seconds"] < other.facts["startup_seconds"]  # no interpreter start


THREAD_IN_THE_ZYGOTE = """
    import threading, time
    if b"itera_verify.reload.zygote" in open("/proc/self/cmdline", "rb").read():
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
"""


@pytest.mark.own_zygote  # its zygote runs the planted hook at its start: a shared one started earlier would not
def test_a_zygote_with_a_second_thread_is_never_forked_from(package_dir, hf_cache, monkeypatch, tmp_path):
    with_hook(monkeypatch, tmp_path, THREAD_IN_THE_ZYGOTE)
    results, findings = reload(package_dir, hf_cache, "lora-r16-resume")
    assert results["lora-r16-resume"].ok and results["lora-r16-resume"].facts["isolation"] == "spawn"
    assert "2 threads" in results["lora-r16-resume"].facts["fork_refused"]
    assert findings == []
    with pytest.raises(UsageError, match="--isolation fork: .*2 threads.*fork is not safe"):
        reload(package_dir, hf_cache, "lora-r16-resume", isolation="fork")


HANG_IN_A_FORKED_CHILD = """
    import json, os, time
    if b"itera_verify.reload.zygote" in open("/proc/self/cmdline", "rb").read():
        from itera_verify.reload import child
        real = child.forked
        def forked(argv):
            if json.load(open(argv[1]))["artifact"] == os.environ["ITERA_TEST_HANG"]:
                open(os.environ["ITERA_TEST_PIDFILE"], "w").write(str(os.getpid()))
                time.sleep(3600)
            return real(argv)
        child.forked = forked
"""


@pytest.mark.slow
def test_a_zygote_killed_mid_reload_takes_its_child_and_the_next_artifact_still_reloads(package_dir, hf_cache,
                                                                                       monkeypatch, tmp_path):
    with_hook(monkeypatch, tmp_path, HANG_IN_A_FORKED_CHILD)
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("ITERA_TEST_HANG", "control-model")
    monkeypatch.setenv("ITERA_TEST_PIDFILE", str(pid_file))
    killed = {}

    def kill_the_zygote():
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        killed["child"] = int(pid_file.read_text())
        killed["zygote"] = int(Path(f"/proc/{killed['child']}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(killed["zygote"], signal.SIGKILL)

    threading.Thread(target=kill_the_zygote, daemon=True).start()
    started = time.monotonic()
    results, findings = reload(package_dir, hf_cache, "control-model", "lora-r16-resume", timeout=200)
    assert time.monotonic() - started < 100, "the lost child was waited for until its timeout"
    lost = results["control-model"]
    assert lost.failure == "crash" and "zygote" in lost.error
    assert [f.code for f in findings if f.artifact == "control-model"] == ["IV504"]
    assert results["lora-r16-resume"].ok and results["lora-r16-resume"].facts["isolation"] == "spawn"
    time.sleep(0.5)
    for pid in (killed["child"], killed["zygote"]):
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1]


def light_package(root: Path) -> Path:
    """A hand-made campaign whose two artifacts need only torch and safetensors: a spawned child imports those
    alone (~1.5 s), where one of the example package's imports transformers, peft and the Trainer (~4 s)."""
    import torch
    from safetensors.torch import save_file

    from fixtures.extra_loaders import resume_state, write_package

    (root / "checkpoints").mkdir(parents=True)
    (root / "artifacts").mkdir()
    torch.save(resume_state(), root / "checkpoints/base.pt")
    save_file({"weight": torch.randn(4, 4)}, root / "artifacts/weights.safetensors")
    write_package(root, [("base-resume", "resume-checkpoint", "checkpoints/base.pt", {"loader": "torch-resume"}),
                         ("weights", "safetensors", "artifacts/weights.safetensors", {"loader": "safetensors"})])
    manifest = json.loads((root / "manifest.json").read_text())
    for artifact in manifest["artifacts"]:  # each accepted run delivers one (IV509)
        artifact["run"] = {"base-resume": "base", "weights": "small"}[artifact["id"]]
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


@pytest.mark.slow
def test_the_command_line_takes_isolation_spawn_and_fork(tmp_path):
    """The option reaches the runner (test_fork_and_spawn_prove_the_same_of_every_artifact compares the two on
    the example package)."""
    from tests.helpers import run_cli

    package = light_package(tmp_path / "light")
    for isolation in ("spawn", "fork"):
        result = run_cli(package, "--no-seal", "--format", "json", "--isolation", isolation)
        assert result.returncode == 0, result.stderr[-2000:]
        reloads = json.loads(result.stdout)["reloads"]
        assert len(reloads) == 2 and all(r["ok"] for r in reloads)
        assert {r["facts"]["isolation"] for r in reloads} == {isolation}
    result = run_cli(package, "--no-seal", "--isolation", "clone")
    assert result.returncode == 2 and "Traceback" not in result.stderr


# --- started before the static checks --------------------------------------------------------------------

# Slow: it starts a zygote of its own (7-11 s); the fast lane still goes through prestart in every command-line
# verify with reloads (test_lora_classification_campaign_passes_with_zero_findings).
@pytest.mark.slow
@pytest.mark.own_zygote
def test_a_zygote_started_before_the_checks_is_the_one_the_reloads_fork_from(package_dir, hf_cache, monkeypatch):
    from itera_verify.reload import prestart, zygote_client

    started = []
    real_init = zygote_client.Zygote.__init__

    def counted(self, *args, **kwargs):
        started.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(zygote_client.Zygote, "__init__", counted)
    package = context(package_dir, hf_cache=Path(hf_cache))
    early = prestart(package)
    assert early is not None and len(started) == 1
    results = run_reloads(package, device="cpu", timeout=300, jobs=1, progress=NULL_PROGRESS, prestarted=early)
    assert len(started) == 1 and {r.facts["isolation"] for r in results} == {"fork"}
    assert all(r.ok for r in results)
    early.close()  # as the flow does, after run_reloads closed it already: safe to repeat
    assert early.zygote.client.proc.returncode is not None and not early.zygote.work.exists()


@pytest.mark.own_zygote
def test_a_zygote_never_used_is_killed_at_once_while_it_still_imports(package_dir):
    from itera_verify.reload import prestart

    early = prestart(context(package_dir))
    proc = early.zygote._starting.proc
    closed = time.monotonic()
    early.close()  # Ctrl-C during the static checks
    assert time.monotonic() - closed < 2 and proc.returncode is not None
    assert not early.zygote.work.exists()


# --- a light zygote: no modelling library where no loader needs one ---------------------------------------

@pytest.mark.slow
def test_a_light_zygote_preloads_no_modelling_library_and_a_full_one_does(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    seen = {}
    for light in (True, False):
        children = ChildProcesses(Environment.read())
        started = Zygote(children, zygote_env(children.environment), light=light)
        started.wait_ready()
        assert started.client is not None, started.why
        try:
            report = probe(children, started, tmp_path / f"light-{light}", "look")
        finally:
            started.close()
        seen[light] = report["at_start"]["modelling_imported"]
    assert seen == {True: [], False: ["accelerate", "peft", "transformers"]}


@pytest.mark.own_zygote  # a warm zygote that imports more would serve it (reload/warm.py)
def test_a_package_of_safetensors_and_torch_resume_files_alone_gets_a_light_zygote(package_dir, hf_cache):
    from itera_verify.reload import prestart
    from itera_verify.reload.runner import light

    assert light(["torch-resume", "safetensors"]) and not light(["torch-resume", "peft"]) and not light([None])
    full = prestart(context(package_dir))
    assert full is not None and not full.zygote.light  # the example package: transformers, peft, a Trainer
    full.close()
    manifest = json.loads((package_dir / "manifest.json").read_text())
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["id"] == "lora-r16-resume"]
    (package_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    package = context(package_dir, hf_cache=Path(hf_cache))
    early = prestart(package)
    assert early is not None and early.zygote.light
    results = run_reloads(package, device="cpu", timeout=300, jobs=1, progress=NULL_PROGRESS, prestarted=early)
    assert [(r.artifact, r.ok, r.facts["isolation"]) for r in results] == [("lora-r16-resume", True, "fork")]
    early.close()
