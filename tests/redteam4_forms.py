"""What the fourth red team's tests build: small real campaigns sealed by the tool itself, and hostile archives
written member by member with the seal's own canonical headers (archive/canonical.py), so that every header is
one the audit accepts and only the planted difference is tested. A sender controls every byte of an archive and
of its `.sha256`; these helpers rewrite both, and recompute SEAL/SHA256SUMS when asked, as a sender would."""
from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import zstandard

from itera_verify import settle, verify
from itera_verify.archive.canonical import header
from itera_verify.archive.tarheader import DIRECTORY, REGULAR, SYMLINK
from tests.lots import close, record_lot

BLOCK = 512
SUMS = "SEAL/SHA256SUMS"
ONE_LOT = [{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}]


@dataclass
class Member:
    """One archive member: `name` under the top folder ("" is the top folder itself); kind file, directory or
    symlink."""

    name: str
    kind: str
    data: bytes = b""
    link: str = ""
    mode: int = 0o644
    mtime: int = 1_700_000_000


def small_campaign(folder: Path, **record) -> Path:
    """A whole campaign (one control, one variant, real safetensors weights), recorded by the tool's recorder and
    closed: `itera-verify` passes it without reloads."""
    package = record_lot(folder, None, [("control", "control", 0), ("lora-r8", "variant", 1)], plan=ONE_LOT,
                         **record)
    close(package, ["control", "lora-r8"])
    return package


def seal(package: Path, out: Path, **options) -> Path:
    """The archive `itera-verify PACKAGE -o OUT/` writes (AssertionError with the findings when it refuses)."""
    out.mkdir(parents=True, exist_ok=True)
    report = verify(package, settle(reload=False, output=f"{out}/", **options))
    assert report.sealed, [f.to_json() for f in report.findings]
    return Path(report.archive["path"])


def members(archive: Path) -> tuple[str, list[Member]]:
    """(top folder, its members in archive order, the top folder first)."""
    raw = zstandard.ZstdDecompressor().stream_reader(archive.read_bytes(), read_across_frames=True).read()
    found = []
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for info in tar.getmembers():
            top, _, rel = info.name.partition("/")
            kind = "directory" if info.isdir() else "symlink" if info.issym() else "file"
            data = tar.extractfile(info).read() if info.isfile() else b""
            found.append(Member(rel, kind, data, info.linkname, info.mode, int(info.mtime)))
    return top, found


def tar_bytes(top: str, listed: list[Member]) -> bytes:
    out = io.BytesIO()
    for member in listed:
        name = f"{top}/{member.name}" if member.name else f"{top}/"
        if member.kind == "directory":
            out.write(header(name.rstrip("/") + "/", DIRECTORY, mtime=member.mtime))
        elif member.kind == "symlink":
            out.write(header(name, SYMLINK, mtime=member.mtime, linkname=member.link))
        else:
            out.write(header(name, REGULAR, size=len(member.data), mode=member.mode, mtime=member.mtime))
            out.write(member.data + bytes(-len(member.data) % BLOCK))
    out.write(bytes(2 * BLOCK))
    return out.getvalue()


def write_archive(path: Path, top: str, listed: list[Member], *, sums: bool = True) -> Path:
    """`path` (and its `.sha256`) holding `listed`; with `sums`, SEAL/SHA256SUMS listing every file but itself,
    as the seal lists them."""
    listed = list(listed)
    if sums:
        files = sorted((m.name, hashlib.sha256(m.data).hexdigest()) for m in listed
                       if m.kind == "file" and m.name != SUMS)
        text = "".join(f"{digest}  {name}\n" for name, digest in files).encode()
        listed = [m for m in listed if m.name != SUMS] + [Member(SUMS, "file", text)]
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(tar_bytes(top, listed)))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    return path


def rewrite(archive: Path, edit: Callable[[list[Member]], list[Member]], out: Path | None = None, *,
            sums: bool = True) -> Path:
    """The sealed `archive` with its members edited, written to `out` (default: in place)."""
    top, listed = members(archive)
    return write_archive(out or archive, top, edit(listed), sums=sums)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
