"""Known ways to slip a payload past a pickle scanner, each written by hand in raw opcodes, each planted in a
copy of the example package. Every form must be IV506 — through the static checks and through the whole
command line, reloads included — and its payload must never run: each one creates a marker file when
unpickled, and the marker must never appear.

`test_every_form_is_a_live_payload` proves the corpus is real: a throwaway child process unpickles each form
(with `weights_only=False` for torch files) and the marker does appear there. A corpus of dead payloads
could not fail.
"""
from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.helpers import run_cli, static_findings

MEMOIZE, BINGET, STACK_GLOBAL = b"\x94", b"h", b"\x93"


def _u(text: str) -> bytes:
    """SHORT_BINUNICODE: a string pushed as a protocol-4 opcode."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def _s(text: str) -> bytes:
    """Protocol-0 STRING, quoted the way pickle reads it."""
    return b"S" + repr(text).encode() + b"\n"


def _touch(marker: Path) -> str:
    return f"touch {shlex.quote(str(marker))}"


def _open_call(marker: Path) -> bytes:
    """builtins.open(marker, 'w') in protocol 0: the simplest payload that leaves a trace."""
    return b"cbuiltins\nopen\n(" + _s(str(marker)) + _s("w") + b"tR"


# ---- the forms ---------------------------------------------------------------------------------------------
# name -> (file name in the package, builder(marker) -> bytes, the global IV506 must name)

def _memo_stack_global(m):
    # Module and name memoised, decoys pushed and dropped, the real ones fetched back for STACK_GLOBAL.
    return (b"\x80\x04" + _u("posix") + MEMOIZE + _u("system") + MEMOIZE + b"00" + _u("collections")
            + _u("OrderedDict") + b"00" + BINGET + b"\x00" + BINGET + b"\x01" + STACK_GLOBAL
            + _u(_touch(m)) + b"\x85R.")


def _inst(m):
    # I1 and POP first: a short first line, so this form tests INST itself, not the first-line length.
    return b"(I1\n0" + _s(_touch(m)) + b"iposix\nsystem\n."


def _long_first_line(m):
    # The same INST payload with a first line longer than a 64-byte sniff window.
    return b"(" + _s(_touch(m) + " #" + "x" * 80) + b"iposix\nsystem\n."


def _obj(m):
    return b"(cposix\nsystem\n" + _s(_touch(m)) + b"o."


def _global(module, name, args: bytes = b""):
    return lambda m: b"c" + module.encode() + b"\n" + name.encode() + b"\n(" + (args or _s(_touch(m))) + b"tR."


def _getattr_chain(m):
    # getattr(__import__('posix'), 'system')('touch m')
    return (b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(" + _s("posix") + b"tR" + _s("system") + b"tR("
            + _s(_touch(m)) + b"tR.")


def _pickle_in_pickle(loads_module):
    def build(m):
        inner = b"\x80\x02" + _open_call(m) + b"."
        return (b"\x80\x02c" + loads_module.encode() + b"\nloads\n(C" + bytes([len(inner)]) + inner + b"tR.")
    return build


def _partial(m):
    # functools.partial(posix.system, 'touch m')()
    return b"cfunctools\npartial\n(cposix\nsystem\n" + _s(_touch(m)) + b"tR)R."


def _run_code(m):
    code = f"open({str(m)!r}, 'w').close()"
    return b"crunpy\n_run_code\n(" + _s(code) + b"(dtR."


def _popen(m):
    return b"csubprocess\nPopen\n((" + _s("touch") + _s(str(m)) + b"ltR."


def _setstate(m):
    # An allowlisted OrderedDict whose BUILD state carries the payload: the global hides in the state.
    return b"\x80\x02ccollections\nOrderedDict\n)R}" + _s("x") + _open_call(m) + b"sb."


def _allowlisted_module_other_name(m):
    # torch._utils is allowlisted for its _rebuild_* functions; its `os` attribute is the os module.
    return (b"\x80\x02cbuiltins\ngetattr\n(ctorch._utils\nos\n" + _s("system") + b"tR(" + _s(_touch(m))
            + b"tR.")


def _dotted_walk(m):
    # Protocol 4 resolves dotted names attribute by attribute: from allowlisted torch._utils to os.system.
    return b"\x80\x04" + _u("torch._utils") + _u("os.system") + STACK_GLOBAL + _u(_touch(m)) + b"\x85R."


def _eval(m):
    return b"c__builtin__\neval\n(" + _s(f"open({str(m)!r}, 'w')") + b"tR."


def _torch_load(m):
    # torch.load(<a second payload file>, None, pickle): an explicit pickle_module turns weights_only off.
    return (b"\x80\x02ctorch\nload\n(" + _s(str(m) + ".inner.pt") + b"Nctorch.serialization\npickle\ntR.")


def _zip_torch(m):
    """A real torch.save zip whose data.pkl is replaced by the payload (tensor records kept beside it)."""
    import torch

    buffer = io.BytesIO()
    torch.save({"weight": torch.zeros(2, 2)}, buffer)
    source, out = zipfile.ZipFile(io.BytesIO(buffer.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/data.pkl"):
                data = b"\x80\x02" + _open_call(m) + b"."
            target.writestr(info, data)
    return out.getvalue()


def _zip_in_zip(m):
    """A torch zip inside a zip: the payload two archives deep."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as outer:
        outer.writestr("archive/inner.pt", _zip_torch(m))
    return out.getvalue()


def _no_proto_binary(m):
    # Protocol-4 opcodes with no PROTO header: the unpickler never checks, the first byte is not 0x80.
    return _u("posix") + _u("system") + STACK_GLOBAL + _u(_touch(m)) + b"\x85R."


def _proto0_leading_none(m):
    # Protocol 0 opening with NONE+POP instead of MARK or GLOBAL.
    return b"N0cposix\nsystem\n(" + _s(_touch(m)) + b"tR."


def _no_stop(m):
    # The payload runs before the unpickler notices the missing STOP.
    return b"cposix\nsystem\n(" + _s(_touch(m)) + b"tR"


def _proto_header_0(m):
    # PROTO with protocol 0: a 0x80 first byte that is not the usual 0x80 0x02..0x05, still loaded.
    return b"\x80\x00cposix\nsystem\n(" + _s(_touch(m)) + b"tR."


def _broken_after_the_call(m):
    # The payload runs, then an opcode no unpickler knows: a scanner that drops broken streams drops the name.
    return b"\x80\x02cposix\nsystem\n(" + _s(_touch(m)) + b"tR\xff\xff"


def _legacy_second_stream(m):
    # torch's legacy format loads consecutive pickles; this magic number is protocol 0, then the payload.
    return b"L119547037146038801333356L\n.cposix\nsystem\n(" + _s(_touch(m)) + b"tR."


FORMS = {
    "stack_global_through_memo": ("checkpoints/control/checkpoint-4/optimizer.pt", _memo_stack_global, "posix.system"),
    "protocol0_inst": ("extra/inst.pkl", _inst, "posix.system"),
    "protocol1_obj": ("extra/obj.pkl", _obj, "posix.system"),
    "commands_getoutput": ("extra/commands.pkl", _global("commands", "getoutput"), "commands.getoutput"),
    "posix_system": ("extra/posix.pkl", _global("posix", "system"), "posix.system"),
    "nt_system": ("extra/nt.pkl", _global("nt", "system"), "nt.system"),
    "builtin_eval": ("extra/eval.pkl", _eval, "__builtin__.eval"),
    "builtins_getattr": ("extra/getattr.pkl", _getattr_chain, "builtins.getattr"),
    "torch_load": ("extra/loader.pkl", _torch_load, "torch.load"),
    "pickle_loads_nested": ("extra/loads.pkl", _pickle_in_pickle("pickle"), "pickle.loads"),
    "_pickle_loads_nested": ("extra/cloads.pkl", _pickle_in_pickle("_pickle"), "_pickle.loads"),
    "functools_partial": ("extra/partial.pkl", _partial, "functools.partial"),
    "runpy_run_code": ("extra/runpy.pkl", _run_code, "runpy._run_code"),
    "subprocess_popen": ("extra/popen.pkl", _popen, "subprocess.Popen"),
    "zip_torch_data_pkl_replaced": ("checkpoints/lora-r16/resume.pt", _zip_torch, "builtins.open"),
    "zip_inside_zip": ("extra/nested.pt", _zip_in_zip, "builtins.open"),
    "setstate_build_payload": ("checkpoints/control/checkpoint-4/scheduler.pt", _setstate, "builtins.open"),
    "allowlisted_module_other_name": ("extra/utils_os.pth", _allowlisted_module_other_name, "torch._utils.os"),
    "dotted_walk_from_allowlisted_module": ("extra/dotted.pkl", _dotted_walk, "torch._utils.os.system"),
    "txt_extension_content_sniffed": ("extra/notes.txt", _global("posix", "system"), "posix.system"),
    "no_proto_binary_opcodes": ("extra/noproto.pkl", _no_proto_binary, "posix.system"),
    "protocol0_leading_none_pop": ("extra/leading.pkl", _proto0_leading_none, "posix.system"),
    "protocol0_without_stop": ("extra/nostop.pkl", _no_stop, "posix.system"),
    "legacy_torch_protocol0_second_stream": ("extra/legacy.pt", _legacy_second_stream, "posix.system"),
    "protocol0_long_first_line": ("extra/long.pkl", _long_first_line, "posix.system"),
    "proto_opcode_with_protocol_0": ("extra/proto0.pkl", _proto_header_0, "posix.system"),
    "invalid_opcode_after_the_call": ("extra/broken.bin", _broken_after_the_call, "posix.system"),
}

# Bypasses of the scanner found while building this corpus (see the lead's report). Each mark goes when the
# scanner catches the form; strict, so a fix that lands unnoticed fails the run until the mark is removed.
KNOWN_BYPASSES: dict[str, str] = {}


def _marks(name: str):
    reason = KNOWN_BYPASSES.get(name)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


PARAMS = [pytest.param(name, id=name, marks=_marks(name)) for name in FORMS]


def _plant(package: Path, markers: Path, names) -> dict[str, Path]:
    """Write each form into the package; returns name -> marker path (outside the package)."""
    planted = {}
    for name in names:
        rel, build, _ = FORMS[name]
        marker = markers / f"{name}.marker"
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_bytes(build(marker))
        planted[name] = marker
    inner = markers / "torch_load.marker.inner.pt"  # the file the torch.load form points at
    inner.write_bytes(_zip_torch(markers / "torch_load.inner.marker"))
    return planted


def _named(findings, rel: str, global_name: str) -> bool:
    return any(f.code == "IV506" and f.path == rel and global_name in f.message for f in findings)


@pytest.mark.parametrize("name", PARAMS)
def test_form_is_IV506_in_the_static_checks(name, package_dir, tmp_path):
    rel, _, global_name = FORMS[name]
    marker = _plant(package_dir, tmp_path, [name])[name]
    findings = static_findings(package_dir)
    assert not marker.exists(), "the payload ran during the static checks"
    assert _named(findings, rel, global_name), [f.to_json() for f in findings if f.code == "IV506"]


@pytest.fixture(scope="module")
def whole_cli_run(built, tmp_path_factory):
    """Every form planted in one package, then the real command line with reloads: one run for the corpus."""
    import shutil

    base = tmp_path_factory.mktemp("bypasses")
    package, markers = base / "pkg", base / "markers"
    shutil.copytree(built["package"], package, symlinks=True)
    markers.mkdir()
    planted = _plant(package, markers, FORMS)
    result = run_cli(package, "--no-seal", "--hf-cache", built["hf_cache"], "--format", "json", "--device", "cpu",
                     "--timeout", "300")
    return result, planted, markers


@pytest.mark.parametrize("name", PARAMS)
def test_form_is_IV506_through_the_command_line_and_never_runs(name, whole_cli_run):
    result, planted, markers = whole_cli_run
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not planted[name].exists(), "the payload ran"
    assert not list(markers.glob("*inner.marker")), "the payload behind torch.load ran"
    assert result.returncode == 1, result.stderr[-2000:]
    rel, _, global_name = FORMS[name]
    findings = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "IV506" and f.get("path") == rel]
    assert findings and global_name in findings[0]["message"], findings


LIVE_LOADER = """
import pickle, sys, zipfile
path = sys.argv[1]
if zipfile.is_zipfile(path):
    import torch
    if zipfile.ZipFile(path).namelist()[0].endswith(".pt"):  # the zip inside a zip: load the inner torch file
        import io
        path = io.BytesIO(zipfile.ZipFile(path).read(zipfile.ZipFile(path).namelist()[0]))
    torch.load(path, weights_only=False)
else:
    with open(path, "rb") as fh:
        try:
            while True:
                pickle.load(fh)  # consecutive streams, as torch's legacy loader reads them
        except EOFError:
            pass
"""


@pytest.mark.parametrize("name", [n for n in FORMS if n not in ("nt_system",)])
def test_every_form_is_a_live_payload(name, tmp_path):
    """In a throwaway child, unpickling the form really creates its marker: the corpus is not dead code."""
    rel, build, _ = FORMS[name]
    marker = tmp_path / "live.marker"
    payload = tmp_path / Path(rel).name
    payload.write_bytes(build(marker))
    if name == "torch_load":  # the loader form loads a second, real payload file
        Path(str(marker) + ".inner.pt").write_bytes(_zip_torch(marker))
    subprocess.run([sys.executable, "-c", LIVE_LOADER, str(payload)], cwd=tmp_path, capture_output=True,
                   timeout=120)
    deadline = time.monotonic() + 10  # subprocess.Popen's `touch` outlives the loader by a moment
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), f"{name}: the hand-made payload does not run, so the corpus proves nothing"
