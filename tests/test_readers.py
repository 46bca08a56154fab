"""The streaming readers: facts about metrics, eval ids and predictions files, never findings."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from itera_verify.package import linerecords, readers
from tests.helpers import context


def _package(tmp_path, files: dict[str, str | bytes]):
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return context(tmp_path)


def test_jsonl_nan_and_infinity_tokens_are_nonfinite_values(tmp_path):
    package = _package(tmp_path, {"m.jsonl": '{"step": 1, "name": "loss", "value": NaN}\n'
                                             '{"step": 2, "name": "loss", "value": Infinity}\n'
                                             '{"step": 3, "name": "loss", "value": -Infinity}\n'
                                             '{"step": 4, "name": "loss", "value": 1.5}\n'})
    scan = readers.scan_metrics(package, "m.jsonl")
    assert scan.records == 4 and scan.errors == []
    values = [v for _, v, _ in scan.series["loss"]]
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf and values[3] == 1.5
    assert [step for step, _, _ in scan.nonfinite("loss")] == [1, 2, 3]


def test_jsonl_line_that_does_not_parse_gives_line_and_column(tmp_path):
    package = _package(tmp_path, {"m.jsonl": '{"step": 1, "name": "loss", "value": 1}\n'
                                             '\n'
                                             '{"step": 2, "name": "loss", "value": }\n'})
    scan = readers.scan_metrics(package, "m.jsonl")
    assert scan.records == 1
    assert len(scan.errors) == 1 and scan.error_count == 1
    error = scan.errors[0]
    assert error.line == 3 and error.column == 38 and "invalid JSON" in error.message


def test_metrics_record_with_wrong_types_is_an_error(tmp_path):
    package = _package(tmp_path, {"m.jsonl": '{"step": "1", "name": "loss", "value": 1}\n'
                                             '{"step": 1, "name": 7, "value": 1}\n'
                                             '{"step": 1, "name": "loss", "value": "1.0"}\n'
                                             '{"step": true, "name": "loss", "value": 1}\n'
                                             '[1, "loss", 1]\n'})
    scan = readers.scan_metrics(package, "m.jsonl")
    assert scan.records == 0
    assert [e.line for e in scan.errors] == [1, 2, 3, 4, 5]
    assert "step must be an integer" in scan.errors[0].message
    assert "name must be" in scan.errors[1].message
    assert "value must be a number" in scan.errors[2].message


def test_csv_metrics_read_nan_and_infinity(tmp_path):
    package = _package(tmp_path, {"m.csv": "step,name,value\n1,loss,2.5\n2,loss,NaN\n3,loss,Infinity\n"
                                           "4,loss,-Infinity\n\n5,f1,0.7\n"})
    scan = readers.scan_metrics(package, "m.csv")
    assert scan.format == "csv" and scan.records == 5 and scan.errors == []
    assert [s for s, _, _ in scan.nonfinite("loss")] == [2, 3, 4]
    assert scan.series["f1"] == [(5, 0.7, 7)]


def test_csv_with_header_only_is_flagged_header_only(tmp_path):
    package = _package(tmp_path, {"m.csv": "step,name,value\n"})
    scan = readers.scan_metrics(package, "m.csv")
    assert scan.header_only and scan.records == 0 and not scan.errors


def test_csv_with_wrong_header_is_an_error_at_line_1(tmp_path):
    package = _package(tmp_path, {"m.csv": "epoch,metric,score\n1,loss,2\n"})
    scan = readers.scan_metrics(package, "m.csv")
    assert scan.records == 0 and scan.errors[0].line == 1 and "step,name,value" in scan.errors[0].message


def test_csv_row_with_bad_step_or_value_is_an_error(tmp_path):
    package = _package(tmp_path, {"m.csv": "step,name,value\n1.5,loss,2\n2,loss,high\n3,loss\n4,loss,1\n"})
    scan = readers.scan_metrics(package, "m.csv")
    assert scan.records == 1 and [e.line for e in scan.errors] == [2, 3, 4]


def test_blank_only_file_is_blank_only(tmp_path):
    package = _package(tmp_path, {"m.jsonl": "\n  \n\n"})
    scan = readers.scan_metrics(package, "m.jsonl")
    assert scan.blank_only and scan.records == 0 and not scan.errors


def test_last_value_is_at_the_highest_step_not_the_last_line(tmp_path):
    package = _package(tmp_path, {"m.jsonl": "".join(json.dumps(r) + "\n" for r in [
        {"step": 10, "name": "f1", "value": 0.8}, {"step": 2, "name": "f1", "value": 0.1}])})
    scan = readers.scan_metrics(package, "m.jsonl")
    assert scan.last("f1") == (10, 0.8, 1)
    assert scan.last("absent") is None


def test_scans_are_memoised_per_package(tmp_path):
    package = _package(tmp_path, {"m.jsonl": '{"step": 1, "name": "loss", "value": 1}\n'})
    assert readers.scan_metrics(package, "m.jsonl") is readers.scan_metrics(package, "m.jsonl")
    assert readers.scan_metrics(package, "absent.jsonl") is None


def test_eval_ids_ignore_blank_lines_and_report_duplicates(tmp_path):
    package = _package(tmp_path, {"ids.txt": "a\n\n b \nc\r\na\nc\na\n"})
    ids = readers.read_eval_ids(package, "ids.txt")
    assert ids.ids == ["a", "b", "c", "a", "c", "a"]
    assert ids.duplicate_count == 3 and ids.duplicates == ["a", "c"] and ids.unique_count == 3


def _predictions(ids):
    return "".join(json.dumps({"id": i, "prediction": "x"}) + "\n" for i in ids)


def test_predictions_coverage_counts_and_first_five(tmp_path):
    eval_ids = [f"e{i}" for i in range(20)]
    predicted = eval_ids[8:] + ["e8", "e9", "zz1", "zz2", "zz1"]
    body = _predictions(predicted) + '{"prediction": "no id"}\n{"id": 5, "prediction": "int id"}\nnot json\n'
    package = _package(tmp_path, {"ids.txt": "\n".join(eval_ids) + "\n", "p.jsonl": body})
    scan = readers.scan_predictions(package, "p.jsonl", readers.read_eval_ids(package, "ids.txt"))
    assert scan.records == len(predicted) + 2
    assert scan.missing_count == 8 and scan.missing == ["e0", "e1", "e2", "e3", "e4"]
    assert scan.duplicate_count == 2 and [d[0] for d in scan.duplicates] == ["e8", "e9"]
    assert scan.duplicates[0][1] == 13  # the line of the first repeat
    assert scan.unexpected_count == 3 and [u[0] for u in scan.unexpected] == ["zz1", "zz2"]
    assert scan.without_id_count == 2 and scan.without_id_lines == [18, 19]
    assert [e.line for e in scan.errors] == [20]
    assert not scan.covers_exactly and scan.first_problem_line == 13


def test_predictions_that_cover_exactly(tmp_path):
    package = _package(tmp_path, {"ids.txt": "a\nb\n", "p.jsonl": _predictions(["b", "a"])})
    scan = readers.scan_predictions(package, "p.jsonl", readers.read_eval_ids(package, "ids.txt"))
    assert scan.covers_exactly and scan.records == 2 and scan.missing_count == 0


def test_predictions_without_eval_ids_only_parse(tmp_path):
    package = _package(tmp_path, {"p.jsonl": _predictions(["a", "a"]) + "{oops\n"})
    scan = readers.scan_predictions(package, "p.jsonl", None)
    assert scan.records == 2 and scan.duplicate_count == 0 and scan.errors[0].line == 3


def _predictions_peak(tmp_path, records: int) -> tuple[int, int]:
    lines = (json.dumps({"id": f"other-{i:06d}", "prediction": "positive", "label": "negative"})
             for i in range(records))
    folder = tmp_path / str(records)
    package = _package(folder, {"ids.txt": "\n".join(f"e{i}" for i in range(10)) + "\n",
                                "p.jsonl": "\n".join(lines) + "\n"})
    eval_ids = readers.read_eval_ids(package, "ids.txt")
    tracemalloc.start()
    try:
        scan = readers.scan_predictions(package, "p.jsonl", eval_ids)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert scan.records == records and scan.unexpected_count == records and len(scan.unexpected) == 5
    return peak, (folder / "p.jsonl").stat().st_size


def test_predictions_scan_memory_does_not_grow_with_the_file(tmp_path):
    """50 000 then 200 000 records against 10 eval ids: the scan must not hold the records."""
    small_peak, _ = _predictions_peak(tmp_path, 50_000)
    large_peak, large_size = _predictions_peak(tmp_path, 200_000)
    assert large_peak < 1.5 * small_peak, f"peak grew from {small_peak} to {large_peak} bytes with the file"
    assert large_peak < large_size / 10, f"peak {large_peak} bytes for a {large_size}-byte file"


def test_generic_csv_and_jsonl(tmp_path):
    package = _package(tmp_path, {"a.csv": "x,y\n1,2\n3\n", "b.csv": "x,y\n", "c.jsonl": "[1]\n{bad\n"})
    a, b, c = (readers.scan_generic(package, rel) for rel in ("a.csv", "b.csv", "c.jsonl"))
    assert a.records == 1 and a.errors[0].line == 3
    assert b.header_only and b.records == 0
    assert c.records == 1 and c.errors[0].line == 2


def test_a_file_with_many_bad_lines_keeps_a_bounded_error_list(tmp_path):
    package = _package(tmp_path, {"m.jsonl": "nope\n" * (linerecords.MAX_KEPT_ERRORS + 50)})
    scan = readers.scan_metrics(package, "m.jsonl")
    assert len(scan.errors) == linerecords.MAX_KEPT_ERRORS and scan.error_count == linerecords.MAX_KEPT_ERRORS + 50


def test_absurd_numbers_are_line_errors_not_crashes(tmp_path):
    package = _package(tmp_path, {"m.jsonl": '{"step": 1' + "0" * 30 + ', "name": "loss", "value": 1}\n'
                                             '{"step": 1, "name": "loss", "value": 1' + "0" * 400 + '}\n'
                                             '{"step": 1, "name": "loss", "value": 1' + "0" * 5000 + '}\n'
                                             '{"step": 2, "name": "loss", "value": 1e400}\n',
                                  "m.csv": "step,name,value\n" + "9" * 30 + ",loss,1\n" + "9" * 5000 + ",loss,1\n"})
    scan = readers.scan_metrics(package, "m.jsonl")
    assert [e.line for e in scan.errors] == [1, 2, 3] and scan.records == 1
    assert scan.series["loss"] == [(2, math.inf, 4)]  # 1e400 reads as Infinity, like the token
    assert [e.line for e in readers.scan_metrics(package, "m.csv").errors] == [2, 3]
    assert all(len(e.message) < 250 for e in scan.errors)


# ---- the block validator (simdjson) must agree with the line-by-line json.loads path exactly ----------------

_LINES = [b'{"id": "ex-1", "x": [1, 2.5, -3e2]}', b"[]", b'"text"', b"  {\"a\": null}  ", b"", b"   ", b"\r",
          b"NaN", b'{"v": Infinity}', b"1" + b"0" * 30, b"{bad", b'{"a": 1} {"b": 2}', b'"\\ud800"', b"1e400",
          b"\xff\xfe", b"\xef\xbb\xbf[1]", b'{"a":', b"1}", b"[" * 20 + b"]" * 20, b'"caf\xc3\xa9"', b"tru"]


_SIMDJSON = linerecords._validator


def _both_paths(tmp_path, monkeypatch, content: bytes):
    """(records, blank_only, errors) through the fast path and through json.loads alone."""
    results = []
    for validator in (_SIMDJSON, lambda: None):
        monkeypatch.setattr(linerecords, "_validator", validator)
        scan = readers.scan_generic(_package(tmp_path, {"g.jsonl": content}), "g.jsonl")
        results.append((scan.records, scan.blank_only, scan.error_count, scan.errors))
    return results


def test_block_validation_agrees_with_json_loads_line_by_line(tmp_path, monkeypatch):
    from hypothesis import HealthCheck, given, settings, strategies as st

    assert linerecords._validator() is not None, "pysimdjson is a dependency"

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.sampled_from(_LINES), max_size=30), st.sampled_from([b"\n", b"\r\n"]), st.booleans())
    def agree(lines, newline, trailing):
        content = newline.join(lines) + (newline if trailing and lines else b"")
        fast, slow = _both_paths(tmp_path, monkeypatch, content)
        assert fast == slow, content

    agree()


# Runs of lines that are not JSON alone but join into a valid array with as many values as lines: "[1", "2]",
# "3, 4" is "[[1, 2], 3, 4]". Each line is what its consumer (a JSONL reader) parses, so each is judged alone.
_STRADDLING = [(b"[1", b"2]", b"3, 4"), (b'{"a": 1', b'"b": 2}', b'{"h": 1}, {"i": 2}'),
               (b'{"c": [1', b"2]}", b"3, 4"), (b'{"d": {"e": 1', b'"f": 2}}', b"[], {}"),
               (b'[{"g": 1', b"{}]", b'"x", "y"'), (b"3, 4", b"[1", b"2]")]


def _line_by_line(content: bytes):
    """What a JSONL reader that parses each line alone finds: (records, blank_only, errors, values)."""
    values, errors = [], []
    for number, raw in enumerate(content.split(b"\n"), 1):
        raw = raw.rstrip(b"\r")
        if number == 1 and raw.startswith(linerecords.BOM):
            raw = raw[3:]
        if not raw.strip():
            continue
        value, error = linerecords._parse_json_line(raw)
        if error:
            errors.append((number, *error))
        else:
            values.append((number, value))
    return len(values), not values and not errors, errors, values


def test_every_line_is_judged_alone_even_where_the_lines_join_into_a_valid_array(tmp_path, monkeypatch):
    """The block check (simdjson) and the json.loads batches parse many lines at once; a line that straddles
    into the next (a value left open) must still be the error a line-by-line reader sees, and every value read
    must be the one on its own line."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.sampled_from([(line,) for line in _LINES] + _STRADDLING), max_size=16),
           st.sampled_from([b"\n", b"\r\n"]))
    def judged_alone(runs, newline):
        content = newline.join(line for run in runs for line in run)
        records, blank_only, errors, values = _line_by_line(content)
        for validator in (_SIMDJSON, lambda: None):
            monkeypatch.setattr(linerecords, "_validator", validator)
            scan = readers.scan_generic(_package(tmp_path, {"g.jsonl": content}), "g.jsonl")
            assert (scan.records, scan.blank_only, [(e.line, e.column, e.message) for e in scan.errors]) == \
                (records, blank_only, errors), content
        package = _package(tmp_path, {"p.jsonl": content})
        parsed = list(linerecords.parsed_lines(package, "p.jsonl"))
        assert [(n, v) for n, v, error in parsed if not error] == values, content
        assert [(n, *error) for n, _, error in parsed if error] == errors, content

    judged_alone()
    monkeypatch.setattr(linerecords, "_validator", _SIMDJSON)
    three = readers.scan_generic(_package(tmp_path, {"g.jsonl": b"[1\n2]\n3,4\n"}), "g.jsonl")
    assert (three.records, [e.line for e in three.errors]) == (0, [1, 2, 3])


def test_block_validation_across_block_boundaries_and_long_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(linerecords, "VALIDATE_BLOCK", 64)
    monkeypatch.setattr(linerecords, "LONG_LINE", 256)
    good = b'{"id": "ex-0001", "tokens": ["a", "b", "c"]}'
    content = b"\n".join([good] * 40 + [b"{bad"] + [good] * 5 + [b'"' + b"x" * 600 + b'"', b"[1,"] + [good] * 3)
    fast, slow = _both_paths(tmp_path, monkeypatch, content)
    assert fast == slow
    assert fast[0] == 49 and [e.line for e in fast[3]] == [41, 48]


def _split_everywhere(monkeypatch) -> list:
    """Every generic JSONL validated in two processes (a helper forked for its second half), on any machine;
    the list fills with one entry per helper forked."""
    forked = []
    real = linerecords.Forked
    monkeypatch.setattr(linerecords, "SPLIT_BYTES", 1)
    monkeypatch.setattr(linerecords, "worker_count", lambda threads: 2)
    monkeypatch.setattr(linerecords, "Forked", lambda *a, **k: forked.append(a) or real(*a, **k))
    return forked


def _two_processes(tmp_path, content: bytes):
    """(records, blank_only, error count, errors) of a generic JSONL, split where _split_everywhere says so."""
    scan = readers.scan_generic(_package(tmp_path, {"g.jsonl": content}), "g.jsonl")
    return scan.records, scan.blank_only, scan.error_count, scan.errors


def _one_process(tmp_path, monkeypatch, content: bytes):
    """The same through json.loads line by line, in this process alone (no simdjson, so no split)."""
    with monkeypatch.context() as patched:
        patched.setattr(linerecords, "_validator", lambda: None)
        return _two_processes(tmp_path, content)


def test_a_large_jsonl_split_over_two_processes_agrees_with_json_loads_line_by_line(tmp_path):
    """The helper's half is numbered from its own first line, then moved past this process's lines: every error
    keeps the line and column the one-process path gives, the records and the blank-only verdict add up, and a
    byte-order mark counts only on the file's first line (not on the helper's).

    Run in a fresh interpreter: each example forks a helper, and a fork of a test worker that earlier tests filled
    with torch and the rest costs 50-100 ms, against 2 ms from an interpreter holding only what this needs (the
    test took 13-18 s in a full run, 1.7 s alone)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "validator"), str(root)])}
    done = subprocess.run([sys.executable, "-c", "import sys; from tests.test_readers import split_property; "
                           "split_property(sys.argv[1])", str(tmp_path)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert done.stdout.startswith("helpers forked in "), done.stdout


def split_property(folder: str) -> None:
    """The property of the test above, in the process that runs it (a fresh interpreter)."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    tmp_path = Path(folder)
    with pytest.MonkeyPatch.context() as monkeypatch:
        forked = _split_everywhere(monkeypatch)

        @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(st.lists(st.sampled_from(_LINES), min_size=2, max_size=24), st.sampled_from([b"\n", b"\r\n"]),
               st.booleans())
        def agree(lines, newline, trailing):
            content = newline.join(lines) + (newline if trailing else b"")
            before = len(forked)
            assert _two_processes(tmp_path, content) == _one_process(tmp_path, monkeypatch, content), content
            # A helper exactly where a newline past the middle leaves it a line to take (linerecords._halfway).
            cut = content.find(b"\n", len(content) // 2)
            splits = 0 <= cut < len(content) - 1
            assert len(forked) - before == int(splits), content
            runs.append(splits)

        runs: list[bool] = []
        agree()
    assert sum(runs) >= len(runs) // 2 and sum(runs) >= 30, f"the helper was forked in {sum(runs)} of {len(runs)}"
    print(f"helpers forked in {sum(runs)} of {len(runs)} examples")


def test_the_split_holds_across_blocks_long_lines_and_the_error_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(linerecords, "VALIDATE_BLOCK", 64)
    monkeypatch.setattr(linerecords, "LONG_LINE", 256)
    forked = _split_everywhere(monkeypatch)
    good = b'{"id": "ex-0001", "tokens": ["a", "b", "c"]}'
    content = b"\n".join([good] * 40 + [b"{bad"] + [good] * 45 + [b'"' + b"x" * 600 + b'"', b"[1,"] + [good] * 3
                         + [b"nope"] * (linerecords.MAX_KEPT_ERRORS + 50) + [good])
    split = _two_processes(tmp_path, content)
    assert split == _one_process(tmp_path, monkeypatch, content) and forked
    records, _, error_count, errors = split
    assert records == 40 + 45 + 1 + 3 + 1 and error_count == linerecords.MAX_KEPT_ERRORS + 52
    assert [e.line for e in errors[:3]] == [41, 88, 92] and len(errors) == linerecords.MAX_KEPT_ERRORS


def test_a_helper_that_dies_leaves_its_half_to_this_process(tmp_path, monkeypatch):
    """Killed, out of memory: its half is validated here, and the outcome is the same."""
    import os

    forked = _split_everywhere(monkeypatch)
    parent, real = os.getpid(), linerecords._validate_range

    def dies_in_the_helper(*args, **kwargs):
        if os.getpid() != parent:
            os._exit(9)
        return real(*args, **kwargs)

    monkeypatch.setattr(linerecords, "_validate_range", dies_in_the_helper)
    content = b"\n".join([b'{"a": 1}'] * 30 + [b"{bad"] + [b"[2]"] * 30 + [b"oops", b""])
    assert _two_processes(tmp_path, content) == _one_process(tmp_path, monkeypatch, content) and forked
    assert [e.line for e in _two_processes(tmp_path, content)[3]] == [31, 62]


def test_a_helper_gives_way_to_a_long_line_in_its_half(tmp_path, monkeypatch):
    """json.loads of a line of LONG_LINE bytes or more takes many times its size: that belongs in the process
    whose memory an audit watches, so the helper hands its half back and this process validates it."""
    import os

    monkeypatch.setattr(linerecords, "VALIDATE_BLOCK", 64)
    monkeypatch.setattr(linerecords, "LONG_LINE", 256)
    forked = _split_everywhere(monkeypatch)
    here, real = [], linerecords._validate_range

    def recorded(parser, fd, start, *args, **kwargs):
        here.append((os.getpid(), start))  # the helper's own calls stay in its copy of the list
        return real(parser, fd, start, *args, **kwargs)

    monkeypatch.setattr(linerecords, "_validate_range", recorded)
    good = b'{"id": "ex-0001", "tokens": ["a", "b", "c"]}'
    content = b"\n".join([good] * 60 + [b"{bad"] + [good] * 30 + [b'"' + b"x" * 600 + b'"', b"[1,", good])
    assert _two_processes(tmp_path, content) == _one_process(tmp_path, monkeypatch, content) and forked
    assert any(pid == os.getpid() and start > 0 for pid, start in here), "the tail was not validated here"


def test_a_helper_dies_with_the_check_that_forked_it_and_holds_none_of_its_pipes(tmp_path, monkeypatch):
    """A check child killed (the kernel's out-of-memory killer, a cancel) takes its helper with it, and the
    top process learns of the death at once: the helper does not hold the check child's result pipe open."""
    import os
    import signal
    import time

    from itera_verify.runtime.launcher import ChildLost, Forked

    _split_everywhere(monkeypatch)
    top, real, helper_pid = os.getpid(), linerecords._validate_range, tmp_path / "helper.pid"

    def slow_helper_and_a_dying_check(parser, fd, start, *args, **kwargs):
        if start > 0:  # the helper's half: a long one
            helper_pid.write_text(str(os.getpid()))
            time.sleep(30)
        elif os.getpid() != top:  # the check child, once its helper runs
            while not helper_pid.exists():
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(parser, fd, start, *args, **kwargs)

    monkeypatch.setattr(linerecords, "_validate_range", slow_helper_and_a_dying_check)
    package = _package(tmp_path, {"g.jsonl": b"[1]\n" * 1000})
    check = Forked(lambda: readers.scan_generic(package, "g.jsonl").records)
    began = time.monotonic()
    with pytest.raises(ChildLost):
        check.result()
    assert time.monotonic() - began < 15, "the helper held the check child's result pipe open"
    pid, deadline = int(helper_pid.read_text()), time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the helper {pid} outlived the check that forked it")


def test_where_no_helper_can_be_forked_this_process_validates_the_whole_file(tmp_path, monkeypatch):
    """The tool's own threads run (a seal beside the checks): fork is refused, and nothing is left out."""
    from itera_verify.runtime.launcher import ForkAfterThreads

    _split_everywhere(monkeypatch)

    def refused(*args, **kwargs):
        raise ForkAfterThreads("fork refused: the tool's threads seal-reader are running")

    monkeypatch.setattr(linerecords, "Forked", refused)
    content = b"\n".join([b'{"a": 1}'] * 30 + [b"{bad"] + [b"[2]"] * 30 + [b"oops"])
    assert _two_processes(tmp_path, content) == _one_process(tmp_path, monkeypatch, content)
    assert _two_processes(tmp_path, content)[0] == 60


def test_a_clean_large_jsonl_is_validated_without_line_by_line_parsing(tmp_path, monkeypatch):
    """The clean case never reaches json.loads: the speed of a large generic JSONL comes from here."""
    calls = []
    monkeypatch.setattr(linerecords, "_parse_json_line", lambda raw: calls.append(raw) or (None, None))
    monkeypatch.setattr(linerecords.json, "loads", lambda *a, **k: calls.append(a) or [])
    content = b"".join(b'{"id": "ex-%05d", "logits": [0.1, -2.5]}\n' % i for i in range(50_000))
    scan = readers.scan_generic(_package(tmp_path, {"g.jsonl": content}), "g.jsonl")
    assert (scan.records, scan.error_count, calls) == (50_000, 0, [])


def test_line_blocks_end_at_line_ends_and_bound_the_unfinished_line():
    """The shared reader of validate_jsonl and the temporary-path search: the pieces are the file, a whole piece
    ends a line, a part of a line holds no newline, and no piece holds more than a read and the bound."""
    import io

    from hypothesis import given, settings, strategies as st

    from itera_verify.package.lineblocks import line_blocks

    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.sampled_from([b"a", b"bcd", b"\n", b"\r\n", b"e" * 40]), max_size=80).map(b"".join),
           st.integers(1, 16), st.integers(1, 48))
    def holds(content, size, bound):
        pieces = list(line_blocks(io.BytesIO(content), size, bound))
        assert b"".join(data for data, _ in pieces) == content
        for index, (data, whole) in enumerate(pieces):
            assert len(data) < size + bound
            if whole:
                assert data.endswith(b"\n") or index == len(pieces) - 1
            else:
                assert b"\n" not in data and len(data) >= bound and index < len(pieces) - 1
        assert not pieces or pieces[-1][1]

    holds()


@pytest.mark.parametrize("text", ["", " ", "{}", " {} ", "\n[1,2]\n\t", '{"a":1} x', '{"a":1}  ]', "\ufeff{}",
                                  '{"a":', "nul", "1 2", '"s"', " \u00a0{}", "{} \u00a0", "NaN", "[1e999]",
                                  '{"a":\n1}', '\r\n{"x": [1, {"y": null}]}\r\n', '{"a":1}\n\n{"b":2}', "01", "[1,]",
                                  '"\\ud800"', "9" * 5000])
def test_documents_parse_exactly_as_json_loads_with_the_same_errors(text):
    """Package documents skip json.loads' whitespace regexes: the values, and every error's message and place
    (what IV104 reports), must stay those of json.loads."""
    from itera_verify.package import loads_json

    def outcome(parse):
        try:
            return "value", parse(text)
        except json.JSONDecodeError as exc:
            return "error", exc.msg, exc.pos, exc.lineno, exc.colno
        except ValueError as exc:  # an integer past Python's digit limit
            return "value-error", str(exc)

    assert repr(outcome(loads_json)) == repr(outcome(json.loads))
