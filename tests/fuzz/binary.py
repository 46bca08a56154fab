"""Hypothesis strategies for the binary readers: safetensors headers, pickle byte streams, tar+zstd archives.

The generators speak each format's own grammar (opcodes, header fields, tar blocks) so most inputs get past
the first byte, then lie: lengths that overrun, types that are devices, names that escape.
"""
from __future__ import annotations

import copy
import functools
import io
import json
import pickle
import struct
import tarfile

import zstandard
from hypothesis import strategies as st

from .strategies import byte_noise, dump_json, json_values, mutated_json, text

# ---------------------------------------------------------------------------------------------- safetensors

DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U64": 8, "U32": 4, "U16": 2}
ODD_DTYPES = ["", "f32", "F128", "X", "OBJ", "U1"]


@st.composite
def safetensors_files(draw) -> bytes:
    """8-byte little-endian header length, JSON header, tensor bytes; the length and offsets may lie."""
    header: dict = {}
    offset = 0
    for index in range(draw(st.integers(0, 4))):
        dtype = draw(st.one_of(st.sampled_from(sorted(DTYPE_SIZES)), st.sampled_from(ODD_DTYPES)))
        shape = draw(st.lists(st.one_of(st.integers(0, 4), st.sampled_from([-1, 2**31, 2**63, 2**64])),
                              max_size=3))
        count = 1
        for dim in shape:
            count *= max(dim, 0)
        size = min(count * DTYPE_SIZES.get(dtype, 1), 1 << 12)
        begin = draw(st.one_of(st.just(offset), st.integers(-1, offset + 16)))
        end = draw(st.one_of(st.just(begin + size), st.integers(-1, 1 << 20), st.just(2**64)))
        header[draw(st.one_of(st.just(f"layer.{index}.weight"), text))] = \
            {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        offset = max(offset, begin + size)
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.one_of(st.just({"format": "pt"}), json_values(4)))
    if header and draw(st.booleans()):
        header = draw(mutated_json(header))
    header_bytes = dump_json(header).encode("utf-8", "surrogatepass")
    header_bytes += b" " * draw(st.integers(0, 7))  # safetensors pads the header to 8 bytes
    length = draw(st.one_of(st.just(len(header_bytes)), st.just(len(header_bytes)), st.sampled_from(
        [0, 1, len(header_bytes) - 1, len(header_bytes) + 1, 100_000_001, 2**63, 2**64 - 1]),
        st.integers(0, 2**64 - 1)))
    data_size = draw(st.one_of(st.just(offset), st.integers(0, offset + 64)))
    data = draw(st.sampled_from([b"\x00", b"\xff", b"\x7f\xc0", b"\x01"])) * data_size  # 0x7fc0... NaN
    blob = struct.pack("<Q", max(0, min(length, 2**64 - 1))) + header_bytes + data
    return draw(st.one_of(st.just(blob), byte_noise(blob), st.binary(max_size=24)))


# ---------------------------------------------------------------------------------------------- pickles

# Global names a payload would use, and allowlisted ones a scanner must still accept.
FORBIDDEN_GLOBALS = [("os", "system"), ("posix", "system"), ("nt", "system"), ("builtins", "eval"),
                     ("builtins", "exec"), ("builtins", "getattr"), ("__builtin__", "eval"),
                     ("commands", "getoutput"), ("subprocess", "Popen"), ("runpy", "_run_code"),
                     ("pickle", "loads"), ("_pickle", "loads"), ("torch", "load"), ("functools", "partial"),
                     ("torch._utils", "os"), ("torch", "_utils._rebuild_tensor_v2.__globals__"),
                     ("numpy", "load"), ("socket", "create_connection"), ("webbrowser", "open")]
ALLOWED_GLOBALS = [("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"), ("torch", "Size"),
                   ("torch", "FloatStorage"), ("_codecs", "encode"), ("numpy", "dtype"),
                   ("numpy._core.multiarray", "_reconstruct"), ("torch", "float32")]
global_names = st.sampled_from(FORBIDDEN_GLOBALS + ALLOWED_GLOBALS)


def _unicode(s: str) -> bytes:
    raw = s.encode("utf-8")
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


@st.composite
def _fragment(draw) -> bytes:
    """One opcode (or a short idiom) of a pickle program."""
    module, name = draw(global_names)
    kind = draw(st.sampled_from(["global", "stack_global", "memo_global", "inst", "obj", "reduce", "build",
                                 "newobj", "string", "int", "tuple", "mark", "memo", "pop", "dup", "proto",
                                 "frame", "persid", "ext", "nested", "raw", "stop", "list", "dict",
                                 "huge_length"]))
    if kind == "global":
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    if kind == "stack_global":
        return _unicode(module) + _unicode(name) + b"\x93"
    if kind == "memo_global":  # strings memoised early, fetched back for STACK_GLOBAL
        slot = draw(st.integers(0, 3))
        return (_unicode(module) + b"q" + bytes([slot]) + b"0" + _unicode(name) + b"q" + bytes([slot + 10])
                + b"0" + b"h" + bytes([slot]) + b"h" + bytes([slot + 10]) + b"\x93")
    if kind == "inst":
        return b"(" + _unicode("x") + b"i" + module.encode() + b"\n" + name.encode() + b"\n"
    if kind == "obj":
        return b"(c" + module.encode() + b"\n" + name.encode() + b"\n" + _unicode("x") + b"o"
    if kind == "nested":  # a pickle inside the pickle, handed to pickle.loads
        inner = b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n)R."
        return b"cpickle\nloads\nC" + bytes([len(inner)]) + inner + b"\x85R"
    simple = {"reduce": b"R", "build": b"b", "newobj": b"\x81", "tuple": draw(st.sampled_from([b")", b"\x85",
              b"\x86", b"\x87", b"t"])), "mark": b"(", "pop": draw(st.sampled_from([b"0", b"1"])), "dup": b"2",
              "stop": b".", "list": draw(st.sampled_from([b"]", b"a", b"e"])),
              "dict": draw(st.sampled_from([b"}", b"s", b"u"]))}
    if kind in simple:
        return simple[kind]
    if kind == "string":
        return draw(st.one_of(st.text(max_size=10).map(_unicode), st.just(b"S'x'\n"), st.just(b"V\\u0041\n")))
    if kind == "int":
        return draw(st.sampled_from([b"K\x01", b"J\xff\xff\xff\xff", b"I01\n", b"L9999999999999999999L\n",
                                     b"\x8a\x01\x01", b"N", b"\x88", b"\x89"]))
    if kind == "memo":
        slot = draw(st.integers(0, 300))
        return draw(st.sampled_from([b"\x94", b"q" + bytes([slot % 256]), b"h" + bytes([slot % 256]),
                                     b"r" + struct.pack("<I", slot), b"j" + struct.pack("<I", slot),
                                     b"p" + str(slot).encode() + b"\n", b"g" + str(slot).encode() + b"\n"]))
    if kind == "proto":
        return b"\x80" + bytes([draw(st.integers(0, 6))])
    if kind == "frame":
        return b"\x95" + struct.pack("<Q", draw(st.sampled_from([0, 8, 2**40, 2**64 - 1])))
    if kind == "persid":
        return draw(st.sampled_from([b"Pstorage\n", _unicode("storage") + b"Q"]))
    if kind == "huge_length":  # a counted string or bytes whose length is far beyond the file
        opcode = draw(st.sampled_from([b"\x8d", b"\x8e", b"\x96"]))  # BINUNICODE8, BINBYTES8, BYTEARRAY8
        return opcode + struct.pack("<Q", draw(st.sampled_from([2**31, 2**40, 2**62, 2**63 + 1]))) + b"abc"
    if kind == "ext":
        return draw(st.sampled_from([b"\x82\x01", b"\x83\x01\x00", b"\x84\x01\x00\x00\x00"]))
    return draw(st.binary(min_size=1, max_size=6))


@st.composite
def pickle_programs(draw) -> bytes:
    header = draw(st.sampled_from([b"", b"\x80\x02", b"\x80\x04", b"\x80\x05", b"\x80\x04\x95\x00\x00\x00\x00"
                                                                               b"\x00\x00\x00\x00"]))
    body = b"".join(draw(st.lists(_fragment(), min_size=1, max_size=14)))
    return header + body + draw(st.sampled_from([b".", b".", b"", b".\x80\x02N."]))


def _real_pickle(value_and_protocol) -> bytes:
    value, protocol = value_and_protocol
    return pickle.dumps(value, protocol=protocol)


python_values = json_values(10).map(lambda v: v if not isinstance(v, list) else tuple(v))
real_pickles = st.tuples(python_values, st.integers(0, pickle.HIGHEST_PROTOCOL)).map(_real_pickle)


def _in_legacy_tar(data: bytes) -> bytes:
    """torch's legacy tar format (torch.load tries it first): the stream as its `storages` member."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("storages")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def pickle_streams():
    """Opcode programs, real pickles of plain data, damaged real pickles, programs in a legacy torch tar."""
    return st.one_of(pickle_programs(), pickle_programs(), real_pickles, real_pickles.flatmap(byte_noise),
                     pickle_programs().map(_in_legacy_tar))


# ---------------------------------------------------------------------------------------------- tar + zstd

# Absolute names point into a canary folder, never at a real system file: if the extractor ever wrote through
# one, the fuzzer would do the damage it looks for. The property checks the canary folder stays absent.
CANARY = "/tmp/itera-fuzz-canary"
MEMBER_NAMES = ["{cid}/manifest.json", "{cid}/SEAL/SHA256SUMS", "{cid}/SEAL/verification.json",
                "{cid}/corpus/eval_ids.txt", CANARY + "/abs", "../escape", "{cid}/../../escape", "{cid}/./x",
                "{cid}//double", "{cid}/dir/", "", ".", "{cid}", "other/file", "{cid}/" + "n" * 300,
                "{cid}/\u00e9t\u00e9", "{cid}/a\\..\\..\\b", "C:/x", "{cid}/link"]
MEMBER_TYPES = [tarfile.REGTYPE, tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE, tarfile.CONTTYPE]
LINK_TARGETS = [CANARY, CANARY + "/file", "../../..", "../../../itera-fuzz-canary", "manifest.json",
                "{cid}/manifest.json", "", ".", "..", "a/../..", "{cid}/../.."]


@st.composite
def tar_members(draw, cid: str):
    name = draw(st.one_of(st.sampled_from(MEMBER_NAMES), text)).replace("{cid}", cid)
    info = tarfile.TarInfo(name.replace("\x00", ""))
    info.type = draw(st.sampled_from(MEMBER_TYPES))
    data = draw(st.one_of(st.binary(max_size=64), st.just(b'{"format": "itera-output/1"}'),
                          st.just(b"0" * 64 + b"  manifest.json\n")))
    info.size = len(data) if info.type in (tarfile.REGTYPE, tarfile.CONTTYPE) else 0
    info.linkname = draw(st.sampled_from(LINK_TARGETS)).replace("{cid}", cid)
    info.mode = draw(st.sampled_from([0o644, 0o755, 0o4755, 0o777, 0]))
    info.mtime = draw(st.sampled_from([0, 1_700_000_000, 2**33 - 1]))
    return info, data if info.type in (tarfile.REGTYPE, tarfile.CONTTYPE) else None


HEADER_LIES = [b"77777777777", b"00000000001", b"\x80\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff", b"3", b"4",
               b"6", b"K", b"L", b"S", b"x", b"g", b"../../x", CANARY.encode(), b"garbage!"]


def _lie_in_headers(tar_bytes: bytes, lies: list[tuple[int, str, bytes]]) -> bytes:
    """Overwrite fields of 512-byte header blocks (size, typeflag, name), keeping or breaking the checksum."""
    data = bytearray(tar_bytes)
    fields = {"size": (124, 12), "type": (156, 1), "name": (0, 100), "chksum": (148, 8)}
    for block, field, value in lies:
        start = (block % max(len(data) // 512, 1)) * 512
        offset, width = fields[field]
        data[start + offset:start + offset + width] = value[:width].ljust(width, b"\x00")
    return bytes(data)


@functools.lru_cache(maxsize=4)
def zstd_bomb(cid: str, size: int = 64 << 20) -> bytes:
    """A few kilobytes that expand to one `size`-byte member: the audit must stop at its size limit."""
    bomb = io.BytesIO()
    with tarfile.open(fileobj=bomb, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(f"{cid}/big.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(bytes(size)))
    return zstandard.ZstdCompressor(level=3).compress(bomb.getvalue())


@st.composite
def tar_zst_archives(draw, cid: str = "reviews-lora-2026-11") -> bytes:
    buffer = io.BytesIO()
    fmt = draw(st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]))
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for info, data in draw(st.lists(tar_members(cid), max_size=8)):
            try:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
            except (ValueError, UnicodeError):
                continue  # a name this tar format cannot hold: the generator's limit, not the reader's
    raw = buffer.getvalue()
    lies = draw(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["size", "type", "name", "chksum"]),
                                   st.sampled_from(HEADER_LIES)), max_size=3))
    raw = _lie_in_headers(raw, lies)
    compressed = zstandard.ZstdCompressor(level=1, write_content_size=draw(st.booleans())).compress(raw)
    tail = draw(st.sampled_from(["none", "none", "truncate", "second-frame", "garbage", "bomb"]))
    if tail == "truncate":
        compressed = compressed[: draw(st.integers(0, max(len(compressed) - 1, 0)))]
    elif tail == "second-frame":
        compressed += zstandard.ZstdCompressor().compress(b"\x00" * 1024)
    elif tail == "garbage":
        compressed += draw(st.binary(min_size=1, max_size=16))
    elif tail == "bomb":
        compressed = zstd_bomb(cid)
    return draw(st.one_of(st.just(compressed), st.just(compressed), st.binary(max_size=64)))


# ---------------------------------------------------------------------------------------------- sealed archives

SUMS_LINES = st.one_of(
    st.tuples(st.sampled_from(["0" * 64, "f" * 64, "z" * 64, "0" * 63, ""]),
              st.sampled_from(["  ", " *", " ", "\t"]),
              st.one_of(st.sampled_from(["manifest.json", "../../etc/passwd", "/etc/passwd", "SEAL/SHA256SUMS",
                                         "a\\nb", "\\manifest.json", "", "corpus/eval_ids.txt"]), text))
    .map(lambda t: ("".join(t) if not t[2].startswith("\\") else "\\" + "".join(t)).encode("utf-8", "surrogatepass")),
    st.binary(max_size=40))


@st.composite
def _member_content(draw, name: str, original: bytes) -> bytes:
    if name.endswith("SEAL/SHA256SUMS"):
        lines = draw(st.lists(SUMS_LINES, max_size=6))
        keep = original.splitlines()[: draw(st.integers(0, 50))]
        return b"\n".join(keep + lines) + draw(st.sampled_from([b"\n", b"", b"\r\n"]))
    if name.endswith(".json"):
        try:
            base = json.loads(original)
        except (ValueError, RecursionError):  # an earlier mutation of this example already broke it
            base = {}
        return dump_json(draw(mutated_json(base))).encode("utf-8", "surrogatepass")
    return draw(st.one_of(st.binary(max_size=64), byte_noise(original[:4096])))


@st.composite
def sealed_archive_mutations(draw, base_tar: bytes, cid: str) -> bytes:
    """The real sealed archive, re-packed with a few member-level lies: content swapped, members added (hostile
    names and types), dropped, duplicated or renamed; then maybe damaged after compression."""
    source = tarfile.open(fileobj=io.BytesIO(base_tar))
    members = [(info, source.extractfile(info).read() if info.isfile() else None) for info in source.getmembers()]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["content", "content", "add", "drop", "duplicate", "rename", "retype"]))
        index = draw(st.integers(0, len(members) - 1)) if members else 0
        if op == "add" or not members:
            info, data = draw(tar_members(cid))
            members.insert(index, (info, data))
            continue
        info, data = members[index]
        info = copy.copy(info)
        if op == "content" and data is not None:
            data = draw(_member_content(info.name, data))
            info.size = len(data)
        elif op == "drop":
            del members[index]
            continue
        elif op == "duplicate":
            members.insert(index, (info, data))
            continue
        elif op == "rename":
            info.name = draw(st.sampled_from(MEMBER_NAMES)).replace("{cid}", cid)
        elif op == "retype":
            info.type = draw(st.sampled_from(MEMBER_TYPES))
            info.linkname = draw(st.sampled_from(LINK_TARGETS)).replace("{cid}", cid)
            data = data if info.type in (tarfile.REGTYPE, tarfile.CONTTYPE) else None
            info.size = len(data) if data is not None else 0
        members[index] = (info, data)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            try:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
            except (ValueError, UnicodeError):
                continue
    compressed = zstandard.ZstdCompressor(level=1).compress(out.getvalue())
    return draw(st.one_of(st.just(compressed), st.just(compressed), byte_noise(compressed)))


# ---------------------------------------------------------------------------------------------- SSH signatures

_KEY_TYPES = [b"ssh-ed25519", b"ecdsa-sha2-nistp256", b"ecdsa-sha2-nistp384", b"ssh-rsa", b"sk-ssh-ed25519@openssh.com",
              b"ssh-ed25519-cert-v01@openssh.com", b"x"]


def _ssh_string(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


@st.composite
def ssh_signatures(draw) -> bytes:
    """Armored SSHSIG files: key blobs, namespaces, hash names and signature blobs that may lie about their
    lengths or types, then byte noise."""
    from itera_verify.format.sshsig import armor

    key_type = draw(st.sampled_from(_KEY_TYPES))
    key_blob = _ssh_string(key_type) + b"".join(_ssh_string(draw(st.binary(max_size=80)))
                                                for _ in range(draw(st.integers(0, 3))))
    if draw(st.booleans()):
        key_blob = key_blob[:draw(st.integers(0, len(key_blob)))]
    namespace = draw(st.sampled_from(["itera-verify-seal@v1", "file", "", "itera-verify-seal@v1\0x"]))
    hash_name = draw(st.sampled_from(["sha256", "sha512", "md5", ""]))
    signature = _ssh_string(draw(st.sampled_from(_KEY_TYPES))) + _ssh_string(draw(st.binary(max_size=140)))
    data = armor(key_blob, namespace, hash_name, signature)
    return draw(byte_noise(data)) if draw(st.booleans()) else data


_ALLOWED_TOKENS = ["alice@example.com", "*@example.org", "!mallory@x", "namespaces=\"itera-verify-seal@v1\"",
                   "cert-authority", "valid-after=20260101", "valid-before=\"20991231235959Z\"", "ssh-ed25519",
                   "ecdsa-sha2-nistp256", "AAAAC3NzaC1lZDI1NTE5AAAAIGv0", "#", "\"", ",", " ", "\t", "="]


def allowed_signers_files():
    """allowed_signers text: lines of principals, options, key types and base64, in any order."""
    line = st.lists(st.one_of(st.sampled_from(_ALLOWED_TOKENS), st.text(max_size=12)), max_size=8).map("".join)
    return st.lists(line, max_size=6).map("\n".join)
