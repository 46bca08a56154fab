"""IV101–IV106 on the real example package: one planted defect per test."""
from __future__ import annotations


import pytest

from fixtures.edit import edit_json, edit_manifest, load_json, refresh_hashes, write_json, write_text
from tests.helpers import codes, static_findings


def only(findings, code):
    return [f for f in findings if f.code == code]


def test_clean_package_has_no_structure_findings(package_dir):
    assert not [f for f in static_findings(package_dir) if f.code.startswith("IV1")]


@pytest.mark.parametrize("rel", ["stops.json", "reload.json"])
def test_deleted_required_file_is_IV101(package_dir, rel):
    (package_dir / rel).unlink()
    found = only(static_findings(package_dir), "IV101")
    assert [f.path for f in found] == [rel], f"deleting {rel} went unnoticed"


def test_deleted_eval_ids_file_the_manifest_names_is_IV106_not_IV101(package_dir):
    (package_dir / "corpus/eval_ids.txt").unlink()
    found = static_findings(package_dir)
    assert [f.pointer for f in only(found, "IV106")] == ["/corpus/eval_ids"] and not only(found, "IV101")


def test_missing_manifest_is_IV101(package_dir):
    (package_dir / "manifest.json").unlink()
    found = only(static_findings(package_dir), "IV101")
    assert [f.path for f in found] == ["manifest.json"]


def test_completed_run_without_predictions_is_IV101(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][1].__setitem__("predictions", None))
    found = only(static_findings(package_dir), "IV101")
    assert [f.pointer for f in found] == ["/runs/1/predictions"]
    assert found[0].run == "control"


def test_deleted_params_file_is_IV106_with_its_pointer_not_IV101(package_dir):
    params = load_json(package_dir, "manifest.json")["runs"][2]["params"]
    (package_dir / params).unlink()
    found = static_findings(package_dir)
    assert [f.pointer for f in only(found, "IV106")] == ["/runs/2/params"] and not only(found, "IV101")
    assert "does not exist" in only(found, "IV106")[0].message


def test_params_naming_a_folder_is_IV101_not_IV106(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][2].__setitem__("params", "analysis"))
    found = static_findings(package_dir)
    assert [f.pointer for f in only(found, "IV101")] == ["/runs/2/params"] and not only(found, "IV106")
    assert "is a folder" in only(found, "IV101")[0].message


def test_run_naming_no_params_file_at_all_is_IV101(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][2].pop("params"))
    assert [f.pointer for f in only(static_findings(package_dir), "IV101")] == ["/runs/2/params"]


def test_a_reference_under_a_near_name_suggests_the_file_that_is_there(package_dir):
    params = load_json(package_dir, "manifest.json")["runs"][2]["params"]  # params/lora-r16.json
    edit_manifest(package_dir, lambda m: m["runs"][2].__setitem__("params", params.replace("-", "_")))
    (finding,) = only(static_findings(package_dir), "IV106")
    assert finding.pointer == "/runs/2/params" and f"did you mean {params}?" in finding.message


def test_a_folder_reference_under_a_near_name_suggests_the_folder(package_dir):
    path = load_json(package_dir, "manifest.json")["artifacts"][0]["path"]  # artifacts/control-model
    edit_manifest(package_dir, lambda m: m["artifacts"][0].__setitem__("path", path.replace("-", "_")))
    found = [f for f in static_findings(package_dir) if f.code == "IV106" and f.path == "manifest.json"]
    assert [f.pointer for f in found] == ["/artifacts/0/path"] and f"did you mean {path}?" in found[0].message


def test_no_suggestion_for_a_far_name_or_a_file_another_run_names(package_dir):
    manifest = load_json(package_dir, "manifest.json")
    taken = manifest["runs"][0]["params"]  # params/lora-r64.json, named by its own run
    edit_manifest(package_dir, lambda m: (m["runs"][1].__setitem__("params", taken.replace(".json", "x.json")),
                                          m["runs"][1].__setitem__("metrics", "metrics/zzzz.jsonl")))
    found = only(static_findings(package_dir), "IV106")
    assert sorted(f.pointer for f in found) == ["/runs/1/metrics", "/runs/1/params"]
    assert not any("did you mean" in f.message for f in found), [f.message for f in found]


def test_stopped_run_without_predictions_is_fine(package_dir):
    manifest = load_json(package_dir, "manifest.json")
    stopped = [r for r in manifest["runs"] if r["status"] == "stopped"]
    assert stopped and all(r.get("predictions") is None for r in stopped)
    assert not only(static_findings(package_dir), "IV101")


def test_zero_byte_file_is_IV102(package_dir):
    (package_dir / "artifacts" / "control-model" / "notes.txt").write_bytes(b"")
    found = only(static_findings(package_dir), "IV102")
    assert [f.path for f in found] == ["artifacts/control-model/notes.txt"]


def test_truncated_predictions_to_zero_bytes_is_IV102_not_IV103(package_dir):
    rel = load_json(package_dir, "manifest.json")["runs"][1]["predictions"]
    (package_dir / rel).write_bytes(b"")
    found = static_findings(package_dir)
    assert rel in [f.path for f in only(found, "IV102")]
    assert rel not in [f.path for f in only(found, "IV103")]


@pytest.mark.parametrize("empty", [{}, [], None])
def test_params_document_empty_in_substance_is_IV103(package_dir, empty):
    rel = load_json(package_dir, "manifest.json")["runs"][1]["params"]
    write_json(package_dir, rel, empty)
    refresh_hashes(package_dir)
    found = static_findings(package_dir)
    assert [f.path for f in only(found, "IV103")] == [rel]
    assert not only(found, "IV105"), "an empty document is IV103, not also a schema finding"


def test_whitespace_only_eval_ids_is_IV103(package_dir):
    write_text(package_dir, "corpus/eval_ids.txt", "  \n\n ")
    refresh_hashes(package_dir)
    assert "corpus/eval_ids.txt" in [f.path for f in only(static_findings(package_dir), "IV103")]


def test_jsonl_metrics_with_no_record_is_IV103(package_dir):
    rel = load_json(package_dir, "manifest.json")["runs"][2]["metrics"]
    write_text(package_dir, rel, "\n\n")
    assert rel in [f.path for f in only(static_findings(package_dir), "IV103")]


def test_csv_metrics_with_header_only_is_IV103(package_dir):
    write_text(package_dir, "metrics/control.csv", "step,name,value\n")
    edit_manifest(package_dir, lambda m: m["runs"][1].__setitem__("metrics", "metrics/control.csv"))
    found = only(static_findings(package_dir), "IV103")
    assert [f.path for f in found] == ["metrics/control.csv"]
    assert "header" in found[0].message


def test_stops_with_empty_list_is_not_empty(package_dir):
    write_json(package_dir, "stops.json", {"stops": []})
    assert not only(static_findings(package_dir), "IV103")


def test_manifest_with_trailing_comma_is_IV104_with_line_and_column(package_dir):
    text = (package_dir / "manifest.json").read_text()
    broken = text.replace('"question"', '"question_x": 1,,\n  "question"', 1)
    (package_dir / "manifest.json").write_text(broken)
    found = only(static_findings(package_dir), "IV104")
    assert len(found) == 1 and found[0].path == "manifest.json"
    expected_line = broken[: broken.index(",,") + 1].count("\n") + 1
    assert found[0].line == expected_line and found[0].column is not None


def test_broken_metrics_line_is_IV104_at_that_line(package_dir):
    rel = load_json(package_dir, "manifest.json")["runs"][1]["metrics"]
    lines = (package_dir / rel).read_text().splitlines()
    lines[2] = '{"step": 3, "name": "train_loss", "value": }'
    (package_dir / rel).write_text("\n".join(lines) + "\n")
    found = only(static_findings(package_dir), "IV104")
    assert [(f.path, f.line) for f in found] == [(rel, 3)]


def test_jsonl_lines_that_only_join_into_json_are_each_IV104(package_dir):
    """"[1", "2]", "3, 4" join into [[1, 2], 3, 4], as many values as lines, yet no line is JSON alone: each is
    IV104 at its own line, as a JSONL reader sees it."""
    write_text(package_dir, "analysis/traces.jsonl", '{"ok": 1}\n[1\n2]\n3, 4\n{"ok": 2}\n')
    found = only(static_findings(package_dir), "IV104")
    assert [(f.path, f.line) for f in found] == [("analysis/traces.jsonl", line) for line in (2, 3, 4)]


def test_invalid_yaml_is_IV104(package_dir):
    write_text(package_dir, "analysis/config.yaml", "lr: [0.1, 0.2\nseed: 3\n")
    found = only(static_findings(package_dir), "IV104")
    assert [f.path for f in found] == ["analysis/config.yaml"] and found[0].line is not None


def test_unknown_role_is_IV105_with_pointer_and_line(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][2].__setitem__("role", "baseline"))
    found = only(static_findings(package_dir), "IV105")
    assert [f.pointer for f in found] == ["/runs/2/role"]
    text = (package_dir / "manifest.json").read_text().splitlines()
    assert '"baseline"' in text[found[0].line - 1]


def test_naive_timestamp_is_IV105_saying_the_expected_form_not_the_regex(package_dir):
    edit_manifest(package_dir, lambda m: m.__setitem__("created_at", "2026-11-20 08:00:00"))
    found = only(static_findings(package_dir), "IV105")
    assert [f.pointer for f in found] == ["/created_at"]
    assert "an RFC 3339 time such as 2026-11-20T08:00:00Z" in found[0].message and "[0-9]" not in found[0].message


def test_a_stop_time_in_stops_json_is_said_in_words_too(package_dir):
    edit_json(package_dir, "stops.json", lambda s: s["stops"][0].__setitem__("at", "yesterday"))
    found = [f for f in only(static_findings(package_dir), "IV105") if f.path == "stops.json"]
    assert found and "'yesterday' is not an RFC 3339 time" in found[0].message, [f.message for f in found]


def test_unsafe_id_is_said_in_words(package_dir):
    edit_manifest(package_dir, lambda m: m.__setitem__("campaign_id", "my campaign"))
    (finding,) = [f for f in only(static_findings(package_dir), "IV105") if f.pointer == "/campaign_id"]
    assert "is not an id of letters, digits" in finding.message and "^[A-Za-z0-9]" not in finding.message


def test_run_id_unsafe_as_a_file_name_is_IV105(package_dir):
    edit_manifest(package_dir, lambda m: m["runs"][0].__setitem__("id", "../lora"))
    assert "/runs/0/id" in [f.pointer for f in only(static_findings(package_dir), "IV105")]


def test_params_without_seed_is_IV105(package_dir):
    rel = load_json(package_dir, "manifest.json")["runs"][1]["params"]
    edit_json(package_dir, rel, lambda p: p.pop("seed"))
    refresh_hashes(package_dir)
    found = only(static_findings(package_dir), "IV105")
    assert [(f.path, f.pointer) for f in found] == [(rel, "")]


def test_unknown_loader_in_reload_json_is_IV105(package_dir):
    edit_json(package_dir, "reload.json", lambda r: r["artifacts"]["control-model"].__setitem__("loader", "pickle"))
    assert "/artifacts/control-model/loader" in [f.pointer for f in only(static_findings(package_dir), "IV105")]


def test_unknown_extra_fields_are_allowed(package_dir):
    edit_manifest(package_dir, lambda m: m.__setitem__("x-team", {"owner": "alice"}))
    edit_json(package_dir, "stops.json", lambda s: s.__setitem__("x-note", "nothing"))
    assert not only(static_findings(package_dir), "IV105")


def test_artifact_path_that_does_not_exist_is_IV106(package_dir):
    edit_manifest(package_dir, lambda m: m["artifacts"][0].__setitem__("path", "artifacts/nowhere"))
    found = only(static_findings(package_dir), "IV106")
    assert [f.pointer for f in found] == ["/artifacts/0/path"]


def test_missing_error_analysis_is_IV106(package_dir):
    rel = load_json(package_dir, "manifest.json")["decision"]["error_analysis"]
    (package_dir / rel).unlink()
    assert ["/decision/error_analysis"] == [f.pointer for f in only(static_findings(package_dir), "IV106")]


def test_every_finding_is_reported_not_only_the_first(package_dir):
    (package_dir / "stops.json").unlink()
    (package_dir / "artifacts" / "control-model" / "empty.txt").write_bytes(b"")
    edit_manifest(package_dir, lambda m: (m["runs"][1].__setitem__("role", "baseline"),
                                          m["artifacts"][0].__setitem__("path", "artifacts/nowhere")))
    assert {"IV101", "IV102", "IV105", "IV106"} <= codes(static_findings(package_dir))


def test_select_and_ignore_by_prefix(package_dir):
    (package_dir / "stops.json").unlink()
    (package_dir / "artifacts" / "control-model" / "empty.txt").write_bytes(b"")
    assert codes(static_findings(package_dir, select=("IV101",))) == {"IV101"}
    assert "IV101" not in codes(static_findings(package_dir, ignore=("IV10",)))
