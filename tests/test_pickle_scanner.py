"""The static pickle scanner (IV506): real torch files pass, every way of smuggling a call is caught, and
nothing is ever unpickled to find out."""
from __future__ import annotations

import functools
import io
import os
import pickle
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.artifacts import malicious_pickle, tiny_gpt2
from itera_verify.package.pickles import is_pickle_or_torch_zip, scan_file
from tests.helpers import codes, static_findings, context

SHORT_BINUNICODE, MEMOIZE, BINGET, STACK_GLOBAL = b"\x8c", b"\x94", b"h", b"\x93"


def _unicode(text: str) -> bytes:
    return SHORT_BINUNICODE + bytes([len(text)]) + text.encode()


# --- real files that must pass -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("torch-files")
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               folder / "rng_state.pth")
    torch.save(model.state_dict(), folder / "state_dict.pt")
    torch.save(model.state_dict(), folder / "legacy.bin", _use_new_zipfile_serialization=False)
    return folder


@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state.pth", "state_dict.pt", "legacy.bin"])
def test_real_torch_file_passes_the_allowlist(torch_files, name):
    result = scan_file(torch_files / name)
    assert result.is_pickle and result.unsafe == [] and result.error is None and result.loadable
    assert any(g.startswith("torch.") for g in result.globals)


def test_rng_state_needs_exactly_the_numpy_globals(torch_files):
    numpy_globals = {g for g in scan_file(torch_files / "rng_state.pth").globals if g.startswith("numpy")}
    assert numpy_globals and numpy_globals <= {"numpy._core.multiarray._reconstruct", "numpy.ndarray",
                                               "numpy.dtype", "numpy.dtypes.UInt32DType"}


def test_training_args_bin_is_inert_config_scanned_never_loadable(built):
    result = scan_file(Path(built["package"]) / "checkpoints/control/checkpoint-4/training_args.bin")
    assert "transformers.training_args.TrainingArguments" in result.globals
    assert result.unsafe == [] and result.category == "inert-config" and not result.loadable


def test_transformers_class_outside_training_args_is_unsafe(tmp_path):
    path = tmp_path / "optimizer.pt"
    path.write_bytes(b"\x80\x02ctransformers.training_args\nTrainingArguments\n)\x81.")
    assert scan_file(path).unsafe == ["transformers.training_args.TrainingArguments"]


# --- payloads that must be caught -----------------------------------------------------------------------

def _scan_bytes(tmp_path: Path, data: bytes, name: str = "payload.pkl"):
    path = tmp_path / name
    path.write_bytes(data)
    return scan_file(path)


@pytest.mark.parametrize("via,fmt,expected", [("system", "pickle", "posix.system"), ("open", "pickle", "io.open"),
                                               ("system", "torch", "posix.system"), ("open", "torch", "io.open")])
def test_fixture_payloads_are_flagged(tmp_path, via, fmt, expected):
    marker = tmp_path / "marker"
    result = scan_file(malicious_pickle(tmp_path / "model.pt", marker, via=via, fmt=fmt))
    assert result.unsafe == [expected] and not result.loadable
    assert not marker.exists()


def test_global_os_system_protocol_0(tmp_path):
    assert _scan_bytes(tmp_path, b"cos\nsystem\n(S'touch x'\ntR.").unsafe == ["os.system"]


def test_stack_global_through_the_memo_cannot_hide(tmp_path):
    # Strings memoised early, decoy allowlisted names pushed and dropped, the real ones fetched back.
    data = (b"\x80\x04" + _unicode("builtins") + MEMOIZE + _unicode("eval") + MEMOIZE + b"00"
            + _unicode("collections") + _unicode("OrderedDict") + b"00"
            + BINGET + b"\x00" + BINGET + b"\x01" + STACK_GLOBAL + _unicode("1") + b"\x85R.")
    assert _scan_bytes(tmp_path, data).unsafe == ["builtins.eval"]


def test_stack_global_with_computed_name_is_unsafe(tmp_path):
    data = b"\x80\x04" + _unicode("torch") + b"N" + STACK_GLOBAL + b"."
    assert _scan_bytes(tmp_path, data).unsafe == ["<name computed at load time>"]


def test_inst_protocol_0(tmp_path):
    assert _scan_bytes(tmp_path, b"(S'1'\nibuiltins\neval\n.").unsafe == ["builtins.eval"]


def test_obj_protocol_1(tmp_path):
    assert _scan_bytes(tmp_path, b"(cbuiltins\neval\nS'1'\no.").unsafe == ["builtins.eval"]


def test_reduce_to_builtins_eval(tmp_path):
    class Payload:
        def __reduce__(self):
            return eval, ("1",)

    assert _scan_bytes(tmp_path, pickle.dumps(Payload(), protocol=4)).unsafe == ["builtins.eval"]


def test_functools_partial(tmp_path):
    result = _scan_bytes(tmp_path, pickle.dumps(functools.partial(print, "x"), protocol=4))
    assert "functools.partial" in result.unsafe and "builtins.print" in result.unsafe


@pytest.mark.parametrize("module,name", [("torch", "load"), ("pickle", "loads"), ("torch.storage", "_load_from_bytes"),
                                         ("runpy", "run_path"), ("subprocess", "Popen")])
def test_loaders_as_called_globals(tmp_path, module, name):
    data = f"c{module}\n{name}\n(S'x'\ntR.".encode()
    assert _scan_bytes(tmp_path, data).unsafe == [f"{module}.{name}"]


def test_dotted_name_cannot_walk_out_of_an_allowed_class(tmp_path):
    data = b"\x80\x04" + _unicode("collections") + _unicode("OrderedDict.__init__.__globals__") + STACK_GLOBAL + b"."
    assert _scan_bytes(tmp_path, data).unsafe == ["collections.OrderedDict.__init__.__globals__"]


def test_second_stream_of_a_legacy_file_is_scanned(tmp_path):
    data = pickle.dumps(1, protocol=2) + b"\x80\x02cos\nsystem\n."
    assert _scan_bytes(tmp_path, data, "legacy.bin").unsafe == ["os.system"]


def test_nested_pickle_inside_a_zip_format_torch_file(tmp_path):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as archive:
        archive.writestr("inner/data.pkl", b"\x80\x02cposix\nsystem\n.")
    outer = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(2)}, outer)
    with zipfile.ZipFile(outer, "a") as archive:
        archive.writestr("model/extra/inner.pt", inner.getvalue())
        archive.writestr("model/extra/helper.pkl", b"\x80\x02cbuiltins\nexec\n.")
    result = scan_file(outer)
    assert result.unsafe == ["builtins.exec", "posix.system"]


def test_numpy_object_array_in_npz_is_scanned(tmp_path):
    path = tmp_path / "arrays.npz"
    np.savez(path, a=np.array([functools.partial(print)], dtype=object))
    assert "functools.partial" in scan_file(path).unsafe


def test_truncated_pickle_is_unscannable_and_never_loadable(torch_files, tmp_path):
    path = tmp_path / "optimizer.pt"
    path.write_bytes((torch_files / "optimizer.pt").read_bytes()[:300])
    result = scan_file(path)
    assert result.is_pickle and result.error and not result.loadable


# --- not pickles ----------------------------------------------------------------------------------------

def test_image_renamed_pt_is_not_a_pickle(tmp_path):
    path = tmp_path / "weights.pt"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    result = scan_file(path)
    assert is_pickle_or_torch_zip(path) and not result.is_pickle and result.unsafe == [] and not result.loadable


def test_text_beginning_like_protocol_0_is_not_a_pickle(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("config: values\nsecond line\n")
    assert not scan_file(path).is_pickle


# --- through the rule -----------------------------------------------------------------------------------

def test_payload_anywhere_in_the_package_is_IV506(package_dir, tmp_path):
    marker = tmp_path / "marker"
    malicious_pickle(package_dir / "analysis/notes.pkl", marker)  # a file no artifact uses
    findings = [f for f in static_findings(package_dir) if f.code == "IV506"]
    assert [(f.path, "posix.system" in f.message) for f in findings] == [("analysis/notes.pkl", True)]
    assert not marker.exists()


def test_payload_in_a_checkpoint_names_its_run(package_dir, tmp_path):
    malicious_pickle(package_dir / "checkpoints/control/checkpoint-4/optimizer.pt", tmp_path / "m", fmt="torch")
    (finding,) = [f for f in static_findings(package_dir) if f.code == "IV506"]
    assert (finding.run, finding.artifact) == ("control", "control-resume")


def test_clean_package_and_renamed_image_have_no_IV506(package_dir):
    (package_dir / "analysis/figure.pt").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    assert "IV506" not in codes(static_findings(package_dir))


def test_a_pickle_named_json_is_found_from_the_bytes_the_path_rules_kept(package_dir):
    """The path rules read a .json document's bytes without parsing it (no "/" in it); the pickle sniff then
    takes its first bytes from memory instead of opening the file again, and still sees the pickle."""
    from itera_verify.rules import Selection, paths
    from itera_verify.flows.checks import run_checks

    class Payload:  # os.system("true"): no "/" anywhere in the pickle, which is never loaded here anyway
        def __reduce__(self):
            return os.system, ("true",)

    raw = pickle.dumps(Payload(), protocol=2)
    assert b"/" not in raw and b"\\" not in raw
    (package_dir / "analysis/table.json").write_bytes(raw)
    package = context(package_dir)
    list(paths.check(package))
    assert package.documents.parsed("analysis/table.json") is None
    assert package.documents.cached_head("analysis/table.json", 64) == raw[:64]  # kept by the path rules
    findings = [f for f in run_checks(package, Selection(), "static") if f.code == "IV506"]
    assert [f.path for f in findings] == ["analysis/table.json"] and "system" in findings[0].message
