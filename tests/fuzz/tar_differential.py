"""The differential against GNU tar 1.34: raw tar streams built from header pieces in and outside the seal's
profile (archive/profile.py); whenever the audit's extraction accepts a stream whole, GNU tar must list the
same members and extract the same tree, byte for byte. Used by tests/test_tar_differential.py (a bounded
number of examples) and by `make fuzz` (tests/fuzz/properties.py registers it)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from tests import tar_forms as tf

TOP = "top"
NAMES = [f"{TOP}/a.txt", f"{TOP}/b/c.json", f"{TOP}/b/", f"{TOP}/SEAL/SHA256SUMS", f"{TOP}/SEAL/zz", f"{TOP}/d/",
         f"{TOP}/" + "long-folder/" * 9 + "weights.safetensors", f"{TOP}/é/ünï.txt", f"{TOP}/bad\udcff.bin",
         f"{TOP}/" + "x" * 95 + "/y" * 4, f"{TOP}/e/./f", f"{TOP}//g", f"{TOP}/h/", "other/x", f"{TOP}/b/c.json/",
         ".local/lib/python3.11/site-packages/zz.pth", ".ssh/authorized_keys"]
# In the profile, but a mode or owner the seal never writes (canonical.py): GNU tar as root restores each.
FOREIGN = [{"mode": 0o4755}, {"mode": 0o2755}, {"mode": 0o1644}, {"mode": 0o777}, {"mode": 0o600}, {"uid": 65534},
           {"gid": 65534}, {"uname": "nobody"}, {"gname": "nogroup"}, {"uid": 0, "uname": "root"}]
TYPEFLAGS = [b"0", b"0", b"0", b"5", b"2", b"1", b"\0", b"7", b"S", b"D", b"M", b"V", b"X", b"6", b"A"]
PAX_RECORDS = [("path", None), ("linkpath", None), ("size", "3"), ("size", "0"), ("mtime", "1700000000"),
               ("mtime", "-1"), ("hdrcharset", "BINARY"), ("GNU.sparse.name", None), ("GNU.sparse.size", "7"),
               ("comment", "hello"), ("atime", "1"), ("uid", "0"), ("path", ""), ("size", "3 "),
               ("SCHILY.xattr.user.x", "y")]


def _name(draw) -> str:
    return draw(st.sampled_from(NAMES))


@st.composite
def _piece(draw, depth: int = 0) -> bytes:
    kind = draw(st.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink", "raw", "pax", "pax",
                                 "global", "long", "nested", "hidden", "foreign", "foreign"] if depth == 0
                                else ["file", "dir", "raw"]))
    name = _name(draw)
    data = draw(st.one_of(st.sampled_from([b"", b"abc", b"x" * 700, b"\x80\x02}q\x00."]),
                          _writer_members()))  # the headers of other members, hidden where data belongs
    if kind == "file":
        return tf.regular(name.rstrip("/") if draw(st.booleans()) else name, data)
    if kind == "dir":
        return tf.header(name.encode("utf-8", "surrogateescape"), b"5", mode=0o755)
    if kind == "symlink":
        return tf.header(name.rstrip("/").encode("utf-8", "surrogateescape"), b"2", mode=0o777,
                         linkname=draw(st.sampled_from([b"a.txt", b"../a.txt", b"b", b"", b"/etc"])))
    if kind == "hardlink":
        return tf.header(name.rstrip("/").encode("utf-8", "surrogateescape"), b"1",
                         linkname=draw(st.sampled_from([f"{TOP}/a.txt", f"{TOP}/b/c.json", "top/zz"])).encode())
    if kind == "foreign":
        from itera_verify.archive.tarheader import DIRECTORY, REGULAR, tar_header

        fields = draw(st.sampled_from(FOREIGN))
        if name.endswith("/"):
            return tf.with_fields(tar_header(name, DIRECTORY, mode=0o755), **fields)
        return tf.with_fields(tar_header(name, REGULAR, size=len(data)), **fields) + tf.padded(data)
    if kind == "hidden":  # a file whose size field readers may parse differently, other headers as its data
        field = draw(st.sampled_from([b"\x00%010o\0", b" %010o\0", b"%011o ", b"%o\0\0\0\0\0\0\0", b"0_%09o\0"]))
        size_field = (field % len(data)).ljust(12, b"\0")[:12] if b"%" in field else field
        return tf.header(f"{TOP}/hidden".encode(), b"0", size_field=size_field) + tf.padded(data)
    if kind == "raw":  # one header with a field outside the profile, and maybe data after it
        typeflag = draw(st.sampled_from(TYPEFLAGS))
        size_field = draw(st.sampled_from([None, None, b"\x00" + b"%010o\0" % len(data), b" %010o\0" % len(data),
                                           b"\x80" + len(data).to_bytes(11, "big"), b"%011o " % len(data)]))
        magic = draw(st.sampled_from([b"ustar\x0000", b"ustar\x0000", b"ustar  \0", bytes(8)]))
        prefix = draw(st.sampled_from([b"", b"", f"{TOP}/p".encode()]))
        block = tf.header(name.encode("utf-8", "surrogateescape"), typeflag, size=len(data), magic=magic,
                          prefix=prefix, size_field=size_field, mode=0o644)
        return block + tf.padded(data if draw(st.booleans()) else b"")
    if kind in ("pax", "global"):  # then a plain member, so that only the records decide
        records = []
        drawn = draw(st.lists(st.sampled_from(PAX_RECORDS), min_size=1, max_size=3, unique_by=lambda r: r[0]))
        for key, value in drawn:
            records.append((key, _name(draw) if value is None else value))
        return tf.extended(records, b"x" if kind == "pax" else b"g") + tf.regular(f"{TOP}/plain{len(data)}", data)
    if kind == "long":
        return tf.gnu_long(_name(draw), draw(st.sampled_from([b"L", b"K"])))
    inner = b"".join(draw(st.lists(_piece(depth + 1), min_size=1, max_size=2)))  # headers hidden as data
    return tf.regular(name, inner)


WRITER_NAMES = st.one_of(
    st.sampled_from(["a.txt", "b/c.json", "é/ünï.txt", "bad\udcff.bin", "x" * 95 + "/y" * 4, "sp ace\\back\nline",
                     "long-folder/" * 9 + "w.safetensors", "SEAL/SHA256SUMS", "SEAL/verification.json"]),
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="/\0"), min_size=1, max_size=120)
    .filter(lambda n: n not in (".", "..")))


@st.composite
def _writer_members(draw) -> bytes:
    """Members as the seal's writer writes them (ustar, or tarfile's PAX encoding): always in profile. Names
    are distinct; a hard link names a file written before it."""
    from itera_verify.archive.tarheader import DIRECTORY, HARDLINK, REGULAR, SYMLINK, tar_header

    out, files = [], []
    for rel in draw(st.lists(WRITER_NAMES, unique=True, max_size=6)):
        name = f"{TOP}/{rel}"
        kind = draw(st.sampled_from(["file", "file", "dir", "symlink"] + (["hardlink"] if files else [])))
        mtime = draw(st.sampled_from([0, 1_700_000_000, -1, 8 ** 11]))
        if kind == "file":
            data = draw(st.sampled_from([b"", b"abc", b"y" * 1000]))
            out.append(tar_header(name, REGULAR, size=len(data), mtime=mtime) + tf.padded(data))
            files.append(name)
        elif kind == "dir":
            out.append(tar_header(name + "/", DIRECTORY, mode=0o755, mtime=mtime))
        elif kind == "symlink":
            out.append(tar_header(name, SYMLINK, mode=0o777, mtime=mtime,
                                  linkname=draw(st.sampled_from(["a.txt", "b", "./a.txt", "a" * 120, "é"]))))
        else:
            out.append(tar_header(name, HARDLINK, linkname=draw(st.sampled_from(files))))
    return b"".join(out)


@st.composite
def tar_streams(draw) -> bytes:
    """A tar.zst: a top folder, then members as the writer writes them, or pieces built by hand (often
    outside the profile), then maybe the end blocks."""
    mode = draw(st.sampled_from(["writer", "one hand-made piece", "mixed"]))
    if mode == "writer":
        body = draw(_writer_members())
    elif mode == "one hand-made piece":  # in a stream the audit accepts otherwise: the piece alone decides
        body = draw(_writer_members()) + draw(_piece()) + draw(_writer_members())
    else:
        body = b"".join(draw(st.lists(st.one_of(_piece(), _writer_members()), max_size=6)))
    pieces = [tf.header(f"{TOP}/".encode(), b"5", mode=0o755), body]
    tail = draw(st.sampled_from([tf.END, tf.END, tf.END, tf.END + bytes(512 * 18), b"", tf.BLOCK * b"\0"]))
    return tf.zst(b"".join(pieces) + tail)


def audit_view(archive: Path, work: Path) -> tuple[list[tuple], dict[str, tuple]] | None:
    """What the audit's extraction accepts: (the members in order as (name, kind, mode, link target), the
    extracted tree), or None when it refuses anything (a stream error, a refused member, a SEAL/ member the
    seal never writes)."""
    from itera_verify.archive import ArchiveError, ArchiveReader
    from itera_verify.archive.extract import safe_extract
    from itera_verify.seal.plan import SEAL_LAYOUT

    root, side = work / "ours", work / "seal-side"
    root.mkdir()
    side.mkdir()
    with open(archive, "rb") as source:
        extraction = safe_extract(source, str(root), max_expanded=64 << 20, seal_side=str(side),
                                  reserved=SEAL_LAYOUT)
    if extraction.error is not None or extraction.refused or extraction.seal_extras:
        return None
    view = tf.tree(root)
    for rel, digest in extraction.files.items():
        if rel.startswith("SEAL/"):  # kept aside, never written into the tree: GNU tar writes them in place
            view[f"{extraction.top}/{rel}"] = ("file", digest)
    try:
        with open(archive, "rb") as source, ArchiveReader(source) as reader:
            members = [(member.name, member.kind, member.mode, member.linkname) for member in reader]
    except ArchiveError as error:  # extraction accepted what the reader alone refuses: a bug in itself
        raise AssertionError(f"the reader refuses what the extraction accepted: {error}") from None
    return members, view


AS_ROOT = os.geteuid() == 0


def compare_with_gnu(archive: Path, work: Path) -> bool:
    """Assert that what the audit accepts GNU tar lists and extracts the same way: run as the README tells a
    reviewer (`tar --zstd -xf`, in an empty folder that is also HOME; as root when the tests are), it writes
    nothing but `<top folder>/...`, with the bytes the audit hashed and, for every member, the mode its header
    gave (the one the seal writes, canonical.py) and owner root. Returns whether the audit accepted the archive
    (False: refused, nothing to compare)."""
    ours = audit_view(archive, work)
    if ours is None:
        return False
    members, view = ours
    names = [name for name, *_ in members]
    home = work / "gnu-home"
    listed_rc, listed = tf.gnu_listing(archive)
    extracted = tf.gnu_extract_as_reviewer(archive, home)
    assert listed_rc == 0 and extracted.returncode == 0, \
        f"GNU tar failed (list {listed_rc}, extract {extracted.returncode}: {extracted.stderr[-300:]!r})"
    if not any("\n" in name for name in names):
        assert listed == names, f"GNU tar lists {listed}, the audit read {names}"
    top = names[0].rstrip("/")  # the audit accepts only an archive that starts with its top folder
    assert os.listdir(home) == [top], f"GNU tar wrote {sorted(os.listdir(home))} where the reviewer runs it"
    gnu_view = tf.tree(home, owners=True)
    same = {rel: entry[:-5] for rel, entry in gnu_view.items()}
    same.pop(top + "/SEAL", None)  # the folder itself: the audit keeps SEAL/ out of its tree
    differ = sorted(set(same.items()) ^ set(view.items()))
    assert not differ, f"GNU tar and the audit differ on {differ[:6]}"
    for name, kind, mode, _ in members if AS_ROOT else ():  # (not root: tar applies the umask, owns as the user)
        rel, want = name.rstrip("/"), (None if kind == "symlink" else mode, 0, 0, "root", "root")
        assert gnu_view[rel][-5:] == want, f"GNU tar restored {rel} as {gnu_view[rel][-5:]}, the audit checked {want}"
    return True


def differential_property(ws, data: bytes) -> None:
    """`make fuzz`: one generated tar.zst, compared with GNU tar when the audit accepts it."""
    work = Path(tempfile.mkdtemp(prefix="tar-differential-", dir=getattr(ws, "scratch", None)))
    try:
        archive = work / "a.tar.zst"
        archive.write_bytes(data)
        compare_with_gnu(archive, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def available() -> bool:
    return os.access(tf.TAR, os.X_OK) and shutil.which("zstd") is not None
