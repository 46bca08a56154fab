"""Tar streams built byte by byte (not with tarfile, which refuses to write most of these), the five ways a
hostile sender made the audit and GNU tar 1.34 name members differently (issue 14), and GNU tar's own view of
an archive: what `tar --zstd -t` lists and what `tar --zstd -x` extracts, to compare the audit's view with."""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import subprocess
import tarfile
from pathlib import Path

import zstandard

BLOCK = 512
TAR = "/usr/bin/tar"


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def header(name: bytes, typeflag: bytes = b"0", *, size: int = 0, linkname: bytes = b"", mode: int = 0o644,
           mtime: int = 1_700_000_000, magic: bytes = b"ustar\x0000", prefix: bytes = b"",
           size_field: bytes | None = None) -> bytes:
    """One header block with a correct checksum; every field as given, nothing normalised."""
    block = b"".join([
        name[:100].ljust(100, b"\0"), _octal(mode, 8), _octal(0, 8), _octal(0, 8),
        size_field if size_field is not None else _octal(size, 12), _octal(mtime, 12), b" " * 8,
        typeflag, linkname[:100].ljust(100, b"\0"), magic, bytes(64 + 16), prefix[:155].ljust(155, b"\0"),
        bytes(12)])
    assert len(block) == BLOCK
    return block[:148] + b"%06o\0 " % sum(block) + block[156:]


_FIELDS = {"mode": (100, 108), "uid": (108, 116), "gid": (116, 124), "uname": (265, 297), "gname": (297, 329)}


def with_fields(block: bytes, **fields: int | str) -> bytes:
    """A copy of the ustar header `block` (the last block of a member's headers) with some fields changed
    (numbers in octal, names as text) and its checksum made right again: a header GNU tar accepts whole."""
    head, block = block[:-BLOCK], bytearray(block[-BLOCK:])
    for key, value in fields.items():
        start, end = _FIELDS[key]
        raw = _octal(value, end - start) if isinstance(value, int) else value.encode().ljust(end - start, b"\0")
        block[start:end] = raw
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return head + bytes(block)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def record(key: str | bytes, value: str | bytes) -> bytes:
    body = b" " + (key.encode() if isinstance(key, str) else key) + b"=" + \
        (value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value) + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def extended(records: list[tuple[str, str]] | bytes, typeflag: bytes = b"x") -> bytes:
    data = records if isinstance(records, bytes) else b"".join(record(k, v) for k, v in records)
    return header(b"././@PaxHeader", typeflag, size=len(data), mode=0) + padded(data)


def gnu_long(name: str, typeflag: bytes = b"L") -> bytes:
    data = name.encode("utf-8", "surrogateescape") + b"\0"
    return header(b"././@LongLink", typeflag, size=len(data), magic=b"ustar  \0") + padded(data)


def regular(name: str, data: bytes, **fields) -> bytes:
    return header(name.encode("utf-8", "surrogateescape"), b"0", size=len(data), **fields) + padded(data)


END = bytes(2 * BLOCK)


def zst(tar: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(tar)


def expanded(archive: Path) -> bytes:
    with open(archive, "rb") as fh:
        return zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()


def members_end(tar: bytes) -> int:
    """Where the end-of-archive blocks of a well-formed tar stream begin."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        last = archive.getmembers()[-1]
    return last.offset_data + (-last.size % BLOCK) + last.size if last.isfile() else last.offset_data


# ---- the payload a reviewer would load ------------------------------------------------------------------
class _OpensMarker:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):  # unpickling calls open(marker, "w"): the marker file appears
        return open, (self.marker, "w")


def payload_pickle(marker: Path) -> bytes:
    return pickle.dumps({"model": _OpensMarker(str(marker))}, protocol=2)


# ---- the five forms -------------------------------------------------------------------------------------
FORMS = ("gnu-sparse-name", "global-path", "two-extended-headers", "pax-path-and-gnu-long-name",
         "regular-file-named-like-a-folder")


def hostile_member(form: str, audit_name: str, gnu_name: str, data: bytes) -> bytes:
    """One member the old reader named `audit_name` and GNU tar names `gnu_name` (with the same data)."""
    if form == "gnu-sparse-name":
        return extended([("path", audit_name), ("GNU.sparse.name", gnu_name)]) + regular(audit_name, data)
    if form == "global-path":
        return extended([("path", gnu_name)], b"g") + regular(audit_name, data)
    if form == "two-extended-headers":  # GNU tar keeps only the last header; the old reader merged both
        return extended([("path", audit_name)]) + extended([("mtime", "1700000000")]) + regular(gnu_name, data)
    if form == "pax-path-and-gnu-long-name":  # GNU tar prefers the PAX path; the old reader the later L
        return extended([("path", gnu_name)]) + gnu_long(audit_name) + regular(audit_name[:100], data)
    raise ValueError(form)


def attack(sealed: Path, out: Path, form: str, marker: Path, *, audit_names: tuple[str, str] | None = None) -> Path:
    """The sealed archive with two members appended that the old audit read as `audit_names` (both listed in
    the SHA256SUMS it checks) and GNU tar extracts as checkpoints/lora-r16/resume.pt (a pickle that opens the
    marker) and SEAL/SHA256SUMS (a list that matches GNU tar's extraction)."""
    tar = expanded(sealed)
    top = tarfile.open(fileobj=io.BytesIO(tar)).getmembers()[0].name.split("/")[0]
    with tarfile.open(fileobj=io.BytesIO(tar)) as source:
        contents = {i.name: source.extractfile(i).read() for i in source.getmembers() if i.isfile()}
    sums_name = f"{top}/SEAL/SHA256SUMS"
    original_sums = contents[sums_name]
    evil = payload_pickle(marker)
    victim = "checkpoints/lora-r16/resume.pt"
    gnu_sums = original_sums.replace(hashlib.sha256(contents[f"{top}/{victim}"]).hexdigest().encode(),
                                     hashlib.sha256(evil).hexdigest().encode())
    first, second = audit_names or ("SEAL/zz1", "SEAL/zz2")
    if form == "regular-file-named-like-a-folder":
        # GNU tar -x makes `first/` a folder and reads its data as the headers of the two replacements.
        inner = regular(f"{top}/{victim}", evil) + regular(sums_name, gnu_sums)
        appended = regular(f"{top}/{first}/", inner)
        listed = {first: inner}
    else:
        appended = hostile_member(form, f"{top}/{first}", f"{top}/{victim}", evil) + \
            hostile_member(form, f"{top}/{second}", sums_name, gnu_sums)
        listed = {first: evil, second: gnu_sums}
    audit_sums = original_sums + b"".join(b"%s  %s\n" % (hashlib.sha256(d).hexdigest().encode(), n.encode())
                                          for n, d in listed.items())
    # Re-write the sealed SEAL/SHA256SUMS so that it lists what the old audit saw (same length is not needed:
    # everything after it is re-emitted).
    with tarfile.open(fileobj=io.BytesIO(tar)) as source:
        infos = source.getmembers()
    index = next(i for i, info in enumerate(infos) if info.name == sums_name)
    head = tar[: infos[index].offset]
    rest = b"".join(_block_of(tar, info) for info in infos[index + 1:])
    new_tar = head + regular(sums_name, audit_sums, mtime=infos[index].mtime) + rest[:] + appended + END
    out.write_bytes(zst(new_tar))
    return out


def _block_of(tar: bytes, info: tarfile.TarInfo) -> bytes:
    """A member's header block(s) and data, as stored."""
    end = info.offset_data + (info.size + (-info.size % BLOCK) if info.isfile() else 0)
    return tar[info.offset:end]


# ---- GNU tar's view -------------------------------------------------------------------------------------
def gnu_listing(archive: Path) -> tuple[int, list[str]]:
    run = subprocess.run([TAR, "--zstd", "-tf", str(archive), "--quoting-style=literal"], capture_output=True,
                         env={**os.environ, "LC_ALL": "C.UTF-8"}, timeout=60)
    return run.returncode, run.stdout.decode("utf-8", "surrogateescape").split("\n")[:-1]  # not splitlines: \x1e


def gnu_extract_as_reviewer(archive: Path, home: Path) -> subprocess.CompletedProcess:
    """What the README tells a reviewer to run, `tar --zstd -xf ARCHIVE`, in an empty folder that is also HOME
    (where a downloaded archive often is): as root here, so GNU tar restores modes and owners too."""
    home.mkdir(parents=True, exist_ok=True)
    assert not any(home.iterdir()), f"{home} is not empty"
    return subprocess.run([TAR, "--zstd", "-xf", str(Path(archive).resolve())], cwd=home, capture_output=True,
                          env={**os.environ, "LC_ALL": "C.UTF-8", "HOME": str(home)}, timeout=60)


def gnu_extract(archive: Path, into: Path) -> int:
    into.mkdir(parents=True, exist_ok=True)
    return subprocess.run([TAR, "--zstd", "-xf", str(archive), "-C", str(into)], capture_output=True,
                          env={**os.environ, "LC_ALL": "C.UTF-8"}, timeout=60).returncode


def tree(root: Path, *, owners: bool = False) -> dict[str, tuple]:
    """Every entry under root: ("file", sha256) | ("directory",) | ("symlink", target); with `owners`, each
    followed by (mode & 0o7777, uid, gid, user name, group name) — a symlink's mode is the system's, left out."""
    import grp
    import pwd

    def name_of(lookup, number: int) -> str:
        try:
            return lookup(number)[0]
        except KeyError:
            return str(number)

    found: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = os.fsdecode(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("symlink", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("directory",)
            else:
                found[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
            if owners:
                st = os.lstat(path)
                mode = None if path.is_symlink() else st.st_mode & 0o7777
                found[rel] += (mode, st.st_uid, st.st_gid, name_of(pwd.getpwuid, st.st_uid),
                               name_of(grp.getgrgid, st.st_gid))
    return found
