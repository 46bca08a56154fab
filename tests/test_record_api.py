"""itera_verify.record without a training library: what it refuses, what survives a SIGKILL, a reopened
campaign, two processes updating one manifest, and that importing it pulls in no torch/transformers/lightning."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from itera_verify.record import RecordError, open_campaign

from tests.test_record_trainer import errors, verify

ROOT = Path(__file__).resolve().parents[1]
EVAL_IDS = [f"q-{i}" for i in range(4)]
QUESTION = "Does the variant beat the control?"
RULES = [{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"}]
LOTS = [{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}]


def campaign_at(path: Path):
    campaign = open_campaign(path, "api-test", QUESTION, "toy", "v1", EVAL_IDS)
    campaign.declare_plan(lots=LOTS, reserved_hours=2)
    campaign.declare_stop_rules(RULES)
    return campaign


def finish(campaign, run, accepted=("control",)):
    with run.predictions() as stream:
        for i in EVAL_IDS:
            stream.write(i, "yes")
    run.complete()
    campaign.decision("continue", after="pilot")
    return campaign.close("inconclusive", "one run only", accepted=list(accepted), error_analysis="# none\n",
                          observed_hours=2)


@pytest.mark.slow
def test_importing_itera_verify_and_record_imports_no_training_library():
    code = ("import sys, itera_verify, itera_verify.record, itera_verify.integrations\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'lightning', 'pytorch_lightning', 'peft'))\n"
            "print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    # ...and using a callback does import its library (the check above can fail). Where DeepSpeed is installed the
    # callback imports it too (before any process group exists), and DeepSpeed logs its accelerator first.
    code = "import sys, itera_verify.integrations as i; i.RecordCallback; print('transformers' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "True"


def test_a_clean_hand_recorded_campaign_verifies(tmp_path, hf_cache):
    campaign = campaign_at(tmp_path / "pkg")
    run = campaign.start_run("control", "control", params={"seed": 1, "lr": 0.1})
    run.log_dict(1, {"loss": 2.0})
    manifest = finish(campaign, run)
    assert manifest["decision"]["cost_per_accepted_usd"] == 47.14
    assert errors(verify(tmp_path / "pkg", hf_cache, "--no-reload")) == []


def test_a_changed_configuration_under_the_same_id_is_refused(tmp_path):
    campaign = campaign_at(tmp_path / "pkg")
    campaign.start_run("control", "control", params={"seed": 1, "lr": 0.1})
    before = (tmp_path / "pkg/params/control.json").read_bytes()
    with pytest.raises(RecordError, match="another configuration.*needs a new run id"):
        campaign.start_run("control", "control", params={"seed": 1, "lr": 0.2})
    assert (tmp_path / "pkg/params/control.json").read_bytes() == before
    changed = campaign.run("control", "control", params={"seed": 1, "lr": 0.3})
    with pytest.raises(RecordError):
        changed.start()
    with pytest.raises(RecordError, match="has not started"):  # a refused run logs nowhere
        changed.log(1, "loss", 1.0)
    with pytest.raises(RecordError, match="params must be JSON"):
        campaign.start_run("variant", "variant", params={"seed": 1, "lr": float("nan")})
    campaign.start_run("control", "control", params={"lr": 0.1, "seed": 1})  # same params, any key order
    with pytest.raises(RecordError, match="integer seed"):
        campaign.start_run("variant", "variant", params={"lr": 0.1})


def test_predictions_are_checked_against_the_frozen_ids_as_they_come(tmp_path):
    campaign = campaign_at(tmp_path / "pkg")
    run = campaign.start_run("control", "control", params={"seed": 1})
    with run.predictions() as stream:
        stream.write("q-0", 1)
        with pytest.raises(RecordError, match="not among the frozen eval ids"):
            stream.write("q-99", 1)
        with pytest.raises(RecordError, match="already written"):
            stream.write("q-0", 2)
    lines = (tmp_path / "pkg/predictions/control.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["q-0"]
    with pytest.raises(RecordError, match="3 eval ids have no prediction"):
        run.complete()


def test_a_stop_names_a_declared_rule_and_a_stopped_run_is_never_accepted(tmp_path):
    campaign = campaign_at(tmp_path / "pkg")
    run = campaign.start_run("control", "control", params={"seed": 1})
    with pytest.raises(RecordError, match="was not declared"):
        run.stop("made-up", 1, "why not")
    violation = run.log(3, "loss", float("inf"))
    assert violation and violation.rule == "nonfinite-loss" and violation.step == 3
    run.stop_for(violation)
    with pytest.raises(RecordError, match="cannot be accepted: it is stopped"):
        campaign.close("negative", "stopped", accepted=["control"])
    stops = json.loads((tmp_path / "pkg/stops.json").read_text())["stops"]
    assert [(s["rule"], s["step"]) for s in stops] == [("nonfinite-loss", 3)]


def test_reopening_with_another_corpus_is_refused(tmp_path):
    campaign_at(tmp_path / "pkg")
    with pytest.raises(RecordError, match="eval ids differ"):
        open_campaign(tmp_path / "pkg", "api-test", QUESTION, "toy", "v1", EVAL_IDS + ["q-9"])
    with pytest.raises(RecordError, match="question"):
        open_campaign(tmp_path / "pkg", "api-test", "Another question?", "toy", "v1", EVAL_IDS)


# A process that logs small records, then one very large one: the parent kills it while that one is written.
LOGGER = """
import sys
from itera_verify.record import open_campaign
c = open_campaign(sys.argv[1], "api-test", {question!r}, "toy", "v1", {ids!r})
c.declare_plan(lots={lots!r}, reserved_hours=2)
c.declare_stop_rules({rules!r})
run = c.start_run("control", "control", params={{"seed": 1}})
for step in range(1, 201):
    run.log(step, "loss", 1.0 / step)
print("big", flush=True)
run.log(201, "x" * (96 << 20), 0.5)
print("done", flush=True)
"""


def kill_while_logging(package: Path) -> None:
    script = LOGGER.format(question=QUESTION, ids=EVAL_IDS, lots=LOTS, rules=RULES)
    metrics = package / "metrics/control.jsonl"
    for _ in range(3):  # the big write must still be under way when the kill lands
        if package.exists():
            import shutil
            shutil.rmtree(package)
        child = subprocess.Popen([sys.executable, "-c", script, str(package)], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "big\n"
        small = metrics.stat().st_size  # the 200 small lines are written and fsynced
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and metrics.stat().st_size == small:
            time.sleep(0.001)
        child.send_signal(signal.SIGKILL)
        child.wait()
        if not metrics.read_bytes().endswith(b"\n"):
            return
    pytest.fail("the large line was written whole before the kill three times")


def test_a_sigkill_while_logging_loses_only_the_unfinished_line_and_the_checker_names_it(tmp_path, hf_cache):
    package = tmp_path / "pkg"
    kill_while_logging(package)
    lines = (package / "metrics/control.jsonl").read_bytes().split(b"\n")
    records = [json.loads(line) for line in lines[:-1]]
    assert records == [{"step": s, "name": "loss", "value": 1.0 / s} for s in range(1, 201)]
    report = verify(package, hf_cache, "--no-reload")
    iv104 = [f for f in report["findings"] if f["code"] == "IV104"]
    assert [(f["path"], f.get("line")) for f in iv104] == [("metrics/control.jsonl", 201)]
    # The rest is intact: the other findings are exactly those of a campaign not closed yet (a run still
    # running, its predictions not written, no observed hours, no decision).
    others = sorted((f["code"], f.get("path"), f["message"].split(":")[-1].strip()) for f in report["findings"]
                    if f["code"] != "IV104" and f["severity"] == "error")
    assert [(code, path) for code, path, _ in others] == [
        ("IV105", "manifest.json"), ("IV105", "manifest.json"), ("IV106", "manifest.json"),
        ("IV607", "manifest.json")]
    assert "'running' is not one of" in str(others) and "'observed_hours' is a required property" in str(others)


def test_a_reopened_campaign_continues_after_the_kill(tmp_path, hf_cache):
    package = tmp_path / "pkg"
    kill_while_logging(package)
    campaign = campaign_at(package)  # the same declarations: no change, no refusal
    run = campaign.start_run("control", "control", params={"seed": 1})
    with pytest.warns(UserWarning, match="dropped .* bytes of a line"):
        run.log(201, "loss", 0.004)
    records = [json.loads(line) for line in (package / "metrics/control.jsonl").read_text().splitlines()]
    assert len(records) == 201 and records[-1] == {"step": 201, "name": "loss", "value": 0.004}
    finish(campaign, run)
    assert errors(verify(package, hf_cache, "--no-reload")) == []


def test_a_temporary_file_left_by_an_interrupted_write_is_removed_on_reopen(tmp_path):
    campaign_at(tmp_path / "pkg")
    stale = tmp_path / "pkg/params/.itera-record-tmp-999-control.json"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("{")
    with pytest.warns(UserWarning, match="removed 1 temporary file"):
        campaign_at(tmp_path / "pkg")
    assert not stale.exists()


WORKER = """
import sys
from itera_verify.record import open_campaign
c = open_campaign(sys.argv[1], "api-test", {question!r}, "toy", "v1", {ids!r})
for i in range(int(sys.argv[3])):
    c.deviation(0.01, f"worker {{sys.argv[2]}} entry {{i}}")
"""


def test_two_processes_updating_one_manifest_lose_nothing(tmp_path):
    campaign_at(tmp_path / "pkg")
    script = WORKER.format(question=QUESTION, ids=EVAL_IDS)
    workers = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "pkg"), name, "40"])
               for name in ("a", "b")]
    assert [w.wait() for w in workers] == [0, 0]
    deviations = json.loads((tmp_path / "pkg/manifest.json").read_text())["timeline"]["deviations"]
    assert sorted(d["explanation"] for d in deviations) == sorted(
        f"worker {n} entry {i}" for n in ("a", "b") for i in range(40))
    assert not list((tmp_path / "pkg").rglob(".itera-record-tmp-*"))
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == [
        "corpus", "manifest.json", "reload.json", "stops.json"]  # no lock file in the package


def test_a_fixed_clock_dates_everything_and_a_refused_close_writes_nothing(tmp_path):
    times = iter(f"2026-11-20T0{h}:00:00Z" for h in range(8, 10))

    def clock():
        return next(times)

    campaign = open_campaign(tmp_path / "pkg", "api-test", QUESTION, "toy", "v1", EVAL_IDS, clock=clock)
    campaign.declare_plan(lots=LOTS, reserved_hours=2)
    with pytest.raises(RecordError, match="not a run of this campaign"):
        campaign.close("positive", "nothing ran", accepted=["ghost"], error_analysis="# x\n")
    assert not (tmp_path / "pkg/analysis").exists()
    manifest = json.loads((tmp_path / "pkg/manifest.json").read_text())
    assert (manifest["created_at"], manifest["plan"]["declared_at"]) == ("2026-11-20T08:00:00Z",
                                                                       "2026-11-20T09:00:00Z")


def test_a_run_needs_the_plan_and_the_rules_first_and_a_plan_must_fit_its_lots(tmp_path):
    campaign = open_campaign(tmp_path / "pkg", "api-test", QUESTION, "toy", "v1", EVAL_IDS)
    with pytest.raises(RecordError, match="declare the plan before the first run"):
        campaign.start_run("control", "control", params={"seed": 1})
    with pytest.raises(RecordError, match="exceed the window of 72 h"):
        campaign.declare_plan(lots=LOTS, reserved_hours=80)
    with pytest.raises(RecordError, match="exceeds the longest lot"):
        campaign.declare_plan(lots=LOTS, reserved_hours=10, window_hours=100)
    campaign.declare_plan(lots=LOTS, reserved_hours=10)
    with pytest.raises(RecordError, match="declare the stop rules"):
        campaign.start_run("control", "control", params={"seed": 1})
    assert json.loads((tmp_path / "pkg/manifest.json").read_text())["runs"] == []


def test_the_fallback_lock_file_excludes_too_and_lies_beside_the_package(tmp_path):
    import threading

    from itera_verify.record.lock import package_lock

    root = tmp_path / "pkg"
    root.mkdir()
    inside, overlaps = [], []

    def hold(name):
        for _ in range(20):
            with package_lock(root, folder_lock=False):
                inside.append(name)
                overlaps.append(len(inside) > 1)
                time.sleep(0.001)
                inside.remove(name)

    threads = [threading.Thread(target=hold, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlaps) == 40 and not any(overlaps)
    assert list(root.iterdir()) == [] and (tmp_path / ".pkg.itera-lock").is_file()


def test_a_stop_interrupted_between_stops_json_and_the_manifest_completes_without_a_second_record(tmp_path):
    campaign = campaign_at(tmp_path / "pkg")
    run = campaign.start_run("control", "control", params={"seed": 1})
    run.log(2, "loss", float("nan"))
    # What a crash after stops.json's rename and before the manifest's leaves behind:
    record = {"run": "control", "rule": "nonfinite-loss", "at": "2026-11-20T09:00:00Z", "step": 2,
              "reason": "loss became nan at step 2"}
    (tmp_path / "pkg/stops.json").write_text(json.dumps({"stops": [record]}))
    campaign_at(tmp_path / "pkg").start_run("control", "control", params={"seed": 1}).stop(
        "nonfinite-loss", 2, "loss became nan at step 2")
    assert json.loads((tmp_path / "pkg/stops.json").read_text())["stops"] == [record]
    (entry,) = json.loads((tmp_path / "pkg/manifest.json").read_text())["runs"]
    assert (entry["status"], entry["ended_at"]) == ("stopped", record["at"])


def test_closing_with_a_run_still_running_or_accepted_twice_is_refused(tmp_path):
    campaign = campaign_at(tmp_path / "pkg")
    run = campaign.start_run("control", "control", params={"seed": 1})
    with pytest.raises(RecordError, match="'control' is still running"):
        campaign.close("positive", "too early", accepted=[])
    with run.predictions() as stream:
        for i in EVAL_IDS:
            stream.write(i, "yes")
    run.complete()
    with pytest.raises(RecordError, match="accepted twice"):
        campaign.close("positive", "twice", accepted=["control", "control"])
    assert "decision" not in json.loads((tmp_path / "pkg/manifest.json").read_text())


def test_a_reopen_removes_stale_temporaries_only_while_it_holds_the_lock(tmp_path, monkeypatch):
    """Another process of the campaign renames its temporary file under the lock: a reopen that swept temporaries
    without the lock could delete that file between its write and its rename (the two-process test caught it)."""
    import errno
    import fcntl
    import os

    from itera_verify.record import campaign as campaign_module

    campaign_at(tmp_path / "pkg")
    held = []
    real_remove = campaign_module.remove_stale_temps

    def remove_and_probe(root):
        fd = os.open(root, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except OSError as exc:
            assert exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
            held.append(True)
        finally:
            os.close(fd)
        return real_remove(root)

    monkeypatch.setattr(campaign_module, "remove_stale_temps", remove_and_probe)
    (tmp_path / "pkg" / ".itera-record-tmp-1-manifest.json").write_text("{}")
    with pytest.warns(UserWarning, match="removed 1 temporary file"):
        open_campaign(tmp_path / "pkg", "api-test", QUESTION, "toy", "v1", EVAL_IDS)
    assert held == [True]
    assert not list((tmp_path / "pkg").rglob(".itera-record-tmp-*"))
