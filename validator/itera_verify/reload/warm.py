"""Zygotes kept warm across runs in one process, their lifetime owned by the caller, not by each run.

A run's zygote (zygote.py) imports its libraries once, for that run's children, and ends with the run. A process
that checks many packages (a test session, an API user verifying a folder of packages) pays those imports again
for every run. Inside `with warm_zygotes():` a run takes a warm zygote started with the same environment that
keeps the same libraries out (preloads.py) and already imports everything the run's children need, if one is
there, and gives its zygote back when it ends instead of ending it; the `with` ends them all. Where the warm
zygote of that environment lacks some of the run's imports, the run's new zygote imports both sets and replaces
it: a session that checks packages of several kinds (safetensors alone, a PEFT adapter, a checkpoint) converges
on one zygote per environment instead of starting one per kind in turn. Importing more than a run needs costs
that zygote's start only: each child is forked from it already imported, and the libraries kept out stay out.
Each child is still forked fresh from the zygote's untouched state: nothing a child of one run did reaches the
next run's (tests/test_zygote.py proves it for two children of one zygote).

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

KEPT = 2  # warm zygotes at most, one per key (each holds its libraries' memory, ~0.5 GiB with transformers)


class WarmZygotes:
    """The warm zygotes of a process, one per (environment, libraries kept out)."""

    def __init__(self, *, kept: int = KEPT, folder: str | None = None, ignore=()):
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple, Zygote] = OrderedDict()
        self.kept, self.ignore = kept, frozenset(ignore)
        # Their folders outlive any one run's temporary folder (a test's own, say).
        self.folder = folder or tempfile.mkdtemp(prefix="itera-warm-zygotes-")
        self.started = self.reused = 0

    def key(self, env: dict, preloads: Preloads) -> tuple:
        """What must be equal for a warm zygote to serve a run: the variables its libraries read at import, and the
        libraries it keeps out (a child of a run that keeps bitsandbytes out must not find it imported, nor a
        child of one that needs it find it refused). Its imports need only cover the run's (`Preloads.covers`)."""
        variables = tuple(sorted((k, v) for k, v in env.items() if k not in self.ignore))
        return variables, preloads.without

    def take(self, env: dict, preloads: Preloads, children: Launcher) -> Zygote | None:
        """A warm zygote for this run, now answering to its launcher `children`; None when none fits."""
        with self._lock:
            key = self.key(env, preloads)
            zygote = self._kept.get(key)
            if zygote is None or not zygote.preloads.covers(preloads):
                return None
            del self._kept[key]
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
        """A new zygote for this run: its imports, and those of the warm zygote of the same key it will replace."""
        key = self.key(env, preloads)
        with self._lock:
            kept = self._kept.get(key)
        if kept is not None:
            preloads = widened(kept.preloads, preloads)
        self.started += 1
        zygote = Zygote(children, env, preloads=preloads, folder=self.folder)
        zygote.warm_key = key
        return zygote

    def give_back(self, zygote: Zygote) -> None:
        """Keep it for the next run, in place of the one of its key (unless that one imports more while this one
        does not: two runs side by side); the oldest beyond `kept` is ended; a dead one is ended."""
        key = getattr(zygote, "warm_key", None)
        if key is None or not alive(zygote):
            zygote.close()
            return
        with self._lock:
            there = self._kept.get(key)
            if there is zygote:
                return
            if there is not None and alive(there) and there.preloads.covers(zygote.preloads) \
                    and not zygote.preloads.covers(there.preloads):
                evicted = [zygote]
            else:
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


def widened(kept: Preloads, run: Preloads) -> Preloads:
    """The imports of both, in order (the kept zygote's first), and both runs' architectures."""
    return Preloads((*kept.imports, *(name for name in run.imports if name not in kept.imports)), run.without,
                    (*kept.model_types, *(kind for kind in run.model_types if kind not in kept.model_types)))


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
    """The run's zygote: a warm one, else a new one (kept warm after the run where warm_zygotes is active); outside
    warm_zygotes, a session of the shared server of ITERA_RELOAD_ZYGOTES where it is set (shared.py)."""
    warm = _active
    if warm is None:
        shared = children.environment.reload_zygotes if children.environment is not None else None
        return Zygote(children, env, preloads=preloads, shared=shared)
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
