"""What a process does as it ends, for tests/test_cli_fork.py to compare a forked command with a new interpreter:
`python -m tests.cli_exit_probe HOW`, where HOW is how it ends."""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time


def main(how: str) -> None:
    sys.stdout.write("buffered, no newline")  # only the interpreter's end flushes it (unless PYTHONUNBUFFERED)
    sys.stderr.write("to stderr\n")
    if how == "threads-and-atexit":
        # The interpreter joins the threads that are not daemons first, then runs the atexit handlers.
        atexit.register(lambda: print(" | atexit ran", flush=True))
        threading.Thread(target=lambda: (time.sleep(0.3), print(" | thread done", end=""))).start()
        print(" | main done", end="")
    elif how == "exit-status":
        sys.exit(3)
    elif how == "exit-message":
        sys.exit("a message instead of a status")
    elif how == "uncaught":
        raise RuntimeError("uncaught")
    elif how == "interrupted":
        raise KeyboardInterrupt
    elif how == "stdout-closed":  # a closed stream is not flushed at the end, nor is its closing an error
        sys.stdout.close()
    elif how == "unflushable":  # sys.stdout becomes a pipe nobody reads: its flush at the end fails (EPIPE)
        read, write = os.pipe()
        os.close(read)
        sys.stdout = open(write, "w")  # noqa: SIM115 - block-buffered, whatever PYTHONUNBUFFERED says
        sys.stdout.write("never read")


if __name__ == "__main__":
    main(sys.argv[1])
