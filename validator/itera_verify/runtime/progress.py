"""Progress events from long work (hashing, sealing, reloading). Workflows emit; the CLI decides how to show them."""
from __future__ import annotations


class Progress:
    """A sink that ignores everything: the library default, and what tests use."""

    def start(self, key: str, description: str, total: float | None = None, unit: str = "") -> None:
        pass

    def advance(self, key: str, amount: float = 1) -> None:
        pass

    def finish(self, key: str) -> None:
        pass

    def log(self, message: str) -> None:
        pass


NULL_PROGRESS = Progress()
