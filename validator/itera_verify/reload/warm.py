"""Zygotes kept warm across runs in one process, their lifetime owned by the caller, not by each run.

A run's zygote (zygote.py) imports its libraries once, for that run's children, and ends with the run. A process
that checks many packages (a test session, an API user verifying a folder of packages) pays those imports again
for every run. Inside `with warm_zygotes():` a run takes a warm zygote started with the same environment and the
same imports (preloads.py), if one is there, and gives its zygote back when it ends instead of ending it; the
`with` ends them all. Each child is still forked fresh from the zygote's untouched state: nothing a child of
one run did reaches the next run's (tests/test_zygote.py proves it for two children of one zygote).

    from itera_verify.reload import warm_zygotes
    with warm_zygotes():
        for package in packages:
            verify(package, options)

`ignore`: variables of the environment that do not tell two runs apart (a test runner's current test name).
"""
from __future__ import annotations

import tempfile
import threading
from collections import OrderedDict
from contextlib import contextmanager

from ..runtime.launcher import Launcher
from .preloads import BASE, Preloads, imports_for
from .zygote_client import Zygote, can_fork

KEPT = 2  # warm zygotes at most (each holds its libraries' memory, ~0.5 GiB with transformers)


class WarmZygotes:
    """The warm zygotes of a process, by (environment, imports, libraries kept out)."""

    def __init__(self, *, kept: int = KEPT, folder: str | None = None, ignore=()):
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple, Zygote] = OrderedDict()
        self.kept, self.ignore = kept, frozenset(ignore)
        # Their folders outlive any one run's temporary folder (a test's own, say).
        self.folder = folder or tempfile.mkdtemp(prefix="itera-warm-zygotes-")
        self.started = self.reused = 0

    def key(self, env: dict, preloads: Preloads) -> tuple:
        variables = tuple(sorted((k, v) for k, v in env.items() if k not in self.ignore))
        return variables, preloads.imports, preloads.without

    def take(self, env: dict, preloads: Preloads, children: Launcher) -> Zygote | None:
        """A warm zygote for this run, now answering to its launcher `children`; None when none fits."""
        with self._lock:
            zygote = self._kept.pop(self.key(env, preloads), None)
        if zygote is None:
            return None
        if not alive(zygote):
            zygote.close()
            return None
        zygote.children = children
        for client in (zygote.client, zygote._starting):
            if client is not None:
                client.children = children
        self.reused += 1
        return zygote

    def start(self, env: dict, preloads: Preloads, children: Launcher) -> Zygote:
        self.started += 1
        zygote = Zygote(children, env, preloads=preloads, folder=self.folder)
        zygote.warm_key = self.key(env, preloads)
        return zygote

    def give_back(self, zygote: Zygote) -> None:
        """Keep it for the next run (the oldest beyond `kept` is ended); a dead one is ended."""
        key = getattr(zygote, "warm_key", None)
        if key is None or not alive(zygote):
            zygote.close()
            return
        with self._lock:
            if self._kept.get(key) is zygote:
                return
            evicted = [old for old in [self._kept.pop(key, None)] if old is not None]
            self._kept[key] = zygote
            while len(self._kept) > self.kept:
                evicted.append(self._kept.popitem(last=False)[1])
        for old in evicted:
            old.close()

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
        for zygote in kept:
            zygote.close()


def alive(zygote: Zygote) -> bool:
    """Still importing, or ready and answering."""
    client = zygote.client or zygote._starting
    return client is not None and not client.dead and client.proc is not None and client.proc.poll() is None


_active: WarmZygotes | None = None


def active() -> WarmZygotes | None:
    return _active


@contextmanager
def warm_zygotes(*, kept: int = KEPT, folder: str | None = None, ignore=()):
    """Runs inside share warm zygotes; leaving ends them. Nested: the outer one serves."""
    global _active
    if _active is not None:
        yield _active
        return
    _active = WarmZygotes(kept=kept, folder=folder, ignore=ignore)
    try:
        yield _active
    finally:
        warm, _active = _active, None
        warm.close()


@contextmanager
def suspended():
    """Runs inside start and end their own zygotes, as without warm_zygotes (a test that watches one's life)."""
    global _active
    saved, _active = _active, None
    try:
        yield
    finally:
        _active = saved


def obtain(env: dict, preloads: Preloads, children: Launcher) -> Zygote:
    """The run's zygote: a warm one, else a new one (kept warm after the run where warm_zygotes is active)."""
    warm = _active
    if warm is None:
        return Zygote(children, env, preloads=preloads)
    return warm.take(env, preloads, children) or warm.start(env, preloads, children)


def release(zygote: Zygote, *, failed: bool = False) -> None:
    """The run is done with its zygote: kept warm where warm_zygotes is active (unless the run failed), else
    ended."""
    warm = _active
    if warm is None or failed or getattr(zygote, "warm_key", None) is None:
        zygote.close()
    else:
        warm.give_back(zygote)


def start_zygote(isolation: str, children: Launcher, env: dict, needed: bool = True,
                 model_types=(), started: Zygote | None = None, light: bool = False,
                 preloads: Preloads | None = None) -> Zygote | None:
    """The run's zygote (`started`: one started earlier, maybe still importing; else a warm one, or a new one),
    ready; None where children are spawned (asked for, no fork, nothing to run, or the zygote is not safe to fork
    from)."""
    if not can_fork(isolation) or not needed:
        if started is not None:
            release(started)
        return None
    if preloads is None:
        preloads = Preloads(BASE if light else imports_for(["peft"]), (), tuple(model_types))
    zygote = started or obtain(env, preloads, children)
    zygote.wait_ready()
    if zygote.client is None:
        zygote.close()
        if isolation == "fork" and not children.stop.is_set():
            from ..model import UsageError

            raise UsageError(f"--isolation fork: {zygote.why}")
        children.fork_refused = zygote.why  # each spawned result says why it was not forked
        return None
    return zygote
