"""`python -m tests.no_landlock PROGRAM [ARGS...]`: run PROGRAM on a kernel that has no Landlock, as far as it and
every process it starts can tell.

A seccomp filter (installed here, inherited across fork and exec, impossible to remove) answers Landlock's three
system calls with ENOSYS, exactly what a kernel built without Landlock answers; EOPNOTSUPP instead (`--disabled`)
is what a kernel answers whose lsm= boot list leaves Landlock out. Nothing in the tool is told: its own ABI probe
meets the refusal, the same way it would on such a machine. Linux x86_64 and aarch64.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import shutil
import sys

LANDLOCK_SYSCALLS = (444, 445, 446)  # create_ruleset, add_rule, restrict_self (x86_64 and aarch64 alike)
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
ARCH_OFFSET, NR_OFFSET = 4, 0  # struct seccomp_data: int nr; __u32 arch; ...


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def refuse_landlock(code: int = errno.ENOSYS) -> None:
    """Install the filter on this process (and everything it starts from now on)."""
    count = len(LANDLOCK_SYSCALLS)
    program = [SockFilter(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET),
               SockFilter(BPF_JEQ_K, 0, count + 1, AUDIT_ARCH[platform.machine()]),  # another ABI: allow
               SockFilter(BPF_LD_W_ABS, 0, 0, NR_OFFSET)]
    for index, number in enumerate(LANDLOCK_SYSCALLS):
        program.append(SockFilter(BPF_JEQ_K, count - index, 0, number))  # to the ERRNO return
    program += [SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | code)]
    filters = (SockFilter * len(program))(*program)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    fprog = SockFprog(len(program), filters)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


if __name__ == "__main__":
    args = sys.argv[1:]
    code = errno.ENOSYS
    if args[:1] == ["--disabled"]:
        args, code = args[1:], errno.EOPNOTSUPP
    refuse_landlock(code)
    os.execv(shutil.which(args[0]) or args[0], args)
