"""How the tool's processes end: at once, without the interpreter's teardown of every module and object.

As a Python program ends, the interpreter joins the threads that are not daemons, runs the atexit handlers and
flushes the standard streams (a stream it cannot flush makes the exit status 120); then it tears down every
module and object. Nothing outside the process sees that teardown, and it costs: ~50 ms of CPU at the end of an
`itera-verify` command (jsonschema, rich and the tool imported), about a second for a process that imported torch
and transformers, more in a forked process, where every page it touches is copied first.

- `end_program(body)`: the command line (`itera-verify`, `python -m itera_verify`): everything the interpreter's
  end does that a caller can see, in its order, then `os._exit`.
- `end_child(body)`: a reload child, forked or spawned: its output flushed, then `os._exit`. Never the atexit
  handlers: in a fork they are the zygote's, and a spawned child ends the same way, so both prove the same.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

FLUSH_FAILED = 120  # the interpreter's exit status when it cannot flush sys.stdout or sys.stderr


def exit_status(exc: SystemExit) -> int:
    """The status SystemExit ends the interpreter with; a code that is not an int is printed to stderr, status 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def end_program(body: Callable[[], object]) -> NoReturn:
    """Run `body` as a program's main module, then end the process as the interpreter ends one, but for the
    teardown: an uncaught exception printed by sys.excepthook (status 1), the threads that are not daemons
    joined, the atexit handlers run, the standard streams flushed, then os._exit with the status. An uncaught
    KeyboardInterrupt ends it by SIGINT, as the interpreter does. tests/test_cli_fork.py compares each ending
    with a new interpreter's."""
    interrupted = False
    try:
        body()
        status = 0
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - uncaught: printed as the interpreter prints it, status 1
        interrupted = isinstance(exc, KeyboardInterrupt)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status = 1
    threading._shutdown()  # what the interpreter's end calls first: joins every thread that is not a daemon
    atexit._run_exitfuncs()
    if not all([_flushed(sys.stdout), _flushed(sys.stderr)]):
        status = FLUSH_FAILED
    for replaced in (sys.__stdout__, sys.__stderr__):  # the teardown would flush them as it closes them
        if replaced not in (sys.stdout, sys.stderr):
            _flushed(replaced)  # a failure is said, as the teardown says it; the status stays
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


def end_child(body: Callable[[], object]) -> NoReturn:
    """Run `body` as a reload child's main, then end at once with its status (an int, else 0): its output
    flushed, no atexit handler, no teardown. SystemExit is read as the interpreter reads it (exit_status); any
    other exception is printed to the child's log, status 1."""
    code: object = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exit_status(exc)
    except BaseException:  # noqa: BLE001 - its words go to the child's log, its exit code to the runner
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 0)


def _flushed(stream) -> bool:
    """Flush a standard stream as the interpreter's end does: a missing or closed one is skipped; one that cannot
    be flushed is said on stderr in the interpreter's words (sys.unraisablehook's default), and False."""
    if stream is None or getattr(stream, "closed", False):
        return True
    try:
        stream.flush()
        return True
    except Exception as exc:  # noqa: BLE001 - the interpreter's words for a stream it cannot flush
        try:
            sys.stderr.write(f"Exception ignored in: {stream!r}\n")
            sys.stderr.write("".join(traceback.format_exception_only(exc)))
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - stderr itself is gone: nothing left to say it on
            pass
        return False
