"""The sealed-archive format: a POSIX tar stream compressed with zstd, and `SHA256SUMS` in sha256sum format.

This layer knows the format and checksums only; nothing about campaigns, rules or reports.
"""
from __future__ import annotations

from .errors import ArchiveError, Corrupt, NotZstd, TooLarge, Truncated
from .feeder import FileFeeder
from .reader import ArchiveReader, Member
from .sums import SumsError, format_line, format_sums, parse_sums
from .tarheader import tar_header
from .writer import ArchiveWriter, SizeChanged, worker_count

__all__ = [
    "ArchiveError", "ArchiveReader", "ArchiveWriter", "Corrupt", "FileFeeder", "Member", "NotZstd", "SizeChanged",
    "SumsError", "TooLarge", "Truncated", "format_line", "format_sums", "parse_sums", "tar_header", "worker_count",
]
