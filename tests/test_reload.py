"""Reloads (IV504–IV509): real artifacts, really broken, each reloaded in a fresh child process.

Each test breaks one artifact of a private copy of the clean package and reloads only what it needs; the
clean package and the malicious pickle go through the whole workflow and the whole command line.
"""
from __future__ import annotations
from dataclasses import replace

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fixtures.artifacts import malicious_pickle, truncate, write_safetensors, write_sharded_safetensors
from fixtures.edit import edit_json, edit_manifest
from itera_verify.package.pickles import scan_package
from itera_verify.runtime.progress import NULL_PROGRESS
from itera_verify.reload import run_reloads
from itera_verify.reload.common import numpy_rng_globals
from itera_verify.rules import reload as reload_rules
from tests.helpers import run_cli, static_findings, context
from itera_verify import settle

CONTROL_MODEL = "artifacts/control-model"
ADAPTER = "artifacts/lora-r16"
CHECKPOINT = "checkpoints/control/checkpoint-4"
RESUME = "checkpoints/lora-r16/resume.pt"


def reload(package_dir, hf_cache, *only, timeout=300, jobs=2, judge_runs=False, prefetch=None):
    """Reload some artifacts like the workflow does; (results by artifact, their findings).

    With a subset of artifacts, accepted runs (IV509) are judged only when the test asks for it."""
    package = context(package_dir, hf_cache=Path(hf_cache))
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=timeout, jobs=jobs, progress=NULL_PROGRESS,
                                  only=set(only) or None, prefetch=prefetch))
    findings = [f for f in reload_rules.check(package) if f.code != "IV509" or judge_runs or not only]
    return {r.artifact: r for r in package.reloads}, findings


def codes_for(findings, artifact) -> list[str]:
    return sorted(f.code for f in findings if f.artifact == artifact)


def rewrite_safetensors(path: Path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    write_safetensors(path, tensors, metadata={"format": "pt"})


def load_resume(path: Path) -> dict:
    with torch.serialization.safe_globals(numpy_rng_globals()):
        return torch.load(path, weights_only=True)


# --- the clean package ----------------------------------------------------------------------------------

def test_clean_package_reloads_every_artifact_with_no_finding(package_dir, hf_cache):
    from itera_verify.flows.verify import verify

    report = verify(package_dir, settle(device="cpu", seal=False, hf_cache=hf_cache, jobs=2))
    assert {r.artifact: r.ok for r in report.reloads} == {
        "control-model": True, "control-resume": True, "lora-r16-adapter": True, "lora-r16-resume": True}
    assert not [f for f in report.findings if f.code.startswith("IV5")]
    by_id = {r.artifact: r for r in report.reloads}
    assert by_id["control-model"].forward.startswith("finite output")
    assert by_id["lora-r16-adapter"].forward.startswith("finite output")
    assert by_id["control-resume"].facts["optimizer_step"] == by_id["control-resume"].facts["global_step"] == 4
    for result in report.reloads:
        assert result.device == "cpu" and result.seconds > 0 and result.peak_memory_bytes > 10_000_000


# --- IV504: the artifact does not reload ----------------------------------------------------------------

def test_truncated_safetensors_is_IV504(package_dir, hf_cache):
    truncate(package_dir / CONTROL_MODEL / "model.safetensors", -100)
    results, findings = reload(package_dir, hf_cache, "control-model")
    assert codes_for(findings, "control-model") == ["IV504"] and not results["control-model"].ok
    assert "model.safetensors" in findings[0].message


@pytest.mark.slow
def test_nan_weights_are_IV504(package_dir, hf_cache):
    rewrite_safetensors(package_dir / CONTROL_MODEL / "model.safetensors",
                        lambda t: t["transformer.h.0.mlp.c_fc.weight"].view(-1).__setitem__(3, float("nan")))
    _, findings = reload(package_dir, hf_cache, "control-model")
    (finding,) = findings
    assert finding.code == "IV504" and "non-finite" in finding.message and "c_fc" in finding.message


@pytest.mark.slow
def test_missing_shard_of_a_model_is_IV504(package_dir, hf_cache):
    from transformers import AutoModelForCausalLM

    folder = package_dir / CONTROL_MODEL
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    (folder / "model.safetensors").unlink()
    _, second = write_sharded_safetensors(folder, model)
    second.unlink()
    _, findings = reload(package_dir, hf_cache, "control-model")
    assert codes_for(findings, "control-model") == ["IV504"]


@pytest.mark.slow
def test_missing_shard_with_the_safetensors_loader_is_IV504(package_dir, hf_cache):
    from transformers import AutoModelForCausalLM

    folder = package_dir / CONTROL_MODEL
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    (folder / "model.safetensors").unlink()
    _, second = write_sharded_safetensors(folder, model)
    second.unlink()
    edit_manifest(package_dir, lambda m: m["artifacts"][0].update(kind="safetensors"))
    edit_json(package_dir, "reload.json", lambda r: r["artifacts"]["control-model"].update(loader="safetensors"))
    _, findings = reload(package_dir, hf_cache, "control-model")
    (finding,) = findings
    assert finding.code == "IV504" and "model-00002-of-00002.safetensors" in finding.message
    assert finding.path == f"{CONTROL_MODEL}/model-00002-of-00002.safetensors"


@pytest.mark.slow
def test_empty_zero3_adapter_tensor_is_IV504(package_dir, hf_cache):
    def empty_one(tensors):
        name = sorted(n for n in tensors if "lora_B" in n)[0]
        tensors[name] = torch.empty(0)

    rewrite_safetensors(package_dir / ADAPTER / "adapter_model.safetensors", empty_one)
    _, findings = reload(package_dir, hf_cache, "lora-r16-adapter")
    (finding,) = findings
    assert finding.code == "IV504" and "torch.Size([0])" in finding.message


# --- IV505: the base is not available offline -----------------------------------------------------------

@pytest.mark.slow
def test_base_revision_absent_from_the_cache_is_IV505(package_dir, hf_cache):
    absent = "0123456789abcdef0123456789abcdef01234567"
    edit_json(package_dir, f"{ADAPTER}/adapter_config.json", lambda c: c.update(revision=absent))
    edit_manifest(package_dir, lambda m: m["artifacts"][2]["base"].update(revision=absent))
    results, findings = reload(package_dir, hf_cache, "lora-r16-adapter")
    assert codes_for(findings, "lora-r16-adapter") == ["IV505"]
    assert absent in findings[0].message and results["lora-r16-adapter"].failure == "base-unavailable"


@pytest.mark.slow
def test_empty_hub_cache_is_IV505_never_a_silent_pass(package_dir, tmp_path):
    empty_cache = tmp_path / "empty-cache"
    empty_cache.mkdir()
    _, findings = reload(package_dir, empty_cache, "lora-r16-adapter")
    assert codes_for(findings, "lora-r16-adapter") == ["IV505"]


# --- IV507 / IV508: resume checkpoints ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("component", ["scheduler.pt", "rng_state.pth", "optimizer.pt", "trainer_state.json"])
def test_trainer_checkpoint_missing_a_component_is_IV507(package_dir, hf_cache, component):
    (package_dir / CHECKPOINT / component).unlink()
    _, findings = reload(package_dir, hf_cache, "control-resume")
    # Seen without loading, so reported by the static phase (rules/reload.py), and not again by the reload.
    findings += [f for f in static_findings(package_dir) if f.artifact == "control-resume"]
    assert codes_for(findings, "control-resume") == ["IV507"]
    assert component.split(".")[0] in findings[0].message


@pytest.mark.slow
def test_global_step_disagreeing_with_the_optimizer_is_IV508(package_dir, hf_cache):
    edit_json(package_dir, f"{CHECKPOINT}/trainer_state.json", lambda s: s.update(global_step=6))
    _, findings = reload(package_dir, hf_cache, "control-resume")
    (finding,) = findings
    assert finding.code == "IV508" and "4 step" in finding.message and "6" in finding.message


@pytest.mark.slow
def test_optimizer_of_another_model_is_IV508(package_dir, hf_cache):
    lora_optimizer = load_resume(package_dir / RESUME)["optimizer"]
    torch.save(lora_optimizer, package_dir / CHECKPOINT / "optimizer.pt")
    _, findings = reload(package_dir, hf_cache, "control-resume")
    assert codes_for(findings, "control-resume") == ["IV508"]


def test_torch_resume_without_rng_is_IV507(package_dir, hf_cache):
    data = load_resume(package_dir / RESUME)
    del data["rng"]
    torch.save(data, package_dir / RESUME)
    _, findings = reload(package_dir, hf_cache, "lora-r16-resume")
    findings += [f for f in static_findings(package_dir) if f.artifact == "lora-r16-resume"]  # seen statically
    assert codes_for(findings, "lora-r16-resume") == ["IV507"] and "`rng`" in findings[0].message


def test_torch_resume_step_disagreeing_is_IV508(package_dir, hf_cache):
    data = load_resume(package_dir / RESUME)
    data["step"] = 9
    torch.save(data, package_dir / RESUME)
    _, findings = reload(package_dir, hf_cache, "lora-r16-resume")
    assert codes_for(findings, "lora-r16-resume") == ["IV508"]


def test_fp16_run_without_scaler_is_IV507(package_dir, hf_cache):
    edit_json(package_dir, "params/lora-r16.json", lambda p: p.update(fp16=True))
    _, findings = reload(package_dir, hf_cache, "lora-r16-resume")
    findings += [f for f in static_findings(package_dir, select=("IV507",)) if f.artifact == "lora-r16-resume"]
    assert codes_for(findings, "lora-r16-resume") == ["IV507"] and "scaler" in findings[0].message


# --- IV509 ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_accepted_run_with_no_reloadable_artifact_is_IV509(package_dir, hf_cache):
    edit_manifest(package_dir, lambda m: m["decision"].update(accepted=["control"]))
    truncate(package_dir / CONTROL_MODEL / "model.safetensors", 1000)
    (package_dir / CHECKPOINT / "model.safetensors").unlink()
    _, findings = reload(package_dir, hf_cache, "control-model", "control-resume", judge_runs=True)
    iv509 = [f for f in findings if f.code == "IV509"]
    assert [(f.run, f.pointer) for f in iv509] == [("control", "/decision/accepted/0")]


# --- isolation: hang, crash, kill -----------------------------------------------------------------------

MISBEHAVE = textwrap.dedent("""
    # Test-only: makes the reload child of one artifact misbehave, from outside the product's code: at the start
    # of a spawned child, or, in the zygote, at the entry each forked child runs.
    import json, os, signal, time
    def _misbehave():
        try:
            args = open("/proc/self/cmdline", "rb").read().split(b"\\0")
        except OSError:
            return
        if b"itera_verify.reload.zygote" in args:
            from itera_verify.reload import child
            real = child.forked
            def forked(argv):
                _act(json.load(open(argv[1])))
                return real(argv)
            child.forked = forked
            return
        if b"itera_verify.reload.child" not in args:
            return
        _act(json.load(open(args[args.index(b"itera_verify.reload.child") + 1])))
    def _act(job):
        artifact, _, how = os.environ.get("ITERA_TEST_MISBEHAVE", "").partition(":")
        if job["artifact"] != artifact:
            return
        with open(os.environ["ITERA_TEST_PIDFILE"], "w") as fh:
            fh.write(str(os.getpid()))
        if how == "hang":
            time.sleep(3600)
        os.kill(os.getpid(), getattr(signal, how))
    _misbehave()
""")


@pytest.fixture
def misbehave(tmp_path, monkeypatch):
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("needs /proc")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(MISBEHAVE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("ITERA_TEST_PIDFILE", str(tmp_path / "pid"))

    def arm(artifact: str, how: str) -> Path:
        monkeypatch.setenv("ITERA_TEST_MISBEHAVE", f"{artifact}:{how}")
        return tmp_path / "pid"
    return arm


HANG_TIMEOUT = 6


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [False, True], ids=["side-by-side", "one-at-a-time-prefetched"])
def test_hanging_reload_times_out_as_IV504_and_the_next_artifact_still_reloads(package_dir, hf_cache, misbehave,
                                                                              prefetch):
    pid_file = misbehave("control-model", "hang")
    # The timeout runs from the child's gate, after its imports: a few seconds are plenty for the resume file
    # that follows, however loaded the machine.
    results, findings = reload(package_dir, hf_cache, "control-model", "lora-r16-resume", timeout=HANG_TIMEOUT,
                               jobs=1, prefetch=prefetch)
    assert results["control-model"].failure == "timeout"
    assert HANG_TIMEOUT <= results["control-model"].seconds < HANG_TIMEOUT + 20
    assert codes_for(findings, "control-model") == ["IV504"] and "timed out" in findings[0].message
    assert results["lora-r16-resume"].ok
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # the hung child is gone, not left behind


@pytest.mark.parametrize("how,words", [("SIGSEGV", "SIGSEGV"), ("SIGKILL", "out of memory")])
def test_crashed_or_killed_reload_is_IV504_naming_what_happened(package_dir, hf_cache, misbehave, how, words):
    misbehave("lora-r16-resume", how)
    results, findings = reload(package_dir, hf_cache, "lora-r16-resume")
    assert results["lora-r16-resume"].failure == "crash"
    (finding,) = findings
    assert finding.code == "IV504" and words in finding.message


# --- device ---------------------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_exits_2_with_one_line(package_dir):
    result = run_cli(package_dir, "--device", "cuda", "--no-seal")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cuda" in lines[0].lower() and "Traceback" not in result.stderr


# --- IV506 through everything: nothing is unpickled unscanned --------------------------------------------

@pytest.mark.slow
def test_malicious_pickles_are_IV506_through_the_cli_and_never_run(package_dir, hf_cache, tmp_path):
    marker = tmp_path / "pwned"
    malicious_pickle(package_dir / CHECKPOINT / "optimizer.pt", marker, via="system", fmt="torch")
    malicious_pickle(package_dir / "analysis/cache.pkl", marker, via="open")
    malicious_pickle(package_dir / "artifacts/control-model/extra.bin", marker, via="system")
    result = run_cli(package_dir, "--no-seal", "--hf-cache", hf_cache, "--format", "json", "--jobs", "2")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    flagged = {f["path"] for f in report["findings"] if f["code"] == "IV506"}
    assert flagged == {f"{CHECKPOINT}/optimizer.pt", "analysis/cache.pkl", "artifacts/control-model/extra.bin"}
    reloads = {r["artifact"]: r for r in report["reloads"]}
    assert not reloads["control-resume"]["ok"] and "refused" in reloads["control-resume"]["error"]
    assert not reloads["control-model"]["ok"]
    assert not marker.exists()


@pytest.mark.slow
def test_child_rescans_a_pickle_swapped_after_the_static_scan(package_dir, hf_cache, tmp_path):
    marker = tmp_path / "pwned"
    package = context(package_dir, hf_cache=Path(hf_cache))
    scan_package(package)  # the static phase saw a clean optimizer.pt
    malicious_pickle(package_dir / CHECKPOINT / "optimizer.pt", marker, via="open", fmt="torch")
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=300, jobs=1, progress=NULL_PROGRESS,
                                  only={"control-resume"}))
    (result,) = package.reloads
    assert not result.ok and "refused" in json.dumps(result.facts) and "io.open" in json.dumps(result.facts)
    assert not marker.exists()


def test_no_reload_means_no_reload_findings(package_dir):
    shutil.rmtree(package_dir / ADAPTER)
    package = context(package_dir)
    assert list(reload_rules.check(package)) == []  # reloads is None: nothing was proved or disproved


# --- one at a time, the next child importing meanwhile (the GPU path, run here on the CPU) -------------------

def private_tempdir(monkeypatch, tmp_path) -> Path:
    """This test's own temporary folder: another test worker's reloads never show up in it."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.slow
def test_prefetched_reloads_overlap_start_up_and_prove_the_same(package_dir, hf_cache, monkeypatch, tmp_path):
    """GPU reloads run one at a time; the next child imports torch and transformers while the current one loads,
    and waits for its turn before it touches the device. Same results, less wall time."""
    temp = private_tempdir(monkeypatch, tmp_path)
    artifacts = ("control-model", "lora-r16-adapter", "lora-r16-resume")
    results, findings = reload(package_dir, hf_cache, *artifacts, jobs=1, prefetch=True)
    assert findings == [] and all(results[a].ok for a in artifacts), {a: results[a].error for a in artifacts}
    first, second, third = (results[a] for a in artifacts)
    # Launched by the parent while the previous child still ran. (The child's own first line can come after a
    # tiny model's whole reload on a loaded machine: an interpreter start is slower than that.)
    assert second.facts["launched_at"] < first.facts["ended_at"], "the next child started only after the first"
    assert third.facts["launched_at"] < second.facts["ended_at"]
    for later in (second, third):
        assert later.facts["launched_at"] <= later.facts["started_at"] <= later.facts["ended_at"]
    for result in (second, third):
        assert result.facts["gate_wait_seconds"] >= 0
        # Its wait is not its time: the seconds reported are the child's whole span less the wait, and that span
        # covers at least what the child itself measured from its first line to its result.
        facts = result.facts
        assert result.seconds == pytest.approx(facts["wall_seconds"] - facts["gate_wait_seconds"], abs=0.002)
        assert facts["wall_seconds"] >= facts["ended_at"] - facts["started_at"] - 0.05
    assert list(temp.iterdir()) == []  # every reload folder removed


def test_ctrl_c_during_prefetched_reloads_ends_the_waiting_child_too(package_dir, hf_cache, monkeypatch, tmp_path):
    from itera_verify.reload import runner
    from itera_verify.runtime.launcher import Launcher

    spawned = []
    real_init, real_wait = runner._Child.__init__, Launcher.wait

    def remember(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        spawned.append(self)

    def interrupted_once(self, proc, timeout, *limit):
        if not getattr(interrupted_once, "done", False) and len(spawned) == 2:
            interrupted_once.done = True
            raise KeyboardInterrupt  # Ctrl-C while the first child reloads and the second waits, imported
        return real_wait(self, proc, timeout, *limit)

    monkeypatch.setattr(runner._Child, "__init__", remember)
    monkeypatch.setattr(Launcher, "wait", interrupted_once)
    temp = private_tempdir(monkeypatch, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        reload(package_dir, hf_cache, "control-model", "lora-r16-resume", jobs=1, prefetch=True)
    assert len(spawned) == 2
    for child in spawned:
        assert child.proc.wait(timeout=10) is not None  # ended (killed), not left running
    assert list(temp.iterdir()) == []
