"""Progress events from long work (hashing, sealing, reloading). Workflows emit; the CLI decides how to show them.

A piece of work (`key`) starts, advances, and either finishes or is abandoned: a seal thrown away because the
checks failed is abandoned, never finished, so no sink says "done" for it. Work made of named items (the
artifacts of the reload) also says which item began and which ended, so a sink can name what is in progress.
"""
from __future__ import annotations


class Progress:
    """A sink that ignores everything: the library default, and what tests use."""

    def start(self, key: str, description: str, total: float | None = None, unit: str = "") -> None:
        pass

    def advance(self, key: str, amount: float = 1) -> None:
        pass

    def began(self, key: str, item: str) -> None:
        """One named item of `key` (an artifact being reloaded) began."""

    def ended(self, key: str, item: str, ok: bool = True) -> None:
        """That item ended (`ok` False: it failed); advance() still counts it."""

    def waiting(self, key: str, what: str | None) -> None:
        """`key` waits for something before its items can run (`what`, in words; None: the wait is over). The
        time left is reckoned from the end of the wait: a one-off cost is not spread over every item."""

    def finish(self, key: str) -> None:
        pass

    def abandon(self, key: str, why: str) -> None:
        """The work stopped before its end and its result is thrown away (`why`, in words). A key already finished
        or never started is left as it is. Sinks that do not say more finish it."""
        self.finish(key)

    def log(self, message: str) -> None:
        pass


NULL_PROGRESS = Progress()
