"""Does the package tell the truth (issue 41)? What params/<run>.json and the manifest declare against what the
artifacts of real tiny Trainer and PEFT runs record about themselves (IV514), and a config.json's dtype against
the stored weights (IV515). The campaign is recorded by the tool's own recorder (fixtures/truth.py); each test
changes one declaration in a private copy, as a stale file or a hurried export leaves it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from fixtures.artifacts import malicious_pickle
from fixtures.edit import edit_json, edit_manifest, refresh_hashes
from tests.helpers import codes, run_cli, static_findings

NEW_CODES = {"IV311", "IV312", "IV313", "IV314", "IV514", "IV515", "IV516", "IV517", "IV518", "IV519"}


def found(package: Path, code: str) -> list:
    return [f for f in static_findings(package, select=(code,)) if f.code == code]


def edit_params(package: Path, run: str, **values) -> None:
    edit_json(package, f"params/{run}.json", lambda params: params.update(values))
    refresh_hashes(package)  # a changed params file is IV304 too: only the rule under test here


def test_the_correct_controls_pass_with_no_finding(built_truth):
    """A correct crash-and-resume, sharded saves, fp16 and bf16 deliveries, a LoRA adapter, a chat fine-tune with
    resized embeddings (a model and an adapter): every declaration true, nothing found, not even a warning of the
    new rules."""
    findings = static_findings(Path(built_truth["clean"]))
    assert not codes(findings) & NEW_CODES, [f.message for f in findings if f.code in NEW_CODES]
    assert [f for f in findings if f.severity.value == "error"] == []


def test_the_new_rules_are_static_and_quiet_on_the_clean_package_through_the_cli(built_truth):
    done = run_cli(built_truth["clean"], "--no-reload", "--no-seal", "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, report["findings"]
    assert not {f["code"] for f in report["findings"]} & NEW_CODES


def test_a_params_learning_rate_stale_against_training_args_is_IV514(truth_dir):
    edit_params(truth_dir, "control", learning_rate=1e-4)
    [finding] = found(truth_dir, "IV514")
    assert (finding.path, finding.pointer, finding.run) == ("params/control.json", "/learning_rate", "control")
    assert "learning_rate = 0.0001" in finding.message and "training_args.bin records learning_rate = 0.005" \
        in finding.message and "checkpoints/control/checkpoint-" in finding.message
    assert "other artifact" in finding.message  # both checkpoints record it: said once


def test_a_params_seed_that_is_not_the_trainers_is_IV514(truth_dir):
    edit_params(truth_dir, "resumed", seed=42)
    [finding] = found(truth_dir, "IV514")
    assert finding.run == "resumed" and "seed = 42" in finding.message and "records seed = 12" in finding.message


def test_params_max_steps_stale_against_training_args_and_trainer_state_is_IV514(truth_dir):
    edit_params(truth_dir, "lora", max_steps=100)
    findings = found(truth_dir, "IV514")
    recorded = {f.message.split(" records ")[1].split(" =")[0] for f in findings}
    assert recorded == {"max_steps"} and len(findings) == 2  # training_args.bin and trainer_state.json
    assert {"training_args.bin", "trainer_state.json"} == {
        f.message.split(" records ")[0].rsplit("/", 1)[-1] for f in findings}


def test_a_params_lora_rank_and_alpha_stale_against_adapter_config_are_IV514(truth_dir):
    edit_params(truth_dir, "lora", lora_r=16, lora_alpha=32)
    findings = found(truth_dir, "IV514")
    assert {f.pointer for f in findings} == {"/lora_r", "/lora_alpha"}
    rank = next(f for f in findings if f.pointer == "/lora_r")
    assert "lora_r = 16" in rank.message and "adapter_config.json records r = 4" in rank.message


def test_params_fp16_that_the_trainer_never_ran_is_IV514(truth_dir):
    edit_params(truth_dir, "control", fp16=True)
    [finding] = found(truth_dir, "IV514")
    assert "fp16 = true" in finding.message and "records fp16 = false" in finding.message


def test_params_precision_fp32_for_a_run_whose_checkpoint_trained_in_bf16_is_IV514(truth_dir):
    assert json.loads((truth_dir / "params/bf16.json").read_text())["precision"] == "bf16"  # the recorder's
    edit_params(truth_dir, "bf16", precision="fp32")
    [finding] = found(truth_dir, "IV514")
    assert finding.pointer == "/precision" and "bfloat16" in finding.message and "float32" in finding.message


def test_a_manifest_checkpoint_step_that_is_not_the_checkpoints_own_is_IV514(truth_dir):
    def shift(manifest):
        run = next(r for r in manifest["runs"] if r["id"] == "resumed")
        run["checkpoints"][0]["step"] = 6
    edit_manifest(truth_dir, shift)
    findings = found(truth_dir, "IV514")
    assert {f.path for f in findings} == {"manifest.json"} and len(findings) == 2  # global_step and folder name
    assert all("saved at step 6" in f.message for f in findings)
    assert any("global_step = 4" in f.message for f in findings)


def test_a_config_dtype_copied_from_the_fp16_delivery_onto_fp32_weights_is_IV515(truth_dir):
    shutil.copy(truth_dir / "artifacts/control-fp16/config.json", truth_dir / "artifacts/control-model/config.json")
    [finding] = found(truth_dir, "IV515")
    assert finding.path == "artifacts/control-model/config.json" and finding.pointer == "/dtype"
    assert "'float16'" in finding.message and "stored in float32" in finding.message


def test_fp16_bf16_and_sharded_deliveries_declare_their_stored_dtype(built_truth):
    clean = Path(built_truth["clean"])
    dtypes = {name: json.loads((clean / f"artifacts/{name}/config.json").read_text())["dtype"]
              for name in ("control-model", "control-fp16", "control-sharded", "bf16-model")}
    assert dtypes == {"control-model": "float32", "control-fp16": "float16", "control-sharded": "float32",
                      "bf16-model": "bfloat16"}
    assert found(clean, "IV515") == []


def test_training_args_are_read_from_the_pickle_opcodes_without_unpickling(built_truth, tmp_path):
    from itera_verify.package.pickle_state import training_args

    with open(Path(built_truth["clean"]) / "checkpoints/control/checkpoint-6/training_args.bin", "rb") as fh:
        args = training_args(fh)
    assert (args["seed"], args["learning_rate"], args["max_steps"], args["lr_scheduler_type"]) == (11, 5e-3, 6,
                                                                                                    "linear")
    marker = tmp_path / "pwned"
    payload = malicious_pickle(tmp_path / "training_args.bin", marker, fmt="torch")
    with open(payload, "rb") as fh:
        assert training_args(fh) is None
    assert not marker.exists()


def fact_rows() -> list[str]:
    """The rows of docs/format.md's declared-facts table, as format/facts.py holds them."""
    from itera_verify.format.facts import FACTS

    rows = []
    for row in FACTS:
        keys = ", ".join(f"`{k}`" for k in row.keys)
        records = "; ".join(f"`{r.file}` {r.field}" + (f" ({r.when})" if r.when else "") for r in row.records)
        comparison = row.comparison + (f" (relative {row.tolerance:g})" if row.tolerance else "")
        rows.append(f"| {row.name} | `{row.declared_in}`: {keys} | {records} | {comparison} | {row.code} |")
    return rows


def test_the_docs_list_every_declared_fact_of_the_table():
    text = (Path(__file__).resolve().parents[1] / "docs" / "format.md").read_text()
    missing = [row for row in fact_rows() if row not in text]
    assert missing == [], "regenerate docs/format.md's Declared facts table from tests/test_declared_facts.fact_rows"
