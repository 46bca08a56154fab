"""Where symbolic links lead: the one resolver of the tool, safe on hostile folders.

`os.path.realpath` resolves each link alone and walks the rest of its chain every time, so a folder of chains costs
the square of their length; Python 3.11's recurses once per link (RecursionError past about 1,000). The resolver
here walks with an explicit stack, remembers every link it resolved (each is resolved once, however many paths go
through it) and gives up on a link that needs more than MAX_HOPS links, as the kernel does (ELOOP): a reviewer's
tools could not open it either. Its work grows with the number of links and the length of their targets, never with
their square.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

MAX_HOPS = 40  # links followed in one lookup, the Linux kernel's limit (MAXSYMLINKS) before ELOOP
TOO_MANY = "too many levels of links"  # what the kernel says (ELOOP), in the words every finding uses


@dataclass(frozen=True)
class Resolved:
    """Where a path leads: `path` with every link followed (a missing part kept as written, as realpath does);
    `looped` when a link on the way needs more than MAX_HOPS links (or is a loop): `path` is then meaningless."""

    path: str
    looped: bool = False


_LOOPED = ("", MAX_HOPS + 1)


class LinkResolver:
    """Resolves paths on one folder tree, remembering what it learnt. Build one per walk: the tree must not change
    while it is used (an audit's extraction, a package being checked)."""

    def __init__(self, max_hops: int = MAX_HOPS):
        self.max_hops = max_hops
        self._entries: dict[str, str | None] = {}  # a path with no link above it -> its link target, None: not a link
        self._links: dict[str, tuple[str, int]] = {}  # a link (no link above it) -> (where it leads, links followed)

    def resolve(self, path: str | os.PathLike) -> Resolved:
        path = os.fspath(path)
        # Not abspath: it would take `link/..` away before the link is followed.
        resolved, hops = self._walk("/", _components(os.path.join(os.getcwd(), path)), 0)
        return Resolved("", True) if hops > self.max_hops else Resolved(resolved)

    def _target(self, path: str) -> str | None:
        if path not in self._entries:
            try:
                self._entries[path] = os.readlink(path) if stat.S_ISLNK(os.lstat(path).st_mode) else None
            except OSError:  # missing, or not a folder on the way: kept as written
                self._entries[path] = None
        return self._entries[path]

    def _walk(self, start: str, parts: list[str], hops: int) -> tuple[str, int]:
        """Follow `parts` (reversed) from `start`, a path with no link in it. Each link met is resolved on a frame
        of its own, pushed on an explicit stack (a chain of a million links needs no recursion); its result is kept,
        so the next path through it costs one look-up. Returns (where it leads, links followed)."""
        # A frame: [the link being resolved (None: the path asked for), where its walk is, parts left, links so far]
        stack: list[list] = [[None, start, parts, hops]]
        in_progress: set[str] = set()
        result: tuple[str, int] = _LOOPED
        while stack:
            frame = stack[-1]
            link, here, left, count = frame
            if count > self.max_hops or not left:
                stack.pop()
                result = _LOOPED if count > self.max_hops else (here, count)
                if link is not None:
                    in_progress.discard(link)
                    self._links[link] = result
                if stack:  # the frame below met this link: it continues from where the link leads
                    below = stack[-1]
                    below[1], below[3] = result[0], below[3] + result[1]
                continue
            name = left.pop()
            if name == "..":
                frame[1] = os.path.dirname(here)
                continue
            candidate = os.path.join(here, name)
            known = self._links.get(candidate)
            if known is not None:
                frame[1], frame[3] = known[0], count + known[1]
                continue
            target = self._target(candidate)
            if target is None:
                frame[1] = candidate
                continue
            if candidate in in_progress:  # a loop: every link on it needs endless links
                frame[3] = self.max_hops + 1
                continue
            in_progress.add(candidate)
            stack.append([candidate, "/" if target.startswith("/") else here, _components(target), 1])
        return result


def _components(path: str) -> list[str]:
    """The parts of `path` to walk, reversed (the walk pops from the end); empty and `.` parts are no step."""
    return [part for part in reversed(path.split("/")) if part not in ("", ".")]


def real_path(path: str | os.PathLike) -> str:
    """os.path.realpath, bounded: a path through more than MAX_HOPS links stays as written, so that opening it
    fails with ELOOP as the kernel decides."""
    resolved = LinkResolver().resolve(path)
    return os.path.abspath(os.fspath(path)) if resolved.looped else resolved.path


__all__ = ["MAX_HOPS", "TOO_MANY", "LinkResolver", "Resolved", "real_path"]
