"""IV301–IV308: one planted defect per test, in a copy of the real example package."""
from __future__ import annotations

import json

from fixtures.edit import edit_json, edit_manifest, load_json, refresh_hashes, write_json, write_text
from tests.handmade import write_tiny_package
from tests.helpers import codes, static_findings

FAMILY = {"IV301", "IV302", "IV303", "IV304", "IV305", "IV306", "IV307", "IV308"}


def only(findings, code):
    return [f for f in findings if f.code == code]


def test_clean_package_has_no_identity_finding(package_dir):
    assert not codes(static_findings(package_dir)) & FAMILY


def test_two_runs_share_an_id_is_IV301(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][0].update(id="lora-r16"))  # the pilot, lora-r64
    found = only(static_findings(package_dir), "IV301")
    assert len(found) == 1
    assert found[0].pointer == "/runs/2/id" and found[0].run == "lora-r16"
    assert "runs 0 and 2" in found[0].message


def test_no_control_run_is_IV302(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][1].update(role="variant"))
    found = only(static_findings(package_dir), "IV302")
    assert len(found) == 1 and "no control run" in found[0].message


def test_two_control_runs_is_IV302(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][2].update(role="control"))
    found = only(static_findings(package_dir), "IV302")
    assert len(found) == 1 and found[0].pointer == "/runs/2/role"
    assert "2 control runs (control, lora-r16)" in found[0].message


def _rewrite_predictions(package_dir, rel, change):
    lines = (package_dir / rel).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    write_text(package_dir, rel, "".join(json.dumps(r) + "\n" for r in change(records)))


def test_predictions_missing_duplicate_and_unexpected_ids_is_IV303(package_dir):
    def change(records):
        kept = records[3:]  # ex-0001..ex-0003 missing
        return kept + [dict(records[5]), {"id": "ex-9999", "prediction": "positive"}]

    _rewrite_predictions(package_dir, "predictions/lora-r16.jsonl", change)
    found = only(static_findings(package_dir), "IV303")
    assert len(found) == 1
    finding = found[0]
    assert finding.path == "predictions/lora-r16.jsonl" and finding.run == "lora-r16"
    assert "3 missing (ex-0001, ex-0002, ex-0003)" in finding.message
    assert "1 duplicate (ex-0006)" in finding.message
    assert "1 unexpected (ex-9999)" in finding.message
    assert finding.line == 38  # the first repeated id
    assert "40 frozen eval ids" in finding.message


def test_predictions_for_a_quarter_of_the_ids_show_only_the_first_five_missing(package_dir):
    _rewrite_predictions(package_dir, "predictions/control.jsonl", lambda records: records[:10])
    (finding,) = only(static_findings(package_dir), "IV303")
    assert "30 missing (ex-0011, ex-0012, ex-0013, ex-0014, ex-0015, …)" in finding.message
    assert finding.run == "control"


def test_prediction_records_without_an_id_is_IV303(package_dir):
    _rewrite_predictions(package_dir, "predictions/control.jsonl",
                         lambda records: [{k: v for k, v in r.items() if k != "id"} if i == 4 else r
                                          for i, r in enumerate(records)])
    (finding,) = only(static_findings(package_dir), "IV303")
    assert "1 without an id (line 5)" in finding.message and "1 missing (ex-0005)" in finding.message


def test_params_changed_after_the_run_is_IV304(package_dir):
    edit_json(package_dir, "params/control.json", lambda p: p.update(learning_rate=1e-3))
    found = only(static_findings(package_dir), "IV304")
    assert len(found) == 1
    assert found[0].pointer == "/runs/1/config_sha256" and found[0].run == "control"
    assert "new run id" in found[0].message


def test_config_sha256_not_recorded_is_IV304(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][2].pop("config_sha256"))
    (finding,) = only(static_findings(package_dir), "IV304")
    assert finding.run == "lora-r16" and "no SHA-256" in finding.message


def test_artifact_of_a_misspelt_run_is_IV305(package_dir):
    edit_manifest(package_dir, lambda m: m["artifacts"][2].update(run="lora-16"))
    (finding,) = only(static_findings(package_dir), "IV305")
    assert finding.pointer == "/artifacts/2/run" and "'lora-16'" in finding.message


def test_stop_record_for_an_unknown_run_is_IV305(package_dir):
    edit_json(package_dir, "stops.json", lambda s: s["stops"][0].update(run="lora-r32"))
    found = only(static_findings(package_dir), "IV305")
    assert [(f.path, f.pointer) for f in found] == [("stops.json", "/stops/0/run")]


def test_accepting_an_unknown_run_is_IV305(package_dir):
    edit_manifest(package_dir, lambda m: m["decision"]["accepted"].append("lora-r8"))
    (finding,) = only(static_findings(package_dir), "IV305")
    assert finding.pointer == "/decision/accepted/2" and finding.run == "lora-r8"


def test_leftover_params_file_of_a_dropped_run_is_IV305(package_dir):
    write_json(package_dir, "params/lora-r32.json", {"seed": 45})
    (finding,) = only(static_findings(package_dir), "IV305")
    assert finding.path == "params/lora-r32.json" and "lora-r32" in finding.message


def test_corpus_without_revision_is_IV306(package_dir):
    edit_manifest(package_dir, lambda m: m["corpus"].pop("revision"))
    (finding,) = only(static_findings(package_dir), "IV306")
    assert finding.pointer == "/corpus" and "no revision" in finding.message


def test_eval_ids_hash_not_recorded_is_IV306(package_dir):
    edit_manifest(package_dir, lambda m: m["corpus"].pop("eval_ids_sha256"))
    (finding,) = only(static_findings(package_dir), "IV306")
    assert "eval_ids_sha256" in finding.message


def test_eval_ids_edited_after_freezing_is_IV306(package_dir):
    ids = (package_dir / "corpus/eval_ids.txt").read_text()
    write_text(package_dir, "corpus/eval_ids.txt", ids + "ex-0041\n")
    found = static_findings(package_dir)
    (finding,) = only(found, "IV306")
    assert finding.pointer == "/corpus/eval_ids_sha256" and "changed after the corpus was frozen" in finding.message
    assert {f.run for f in only(found, "IV303")} == {"control", "lora-r16"}  # and nobody predicted ex-0041


def test_control_in_the_useful_category_is_IV307(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][1].update(category="useful"))
    (finding,) = only(static_findings(package_dir), "IV307")
    assert finding.pointer == "/runs/1/category" and finding.severity.value == "warning"


def test_refreshed_hashes_after_a_params_edit_are_clean(package_dir):
    """The counter-test of IV304: a new configuration with its hash recorded is not a finding."""
    edit_json(package_dir, "params/control.json", lambda p: p.update(learning_rate=1e-3))
    refresh_hashes(package_dir)
    assert "IV304" not in codes(static_findings(package_dir))
    assert load_json(package_dir, "manifest.json")["runs"][1]["config_sha256"] != ""


def test_variant_predictions_copied_from_the_control_is_IV308(package_dir):
    write_text(package_dir, "predictions/lora-r16.jsonl", (package_dir / "predictions/control.jsonl").read_text())
    (finding,) = only(static_findings(package_dir), "IV308")
    assert finding.path == "predictions/lora-r16.jsonl" and finding.run == "lora-r16"
    assert finding.severity.value == "warning"
    assert "byte-identical to run control's (predictions/control.jsonl)" in finding.message


def test_two_runs_naming_one_predictions_file_is_IV308(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][2].update(predictions="predictions/control.jsonl"))
    (finding,) = only(static_findings(package_dir), "IV308")
    assert finding.run == "lora-r16" and "names the same predictions file as run control" in finding.message


def test_predictions_of_the_same_size_that_differ_are_not_IV308(package_dir):
    # Same length, one answer swapped for another of the same length: sizes match, digests do not.
    text = (package_dir / "predictions/control.jsonl").read_text()
    first, rest = text.split("\n", 1)
    swapped = first.replace('"prediction": "positive"', '"prediction": "negative"')
    assert swapped != first and len(swapped) == len(first)
    write_text(package_dir, "predictions/lora-r16.jsonl", swapped + "\n" + rest)
    assert not only(static_findings(package_dir), "IV308")


# ---- a package written by hand ----------------------------------------------------------------------------

def test_handmade_package_is_clean(tmp_path):
    write_tiny_package(tmp_path / "tiny")
    assert not codes(static_findings(tmp_path / "tiny")) & FAMILY


def test_handmade_package_with_a_repeated_run_id_and_no_control(tmp_path):
    def edit(manifest):
        manifest["runs"][0]["role"] = "variant"
        manifest["runs"][2]["id"] = "small"

    write_tiny_package(tmp_path / "tiny", edit)
    found = codes(static_findings(tmp_path / "tiny"))
    assert {"IV301", "IV302"} <= found


def test_handmade_predictions_with_an_unexpected_id(tmp_path):
    root = write_tiny_package(tmp_path / "tiny")
    write_text(root, "predictions/small.jsonl", "".join(
        json.dumps({"id": i, "prediction": "yes"}) + "\n" for i in ["q1", "q2", "q3", "q4"]))
    (finding,) = only(static_findings(root), "IV303")
    assert "1 unexpected (q4)" in finding.message and finding.line == 4 and finding.run == "small"


def test_malformed_manifest_shapes_do_not_crash_identity_rules(tmp_path):
    def edit(manifest):
        manifest["runs"] = [None, 3, {"id": ["x"], "role": {}, "params": 5, "predictions": ["a"]},
                            {"id": "base", "role": "control", "params": "../outside.json"}]
        manifest["corpus"] = {"revision": 7, "eval_ids": {"a": 1}, "eval_ids_sha256": None}
        manifest["artifacts"] = {"not": "a list"}
        manifest["decision"] = {"accepted": "base"}

    write_tiny_package(tmp_path / "tiny", edit)
    found = codes(static_findings(tmp_path / "tiny"))
    assert "IV306" in found  # the revision is not a string


def test_eval_id_listed_twice_is_IV306(package_dir):
    from fixtures.edit import refresh_hashes

    ids = (package_dir / "corpus" / "eval_ids.txt").read_text().splitlines()
    (package_dir / "corpus" / "eval_ids.txt").write_text("\n".join(ids + [ids[0]]) + "\n")
    refresh_hashes(package_dir)
    found = [f for f in static_findings(package_dir) if f.code == "IV306"]
    assert [f.path for f in found] == ["corpus/eval_ids.txt"] and ids[0] in found[0].message
