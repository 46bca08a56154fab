"""The forked-function start of the launcher (launcher.py owns it), under the names its callers import."""
from __future__ import annotations

from .launcher import (INTERRUPTS, SIGNAL_POLL_SECONDS, TOOL_THREADS, ChildLost, ForkAfterThreads, Forked, can_fork,
                       tool_threads_running)

__all__ = ["INTERRUPTS", "SIGNAL_POLL_SECONDS", "TOOL_THREADS", "ChildLost", "ForkAfterThreads", "Forked", "can_fork",
           "tool_threads_running"]
