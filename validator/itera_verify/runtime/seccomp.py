"""A seccomp filter, through ctypes: this process, and whatever it starts, can no longer create a socket. It is the
layer Landlock lacks up to ABI 7: connecting to a unix socket with a path (an ssh-agent, a D-Bus or GPG agent)
and sending UDP. reload/confine.py installs it in each reload child beside Landlock; this module only speaks to
the kernel.

The filter is a BPF program of a few instructions, checked by the kernel on every system call:
- a call of another ABI than this machine's native one (i386 through `int 0x80` on x86_64, x32) is refused: the
  numbers below are the native table's, and a 32-bit `socketcall` would go round them;
- `socket()` is refused whatever the family (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, ...);
- `io_uring_setup()` is refused: an io_uring can open sockets without ever calling `socket()`.
`socketpair()` stays allowed: its two ends are connected to each other and reach nothing (asyncio and
multiprocessing make their wake-up pipes with it). A socket opened before the filter stays usable: the reload
child holds none (the zygote's is closed at the fork, a spawned child inherits no descriptor but its log).

Measured with strace over the example package's reloads: a forked reload child makes no socket call at all; a
spawned one makes two at import (urllib3's IPv6 probe, glibc's nscd lookup) and both fall back on refusal.
Refused calls fail with EACCES, as Landlock's refusals do.

A filter needs no_new_privs (set here; Landlock sets it too) and cannot be removed. Like Landlock it holds for
the calling thread and what it starts afterwards.
"""
from __future__ import annotations

import ctypes
import errno
import platform
import sys
from dataclasses import dataclass

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_GET_ACTION_AVAIL = 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
NR_OFFSET, ARCH_OFFSET = 0, 4  # struct seccomp_data: int nr; __u32 arch; ...
X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class Table:
    """One architecture: its audit id, and the numbers of the calls the filter names."""

    arch: int
    socket: int
    io_uring_setup: int
    seccomp: int
    x32: bool = False  # x86_64: numbers with the x32 bit set are another ABI under the same audit id


# Tested on x86_64; aarch64 and riscv64 use the generic table (include/uapi/asm-generic/unistd.h).
TABLES = {"x86_64": Table(0xC000003E, 41, 425, 317, x32=True),
          "aarch64": Table(0xC00000B7, 198, 425, 277), "arm64": Table(0xC00000B7, 198, 425, 277),
          "riscv64": Table(0xC00000F3, 198, 425, 277)}


@dataclass(frozen=True)
class Sockets:
    """What held: `refused` when the filter is in place, else `why_not`."""

    refused: bool = False
    why_not: str = ""

    def describe(self) -> str:
        """`seccomp: no sockets`, or `seccomp: none (why)` (the report's words)."""
        return "seccomp: no sockets" if self.refused else f"seccomp: none ({self.why_not})"


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _table() -> tuple[Table | None, str]:
    if not sys.platform.startswith("linux"):
        return None, f"seccomp is Linux's ({sys.platform} has none)"
    table = TABLES.get(platform.machine())
    return table, "" if table else f"the system call numbers are not known here for {platform.machine()}"


def available() -> tuple[bool, str]:
    """(whether this kernel takes a seccomp filter here, why not). Asks without installing anything."""
    table, why = _table()
    if table is None:
        return False, why
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    action = ctypes.c_uint32(SECCOMP_RET_ERRNO)
    if libc.syscall(table.seccomp, SECCOMP_GET_ACTION_AVAIL, 0, ctypes.byref(action)) == 0:
        return True, ""
    return False, f"this kernel takes no seccomp filter ({errno.errorcode.get(ctypes.get_errno(), '?')})"


def program(table: Table, refusal: int = errno.EACCES) -> list[tuple[int, int, int, int]]:
    """The filter: (code, jump if true, jump if false, k) per instruction; jumps count from the next one."""
    refuse = (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | refusal)
    allow = (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)
    checks = [(BPF_JGE_K, X32_SYSCALL_BIT)] if table.x32 else []
    checks += [(BPF_JEQ_K, table.socket), (BPF_JEQ_K, table.io_uring_setup)]
    steps = [(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET),
             (BPF_JEQ_K, 0, len(checks) + 2, table.arch),  # another ABI: to the refusal
             (BPF_LD_W_ABS, 0, 0, NR_OFFSET)]
    steps += [(code, len(checks) - index, 0, number) for index, (code, number) in enumerate(checks)]
    return steps + [allow, refuse]


def refuse_sockets() -> Sockets:
    """Install the filter on this process, for good. Returns what held; where it cannot (another system, a kernel
    without seccomp filters), nothing changes and `why_not` says why."""
    table, why = _table()
    if table is None:
        return Sockets(why_not=why)
    steps = program(table)
    filters = (_SockFilter * len(steps))(*(_SockFilter(*step) for step in steps))
    fprog = _SockFprog(len(steps), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return Sockets(why_not=f"no_new_privs: {errno.errorcode.get(ctypes.get_errno(), '?')}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return Sockets(why_not=f"PR_SET_SECCOMP: {errno.errorcode.get(ctypes.get_errno(), '?')}")
    return Sockets(refused=True)
