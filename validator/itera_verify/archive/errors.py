"""What can be wrong with an archive stream, as the reader reports it (never a bare library exception)."""
from __future__ import annotations


class ArchiveError(Exception):
    kind = "corrupt"


class NotZstd(ArchiveError):
    kind = "not-zstd"


class Truncated(ArchiveError):
    kind = "truncated"


class Corrupt(ArchiveError):
    kind = "corrupt"


class TooLarge(ArchiveError):
    kind = "too-large"


class TooManyMembers(ArchiveError):
    kind = "too-many"
