"""Linux Landlock, the kernel's unprivileged sandbox, through ctypes: a process restricts itself, for good, to the
folders it names (read-only or read-write) and to no TCP connect or bind. reload/confine.py says what a reload
child may touch; this module only speaks to the kernel.

Why a small module of our own and not a binding from PyPI (looked at 2026-12): `landlock` 1.0.0.dev5 is an alpha
with filesystem rules only (no network, no scopes); `landlockpy` 0.2.0 and `py-landlock` 0.1.1 are young
single-maintainer projects. The kernel interface is three system calls and a few bit masks, stable since Linux
5.13 and only ever extended; the ~150 lines below are reviewed with the rest of the tool's trust path and add no
dependency to every install of it.

ABI versions (what `landlock_create_ruleset(NULL, 0, VERSION)` answers) and what each adds:
1 (Linux 5.13) the filesystem rights; 2 REFER (moving a file between folders); 3 TRUNCATE; 4 TCP bind and connect;
5 IOCTL_DEV (ioctl on devices); 6 scopes (abstract unix sockets, signals to processes outside the sandbox);
7 audit logging. A right the kernel does not know is neither handled nor granted: on ABI 3 the filesystem holds
and the network is open, and `Confinement` says so.

The restriction applies to the calling thread and to what it starts afterwards: call it while the process has
one thread (`Confinement.other_threads` counts those it could not reach).

A rule holds on to an inode. procfs makes a new inode each time it looks a name up again, and drops the old one's
name under memory pressure: a rule on /proc/self then stops matching (measured: after `drop_caches`, reading
/proc/self/status was refused). So the opened paths stay open (`_PINNED`, close-on-exec) for the process's life.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import sys
from dataclasses import dataclass
from typing import Iterable

# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: the same numbers on every architecture the
# tool runs on (the unified table, since Linux 5.13).
SYSCALLS = {machine: (444, 445, 446) for machine in ("x86_64", "aarch64", "arm64", "riscv64", "ppc64le", "s390x")}
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights (include/uapi/linux/landlock.h).
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}  # the highest key <= ABI
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the only ones a rule on a file may grant
NET_ABI, SCOPE_ABI = 4, 6
BIND_TCP, CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

# What the callers grant.
READ = READ_FILE | READ_DIR
READ_EXECUTE = READ | EXECUTE
DEVICE = READ_FILE | WRITE_FILE | IOCTL_DEV
EVERYTHING = FS_BY_ABI[5]


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class Confinement:
    """What held: the ABI used, the filesystem rules, the network rules (TCP bind and connect refused), and the
    threads that already ran beside the caller and stay outside (ABI < 8 cannot reach them)."""

    abi: int = 0
    fs: bool = False
    net: bool = False
    other_threads: int = 0
    why_not: str = ""  # when nothing held: why

    @property
    def complete(self) -> bool:
        return self.fs and self.net and not self.other_threads

    def describe(self) -> str:
        """`landlock ABI 7: fs, net`, `landlock ABI 3: fs` or `none` (the report's words)."""
        parts = [name for name, held in (("fs", self.fs), ("net", self.net)) if held]
        if not parts:
            return "none"
        threads = f" ({self.other_threads} earlier thread(s) unconfined)" if self.other_threads else ""
        return f"landlock ABI {self.abi}: {', '.join(parts)}{threads}"


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> tuple[int, str]:
    """(the kernel's Landlock ABI, why 0 when it has none)."""
    numbers = SYSCALLS.get(platform.machine())
    if not sys.platform.startswith("linux"):
        return 0, f"Landlock is Linux's ({sys.platform} has none)"
    if numbers is None:
        return 0, f"Landlock's system calls are not known here for {platform.machine()}"
    abi = _libc().syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    if abi > 0:
        return int(abi), ""
    code = ctypes.get_errno()
    if code == errno.ENOSYS:
        return 0, "this kernel has no Landlock (ENOSYS)"
    if code == errno.EOPNOTSUPP:
        return 0, "Landlock is disabled on this kernel (EOPNOTSUPP: not in its lsm= list)"
    return 0, f"Landlock's version query failed ({os.strerror(code)})"


def handled_fs(abi: int) -> int:
    return FS_BY_ABI[max(key for key in FS_BY_ABI if key <= abi)] if abi >= 1 else 0


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def confine(read_only: Iterable[tuple[str, int]], read_write: Iterable[str], *, deny_tcp: bool = True,
            abi_cap: int | None = None) -> Confinement:
    """Restrict this process for good: each (path, rights) of `read_only` (READ, READ_EXECUTE, DEVICE, ...) and
    everything under each `read_write` folder; no TCP bind or connect (ABI 4+); no signal to, nor abstract
    socket of, a process outside (ABI 6+). A path that does not exist is skipped. `abi_cap`: use no more than
    that ABI (what an older kernel would enforce). Returns what held; `Confinement()` (none) where the kernel
    has no Landlock, with why."""
    abi, why = abi_version()
    if abi_cap is not None and abi > abi_cap:
        abi, why = abi_cap, f"limited to ABI {abi_cap}"
    if abi < 1:
        return Confinement(why_not=why)
    libc, (create, add, restrict) = _libc(), SYSCALLS[platform.machine()]
    fs = handled_fs(abi)
    net = (BIND_TCP | CONNECT_TCP) if deny_tcp and abi >= NET_ABI else 0
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= SCOPE_ABI else 0
    attr = _RulesetAttr(fs, net, scoped)
    size = 24 if abi >= SCOPE_ABI else 16 if abi >= NET_ABI else 8  # the struct as that ABI knows it
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return Confinement(abi, why_not=f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        rules = [(path, rights) for path, rights in read_only] + [(path, EVERYTHING) for path in read_write]
        try:
            for path, rights in rules:
                _allow(libc, add, ruleset, path, rights & fs)
        except OSError as exc:
            return Confinement(abi, why_not=str(exc))
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return Confinement(abi, why_not=f"no_new_privs: {os.strerror(ctypes.get_errno())}")
        threads = _threads()
        if libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return Confinement(abi, why_not=f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return Confinement(abi, fs=True, net=bool(net), other_threads=threads - 1)


_PINNED: list[int] = []  # the rules' paths, held open: see the module's docstring


def _allow(libc, add: int, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not on this machine (or not reachable): nothing to allow
    _PINNED.append(fd)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        rights &= FILE_RIGHTS
    if not rights:
        return
    attr = _PathBeneathAttr(rights, fd)
    if libc.syscall(add, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(attr),
                    ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
