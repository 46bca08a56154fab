"""Known ways to slip a payload past a pickle scanner, each written by hand in raw opcodes, each planted in a
copy of the example package. Every form must be IV506 — through the static checks and through the whole
command line, reloads included — and its payload must never run: each one creates a marker file when
unpickled, and the marker must never appear.

`test_every_form_is_a_live_payload` proves the corpus is real: a throwaway child process (forked from one that
imported torch) unpickles each form (with `weights_only=False` for torch files) and the marker does appear
there. A corpus of dead payloads could not fail.
"""
from __future__ import annotations

import io
import json
import shlex
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests import zip_forms
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


# ---- published since (issue 35: picklescan's 2025-2026 advisories, nullifAI), one form per class ------------

def _b(text: str) -> bytes:
    """SHORT_BINSTRING: a protocol-1 byte string, a str to the unpickler's default ASCII decoding."""
    raw = text.encode()
    return b"U" + bytes([len(raw)]) + raw


def _x(text: str) -> bytes:
    """BINUNICODE: a string with a 4-byte length."""
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _resolve_name(m):
    # pkgutil.resolve_name('posix:system') returns any attribute of any module: a universal gadget a blocklist missed.
    return b"\x80\x02cpkgutil\nresolve_name\n(" + _s("posix:system") + b"tR(" + _s(_touch(m)) + b"tR."


def _stack_global_from(push):
    # STACK_GLOBAL takes whatever strings are on the stack, whichever opcode pushed them.
    return lambda m: b"\x80\x04" + push("posix") + push("system") + STACK_GLOBAL + push(_touch(m)) + b"\x85R."


def _memo_redefined(m):
    # Memo entries 0 and 1 hold allowlisted names, then are redefined by BINPUT with the payload's before the GETs.
    return (b"\x80\x04" + _u("collections") + b"q\x00" + _u("OrderedDict") + b"q\x01" + b"00" + _u("posix")
            + b"q\x00" + _u("system") + b"q\x01" + b"00" + BINGET + b"\x00" + BINGET + b"\x01" + STACK_GLOBAL
            + _u(_touch(m)) + b"\x85R.")


def _memoize_over_a_put(m):
    # MEMOIZE stores at len(memo), not at a counter of its own: after BINPUT 1 it overwrites entry 1, after BINPUT 2
    # entry 2 (both unpicklers). A reader that numbers MEMOIZE 0, 1 reads system.OrderedDict; CPython posix.system.
    return (b"\x80\x04" + _u("collections") + b"q\x01" + b"0" + _u("posix") + MEMOIZE + b"0" + _u("OrderedDict")
            + b"q\x02" + b"0" + _u("system") + MEMOIZE + b"0" + BINGET + b"\x01" + BINGET + b"\x02" + STACK_GLOBAL
            + _u(_touch(m)) + b"\x85R.")


EXTENSION_CODES = {"EXT1": 0xF0, "EXT2": 0x1F0, "EXT4": 0x101F0}


def _ext(opcode: str):
    # EXT1/2/4 import through copyreg's extension registry (copyreg.add_extension): no module name in the stream.
    code = EXTENSION_CODES[opcode]
    opcode_byte, width = {"EXT1": (b"\x82", "<B"), "EXT2": (b"\x83", "<H"), "EXT4": (b"\x84", "<i")}[opcode]
    arg = opcode_byte + struct.pack(width, code)
    return lambda m: b"\x80\x02" + arg + b"(" + _s(_touch(m)) + b"tR."


def _dotted_global(m):
    # GLOBAL (not STACK_GLOBAL) with a dotted name: under protocol 4 find_class walks torch._utils -> os -> system.
    return b"\x80\x04ctorch._utils\nos.system\n(" + _s(_touch(m)) + b"tR."


def _getattr_through_torch(m):
    # builtins.getattr reached as torch.builtins.getattr, the module as torch.os: no name starts with builtins or os.
    return (b"\x80\x04" + _u("torch") + _u("builtins.getattr") + STACK_GLOBAL + b"(" + _u("torch") + _u("os")
            + STACK_GLOBAL + _u("system") + b"tR" + _u(_touch(m)) + b"\x85R.")


def _seven_zip(m):
    # nullifAI: a torch checkpoint compressed with 7z (LZMA2) instead of zip. torch cannot load it; a scanner that
    # cannot open it must not call it clean.
    return zip_forms.seven_zip("archive/data.pkl", b"\x80\x02" + _open_call(m) + b".")


def _zip_payload(m) -> bytes:
    return zip_forms.with_data_pkl(zip_forms.torch_bytes(), b"\x80\x02" + _open_call(m) + b".")


def _zip_fields(data: bytes, member: bytes, change) -> bytes:
    """`change(record, field offsets)` on the local header and central entry of `member`."""
    out = bytearray(data)
    for sig, name_at, fields in ((b"PK\x03\x04", 30, {"flags": 6, "crc": 14, "nlen": 26}),
                                 (b"PK\x01\x02", 46, {"flags": 8, "crc": 16, "nlen": 28})):
        pos = out.find(sig)
        while pos >= 0:
            nlen = struct.unpack_from("<H", out, pos + fields["nlen"])[0]
            if bytes(out[pos + name_at:pos + name_at + nlen]).endswith(member):
                change(out, pos, fields)
            pos = out.find(sig, pos + 4)
    return bytes(out)


def _zip_flag(bit: int):
    def build(m):
        def set_bit(out, pos, fields):
            struct.pack_into("<H", out, pos + fields["flags"], struct.unpack_from("<H", out, pos + fields["flags"])[0]
                             | bit)
        return _zip_fields(_zip_payload(m), b"/data.pkl", set_bit)
    return build


def _zip_bad_crc(m):
    # torch's reader (miniz, as torch calls it) never checks a record's CRC; zipfile raises on it: a scanner that
    # skips what zipfile cannot read passes what torch loads.
    def flip(out, pos, fields):
        struct.pack_into("<L", out, pos + fields["crc"], struct.unpack_from("<L", out, pos + fields["crc"])[0] ^ 1)
    return _zip_fields(_zip_payload(m), b"/data.pkl", flip)


def _zip_dotdot_member(m):
    # A member named with `..`: torch never reads it, unzip and a reviewer's zipfile.extractall place it elsewhere.
    out = io.BytesIO(zip_forms.torch_bytes())
    with zipfile.ZipFile(out, "a") as archive:
        archive.writestr("archive/../hook.pkl", b"\x80\x02" + _open_call(m) + b".")
    return out.getvalue()


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
    # Published since (issue 35): a pickle per bypass class, the containers, the wrong extensions.
    "pkgutil_resolve_name_gadget": ("extra/resolve.pkl", _resolve_name, "pkgutil.resolve_name"),
    "string_operands_feed_stack_global": ("extra/string_sg.pkl", _stack_global_from(_s), "posix.system"),
    "short_binstring_operands_feed_stack_global": ("extra/binstring_sg.pkl", _stack_global_from(_b), "posix.system"),
    "binunicode_operands_feed_stack_global": ("extra/binunicode_sg.pkl", _stack_global_from(_x), "posix.system"),
    "memo_index_redefined_by_binput": ("extra/memo_put.pkl", _memo_redefined, "posix.system"),
    "memoize_overwrites_a_put": ("extra/memoize.pkl", _memoize_over_a_put, "posix.system"),
    "ext1_copyreg_extension": ("extra/ext1.pkl", _ext("EXT1"), "<copyreg extension code 240>"),
    "ext2_copyreg_extension": ("extra/ext2.pkl", _ext("EXT2"), "<copyreg extension code 496>"),
    "ext4_copyreg_extension": ("extra/ext4.pkl", _ext("EXT4"), "<copyreg extension code 66032>"),
    "dotted_name_in_global_opcode": ("extra/dotted_global.pkl", _dotted_global, "torch._utils.os.system"),
    "builtins_getattr_through_torch_attribute": ("extra/torch_getattr.pkl", _getattr_through_torch,
                                                 "torch.builtins.getattr"),
    "seven_zip_torch_checkpoint": ("checkpoints/control/checkpoint-4/rng_state.pth", _seven_zip, "7z archive"),
    "zip_crc_mismatch_torch_ignores": ("extra/crc.pt", _zip_bad_crc, "Bad CRC-32"),
    "zip_encryption_flag": ("extra/encrypted.pt", _zip_flag(0x1), "encrypted"),
    "zip_data_descriptor_flag_without_descriptor": ("extra/descriptor.pt", _zip_flag(0x8), "data descriptor"),
    "zip_local_name_differs_from_central": ("extra/local_name.pt",
                                            lambda m: zip_forms.local_name_differs(_zip_payload(m)),
                                            "local header differs"),
    "zip_duplicate_data_pkl": ("extra/duplicate.pt", lambda m: zip_forms.duplicate_name(
        zip_forms.torch_bytes(), b"\x80\x02" + _open_call(m) + b"."), "two entries with one name"),
    "zip_data_pkl_case_twin_torch_resolves": ("extra/case_twin.pt", lambda m: zip_forms.case_twin(
        zip_forms.torch_bytes(), b"\x80\x02" + _open_call(m) + b"."), "ignoring case"),
    "zip_member_named_with_dotdot": ("extra/dotdot.pt", _zip_dotdot_member, "builtins.open"),
    "json_extension_content_sniffed": ("extra/config.json", _global("posix", "system"), "posix.system"),
    "safetensors_extension_content_sniffed": ("extra/model.safetensors", _global("posix", "system"),
                                              "posix.system"),
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
import copyreg, pickle, sys, zipfile
path, how, root = sys.argv[1], sys.argv[2], sys.argv[3]
if how.startswith("EXT"):  # a process where something registered the extension code: copyreg's registry is global
    copyreg.add_extension("posix", "system", int(how.split(":")[1]))
if how == "7z":  # what a tool that opens 7z (py7zr, 7z x) hands to torch.load: the pickle inside
    sys.path.insert(0, root)
    from tests.zip_forms import unseven_zip
    pickle.loads(unseven_zip(open(path, "rb").read()))
elif how == "member":  # the reviewer's zipfile reads the member itself
    pickle.loads(zipfile.ZipFile(path).read("archive/../hook.pkl"))
elif zipfile.is_zipfile(path):
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


# Not live on this machine: nt exists on Windows only; torch's reader refuses an encrypted record (the form is
# refused because zipfile and a scanner cannot read it, and another reader could).
NOT_LIVE = ("nt_system", "zip_encryption_flag")
HOW = {"seven_zip_torch_checkpoint": "7z", "zip_member_named_with_dotdot": "member",
       **{f"{op.lower()}_copyreg_extension": f"{op}:{code}" for op, code in EXTENSION_CODES.items()}}
ROOT = Path(__file__).resolve().parents[1]


# One process imports torch once (it starts no thread doing so) and forks a throwaway child per form: each form
# still runs in a process of its own, in its test's folder, with nothing another form did, and none pays the
# import (~2 CPU-s each). A child that hangs is ended by its alarm.
LIVE_SERVER = """
import json, os, signal, sys
import torch
loader = compile(sys.argv[1], "<live loader>", "exec")
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            signal.alarm(120)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            os.chdir(request["cwd"])
            sys.argv = ["-c", request["path"], request["how"], request["root"]]
            exec(loader, {"__name__": "__main__"})
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    print("done", flush=True)
"""


@pytest.fixture(scope="module")
def live_loader():
    server = subprocess.Popen([sys.executable, "-c", LIVE_SERVER, LIVE_LOADER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    yield server
    server.stdin.close()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _load_in_a_child(server: subprocess.Popen, payload: Path, how: str, cwd: Path) -> None:
    import select

    server.stdin.write(json.dumps({"path": str(payload), "how": how, "root": str(ROOT), "cwd": str(cwd)}) + "\n")
    server.stdin.flush()
    assert select.select([server.stdout], [], [], 150)[0], "the live loader did not answer"
    assert server.stdout.readline() == "done\n", "the live loader ended"


@pytest.mark.parametrize("name", [n for n in FORMS if n not in NOT_LIVE])
def test_every_form_is_a_live_payload(name, tmp_path, live_loader):
    """In a throwaway child, unpickling the form really creates its marker: the corpus is not dead code."""
    rel, build, _ = FORMS[name]
    marker = tmp_path / "live.marker"
    payload = tmp_path / Path(rel).name
    payload.write_bytes(build(marker))
    if name == "torch_load":  # the loader form loads a second, real payload file
        Path(str(marker) + ".inner.pt").write_bytes(_zip_torch(marker))
    _load_in_a_child(live_loader, payload, HOW.get(name, "auto"), tmp_path)
    deadline = time.monotonic() + 10  # subprocess.Popen's `touch` outlives the loader by a moment
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), f"{name}: the hand-made payload does not run, so the corpus proves nothing"
