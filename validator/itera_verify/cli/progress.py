"""How the command line shows progress: rich bars on a terminal, plain lines in a log, nothing with -q.

Everything goes to standard error, so `--format json` keeps standard output one JSON document. Every value
from the package (an artifact id, a run id) is shown on one line with its control characters escaped. Both name the
artifact being reloaded and the time left; abandoned work (a seal the failed checks threw away) says so, never
"done". -v: every 10 % instead of 25 %, and a line with the time of each artifact's reload.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import IO, Iterator

from rich.console import Console
from rich.progress import (BarColumn, Progress as RichBars, ProgressColumn, SpinnerColumn, Task, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Column
from rich.text import Text

from ..runtime.progress import NULL_PROGRESS, Progress
from ..report.words import clean, human_bytes, plain_lines


def amount(value: float, unit: str) -> str:
    if unit == "B":
        return human_bytes(value)
    return f"{int(value)} {unit}".rstrip()


class AmountColumn(ProgressColumn):
    """`1.2 GiB / 3.4 GiB` for bytes, `2 / 4 artifacts` for counts: the unit travels with the task."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True))

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "")
        done = human_bytes(task.completed) if unit == "B" else str(int(task.completed))
        if task.total is None:
            return Text(f"{done} {'' if unit == 'B' else unit}".rstrip(), style="progress.download")
        total = amount(task.total, unit)
        return Text(f"{done} / {total}", style="progress.download")


class BarsProgress(Progress):
    """Rich progress bars with elapsed and remaining time; log lines print above the bars."""

    def __init__(self, stream: IO[str]) -> None:
        self.console = Console(file=stream, highlight=False, markup=False, emoji=False)
        self.bars = RichBars(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(bar_width=30),
                             AmountColumn(), TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("left"),
                             TimeRemainingColumn(), console=self.console)
        self.tasks: dict[str, int] = {}
        self.descriptions: dict[str, str] = {}
        self.items: dict[str, list[str]] = {}  # key -> items in progress, in the order they began
        self.ended_keys: set[str] = set()
        self.lock = threading.Lock()  # parallel reloads report from several threads

    def start(self, key: str, description: str, total: float | None = None, unit: str = "") -> None:
        with self.lock:
            self.descriptions[key], self.items[key] = clean(description), []
            self.ended_keys.discard(key)
            if key in self.tasks:
                self.bars.reset(self.tasks[key], total=total, description=clean(description), unit=unit)
            else:
                self.tasks[key] = self.bars.add_task(clean(description), total=total, unit=unit)

    def _describe(self, key: str, suffix: str | None = None) -> None:
        items = self.items.get(key) or []
        shown = suffix if suffix is not None else ", ".join(items)
        text = self.descriptions.get(key, key) + (f": {shown}" if shown else "")
        self.bars.update(self.tasks[key], description=text)

    def began(self, key: str, item: str) -> None:
        with self.lock:
            if key in self.tasks and key not in self.ended_keys:
                self.items.setdefault(key, []).append(clean(item))
                self._describe(key)

    def ended(self, key: str, item: str, ok: bool = True) -> None:
        with self.lock:
            if key in self.tasks and clean(item) in self.items.get(key, []):
                self.items[key].remove(clean(item))
                self._describe(key)

    def advance(self, key: str, amount: float = 1) -> None:
        if key in self.tasks:
            self.bars.advance(self.tasks[key], amount)

    def waiting(self, key: str, what: str | None) -> None:
        with self.lock:  # rich paces from its samples, taken as items end: the wait is not spread over them
            if key in self.tasks and key not in self.ended_keys:
                self._describe(key, clean(what) if what is not None else None)

    def finish(self, key: str) -> None:
        with self.lock:
            task_id = self.tasks.get(key)
            if task_id is None or key in self.ended_keys:
                return
            self.ended_keys.add(key)
            self.items[key] = []
            self._describe(key)
            task = next((t for t in self.bars.tasks if t.id == task_id), None)
            if task is not None:
                self.bars.update(task_id, total=task.completed if task.total is None else task.total,
                                 completed=task.total if task.total is not None else task.completed)
            self.bars.stop_task(task_id)

    def abandon(self, key: str, why: str) -> None:
        """The bar stays where the work stopped, and says why: an abandoned seal is never shown complete."""
        with self.lock:
            task_id = self.tasks.get(key)
            if task_id is None or key in self.ended_keys:
                return
            self.ended_keys.add(key)
            self._describe(key, clean(why))
            self.bars.stop_task(task_id)

    def log(self, message: str) -> None:
        self.bars.console.print(Text(clean(message)), soft_wrap=True)


class LinesProgress(Progress):
    """Plain lines for logs and CI: a start line, periodic percentages for bytes, a finish line with the time."""

    def __init__(self, stream: IO[str], verbose: bool = False) -> None:
        self.stream = stream
        self.verbose = verbose
        self.step = 10 if verbose else 25  # percent between two lines about the same work
        self.lock = threading.Lock()  # parallel reloads report from several threads
        self.tasks: dict[str, dict] = {}

    def _say(self, text: str) -> None:
        self.stream.write(plain_lines(clean(text)) + "\n")  # one line, never a CI runner's command
        self.stream.flush()

    def start(self, key: str, description: str, total: float | None = None, unit: str = "") -> None:
        with self.lock:
            self.tasks[key] = {"description": description, "total": total, "unit": unit, "done": 0.0,
                               "started": time.monotonic(), "next": self.step, "items": {}, "begun": 0}
            size = f" ({amount(total, unit)})" if total is not None else ""
            self._say(f"{description}: started{size}")

    def advance(self, key: str, amount_done: float = 1) -> None:
        with self.lock:
            task = self.tasks.get(key)
            if task is None:
                return
            task["done"] += amount_done
            total, unit = task["total"], task["unit"]
            elapsed = time.monotonic() - task["started"]
            if unit != "B":  # counted work (artifacts) is slow and short: every item is worth a line
                of = f"/{int(total)}" if total else ""
                self._say(f"{task['description']}: {int(task['done'])}{of} {unit}, {elapsed:.1f} s"
                          f"{time_left(task)}".rstrip())
            elif total:
                percent = 100 * task["done"] / total
                if percent >= task["next"] and percent < 100:
                    task["next"] = (int(percent) // self.step + 1) * self.step
                    self._say(f"{task['description']}: {int(percent)}% ({human_bytes(task['done'])} of "
                              f"{human_bytes(total)}, {elapsed:.1f} s{time_left(task)})")

    def waiting(self, key: str, what: str | None) -> None:
        with self.lock:
            task = self.tasks.get(key)
            if task is None:
                return
            if what is not None:
                task["waiting"] = time.monotonic()
                self._say(f"{task['description']}: {what}")
                return
            since = task.pop("waiting", None)
            if since is None:
                return
            # The pace (time left) is reckoned from here, over the items done from here.
            task["paced_from"], task["paced_done"] = time.monotonic(), task["done"]
            if task["paced_from"] - since >= 1:
                self._say(f"{task['description']}: ready after {task['paced_from'] - since:.1f} s")

    def began(self, key: str, item: str) -> None:
        with self.lock:
            task = self.tasks.get(key)
            if task is None:
                return
            task["items"][item] = time.monotonic()
            task["begun"] += 1
            of = f" of {int(task['total'])}" if task["total"] else ""
            self._say(f"{task['description']}: {item} started ({task['begun']}{of}{time_left(task)})")

    def ended(self, key: str, item: str, ok: bool = True) -> None:
        with self.lock:
            task = self.tasks.get(key)
            began = task["items"].pop(item, None) if task is not None else None
            if began is not None and self.verbose:
                self._say(f"{task['description']}: {item} {'done' if ok else 'FAILED'} in "
                          f"{time.monotonic() - began:.1f} s")

    def finish(self, key: str) -> None:
        with self.lock:
            task = self.tasks.pop(key, None)
            if task is not None:
                self._say(f"{task['description']}: done, {amount(task['done'], task['unit'])} in "
                          f"{time.monotonic() - task['started']:.1f} s")

    def abandon(self, key: str, why: str) -> None:
        with self.lock:
            task = self.tasks.pop(key, None)
            if task is not None:
                self._say(f"{task['description']}: {why}, after {time.monotonic() - task['started']:.1f} s")

    def log(self, message: str) -> None:
        with self.lock:
            self._say(message)


def time_left(task: dict) -> str:
    """`, about 12 s left` from the pace so far (since a wait ended: waiting()); nothing before the first part is
    done or once all is."""
    done, total = task["done"], task["total"]
    paced_done = task.get("paced_done", 0.0)
    if not total or done <= paced_done or done >= total:
        return ""
    left = (time.monotonic() - task.get("paced_from", task["started"])) * (total - done) / (done - paced_done)
    return f", about {left:.0f} s left" if left >= 1 else ", under 1 s left"


def is_terminal(stream: IO[str]) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


@contextmanager
def make_progress(quiet: bool = False, verbose: bool = False, stream: IO[str] | None = None) -> Iterator[Progress]:
    """The progress sink for one command: nothing with -q, bars on a terminal, lines otherwise."""
    stream = stream or sys.stderr
    if quiet:
        yield NULL_PROGRESS
    elif is_terminal(stream):
        progress = BarsProgress(stream)
        with progress.bars:
            yield progress
    else:
        yield LinesProgress(stream, verbose)
