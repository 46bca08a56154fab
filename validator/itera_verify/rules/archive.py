"""IV701–IV706: the sealed archive. IV701–IV705 come from the seal and the audit (they concern an archive, not
a package); IV706 is the one static check: a package holding `SEAL/` is refused before any work."""
from __future__ import annotations

from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import Package

RULES = [
    Rule("IV701", Severity.ERROR, "audit: a member's checksum does not match SEAL/SHA256SUMS",
         explain="The bytes of a member are not the bytes that were sealed: the archive was altered, damaged in "
                 "transfer, or is not a sealed archive at all. Also reported for a corrupt zstd stream, a file "
                 "that is not zstd, an archive whose SHA-256 differs from the `.sha256` file beside it, and a "
                 "recorded verdict of pass in SEAL/verification.json that the re-check contradicts. Ask the "
                 "sender for the archive again and compare its `.sha256` before anything else.",
         bad="params/control.json: sha256 9f2c… but SEAL/SHA256SUMS lists 41ab…",
         good="cd reviews-lora-2026-11 && sha256sum -c SEAL/SHA256SUMS   # every line OK"),
    Rule("IV702", Severity.ERROR, "audit: a member is missing from the archive, or present but not listed",
         explain="SEAL/SHA256SUMS and the archive must name the same files. A missing member means something "
                 "sealed is not delivered (a truncated archive reads this way: everything after the cut is "
                 "missing); an unlisted one was added after the seal and nothing vouches for it.",
         bad="predictions/extra.jsonl in the archive, not in SEAL/SHA256SUMS",
         good="the same set of file names on both sides"),
    Rule("IV703", Severity.ERROR, "audit: an unsafe member",
         explain="A member with an absolute name or `..`, outside the package folder, a symbolic or hard link "
                 "leaving the package, a device node, a fifo or an unknown member type could write outside "
                 "the folder it is extracted into, or shadow another file. It is never extracted. The seal "
                 "refuses to produce such members too (a fifo or device inside the package).",
         bad="../../home/reviewer/.bashrc   or   artifacts/base -> /etc",
         good="reviews-lora-2026-11/artifacts/latest -> checkpoint-400"),
    Rule("IV704", Severity.ERROR, "seal: a file changed between check and seal",
         explain="The seal reads each file once and compares its size, modification time and inode with what "
                 "discovery recorded, and its SHA-256 with any digest a check computed (config_sha256, "
                 "eval_ids_sha256). A file that differs was modified while the tool ran (a training process "
                 "still writing, a sync tool), so what was checked is not what would be sealed: nothing is "
                 "sealed. Stop the writer and run the command again.",
         bad="metrics/control.jsonl grew while the package was sealed",
         good="every process writing into the package has exited before `itera-verify OUTDIR`"),
    Rule("IV705", Severity.ERROR, "audit: the archive expands beyond the size limit",
         explain="The audit stops reading once the expanded size passes --max-size (default: 20 times the "
                 "archive's size, at least 1 GiB), so a decompression bomb costs a bounded amount of time and "
                 "disk. A real package expands about 1.3× (weights) to 10× (text). If the archive is genuine, "
                 "raise --max-size.",
         bad="a 40 KiB archive that expands to 50 GiB of zeros",
         good="itera-verify audit big.tar.zst --max-size 200000000000"),
    Rule("IV706", Severity.ERROR, "seal: the package already holds SEAL/",
         explain="`SEAL/` is where the archive keeps SHA256SUMS and verification.json; a package that already "
                 "has one (often an extracted archive being sealed again) would mix an old seal record with the "
                 "new one. Remove or rename the folder; the tool never writes inside the package itself.",
         bad="outdir/SEAL/SHA256SUMS", good="outdir/ without SEAL/"),
]


def check(package: Package) -> Iterator[Finding]:
    names = (*package.dirs, *package.files, *package.links, *package.specials)
    if "SEAL" in names:
        yield Finding("IV706", "SEAL", message="the package holds SEAL/, a name the sealed archive reserves")
