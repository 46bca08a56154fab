"""Every input the fuzzers ever broke the tool with, kept as a fixed example of its reader: CI replays them on
each run (a random budget of 100 examples may not meet them again). Minimal forms of what hypothesis found.

`STILL_BROKEN` names the ones not fixed yet; the test marks them xfail(strict=True) so that a fix is noticed.
"""
from __future__ import annotations

import io
import json
import struct
import tarfile

import zstandard

CAMPAIGN = "reviews-lora-2026-11"


def _manifest_with(raw_value: bytes, *path):
    """The example package's own manifest with the value at `path` replaced by raw JSON text (a callable: the
    workspace provides the manifest)."""
    def build(ws) -> bytes:
        manifest = ws.document("manifest.json")
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = "__RAW__"
        return json.dumps(manifest).replace('"__RAW__"', raw_value.decode()).encode()

    return build


def _tar_zst(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor().compress(out.getvalue())


def _safetensors(header: dict | bytes, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


DEEP = b"[" * 100_000 + b"]" * 100_000

# reader name -> [(what broke, the input, or a callable building it from the workspace)]
REGRESSIONS: dict[str, list[tuple[str, object]]] = {
    "config (TOML)": [
        ("tool is an integer", ("itera-verify.toml", b"tool = 5\n")),
        ("tool is a string, in pyproject.toml", ("pyproject.toml", b'tool = "x"\n')),
        ("tool.itera-verify is a date", ("pyproject.toml", b'[tool]\n"itera-verify" = 2026-11-20\n')),
        ("timeout = nan", ("itera-verify.toml", b"timeout = nan\n")),
        ("timeout = inf", ("itera-verify.toml", b"timeout = inf\n")),
    ],
    "stops.json": [
        ("NaN as a stop's rule", b'{"stops": [{"run": "lora-r64", "rule": NaN, "at": "2026-11-20T09:40:00Z", '
                                 b'"step": 3, "reason": "x"}]}'),
        ("-Infinity as a stop's rule", b'{"stops": [{"run": "lora-r64", "rule": -Infinity, "step": 3}]}'),
    ],
    "metrics (JSONL)": [
        ("a 401-digit value", b'{"step": 1, "name": "train_loss", "value": 1' + b"0" * 400 + b"}\n"),
        ("a 5000-digit step", b'{"step": ' + b"9" * 5000 + b', "name": "train_loss", "value": 1}\n'),
    ],
    "manifest.json": [
        ("a 5000-digit integer", _manifest_with(b"9" * 5000, "timeline", "observed_hours")),
        ("a lot of 10**400 days", _manifest_with(b"1" + b"0" * 400, "plan", "lots", 0, "days")),
        ("a cost per accepted run of 1e308", _manifest_with(b"1e308", "decision", "cost_per_accepted_usd")),
        ("a lot of 9.99e307 days", _manifest_with(b"9.99e307", "plan", "lots", 0, "days")),
        ("a NUL byte as an artifact's path", _manifest_with(b'"\\u0000"', "artifacts", 2, "path")),
    ],
    "safetensors header": [
        ("a header nested 100,000 deep", _safetensors(DEEP)),
    ],
    "pickle scanner": [
        ("BINUNICODE8 announcing 2**40 bytes", b"\x80\x04\x8d" + struct.pack("<Q", 2**40) + b"abc"),
        ("BINBYTES8 announcing 2**62 bytes", b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"abc"),
    ],
    "pickle scanner (IV506)": [
        ("protocol-4 opcodes without PROTO", (b"\x8c\x05posix\x8c\x06system\x93\x8c\x04true\x85R.", ".pkl")),
        ("protocol 0 opening with NONE, POP", (b"N0cposix\nsystem\n(S'true'\ntR.", ".pkl")),
        ("protocol 0 without STOP", (b"cposix\nsystem\n(S'true'\ntR", ".pkl")),
        ("a first line longer than the sniff window", (b"(S'" + b"x" * 80 + b"'\niposix\nsystem\n.", ".pkl")),
        ("the payload in a second stream", (b"\x80\x02N.\x8c\x05posix\x8c\x06system\x93\x8c\x04true\x85R.", ".pt")),
    ],
    "audit (archive)": [
        ("an empty file", b""),
        ("an archive holding only SEAL/SHA256SUMS", _tar_zst([(f"{CAMPAIGN}/SEAL/SHA256SUMS", b"")])),
        ("a top folder name longer than NAME_MAX", _tar_zst([("a" * 300 + "/manifest.json", b"{}")])),
    ],
    "safetensors loader (reload child)": [
        ("a valid float8 tensor", _safetensors({"w": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}},
                                               b"\x00")),
    ],
    "safetensors header (format layer)": [
        ("a null __metadata__, which the library reads as none",
         b"\x1a\x00\x00\x00\x00\x00\x00\x00" + b'{"__metadata__": null}    '),
    ],
    "allowed_signers (format layer)": [
        ("a key whose base64 holds a non-ASCII character", "alice@example.com ssh-ed25519 AAAA\u00e9BBB\n"),
    ],
}

# (reader, what broke) -> why it is still expected to fail; the lead removes an entry with the fix.
STILL_BROKEN: dict[tuple[str, str], str] = {}
