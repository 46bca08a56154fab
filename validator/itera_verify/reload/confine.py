"""What a reload child may touch once it has confined itself (runtime/landlock.py, runtime/seccomp.py), before it
opens an artifact.

Read-only: the package (or the audit's extracted copy, or the resume proof's snapshot), the Hugging Face cache the
run was given, the Python installation (its prefixes, every folder on sys.path, the folders of the libraries
already mapped, LD_LIBRARY_PATH) and what the C libraries read on their own: the system's library and program
folders, a few files of /etc (the loader's cache, certificates, time zone, users), this process's /proc entry,
/proc's machine facts and /sys. On a GPU also the NVIDIA devices (read-write, with ioctl) and /proc/driver/nvidia.
Read-write: the child's private scratch folder alone (its job, log and result live there), where the libraries'
caches are pointed (SCRATCH_CACHES). Measured with strace over the example package's reloads and
tests/test_loaders_{files,image_audio,pipelines,timm,quantized}.py, the refusals a clean reload meets: tqdm's
POSIX semaphore in /dev/shm (it falls back to a thread lock), urllib3's IPv6 probe binding ::1 (it then assumes
no IPv6), a look at /proc/1/cgroup and /.dockerenv.
No TCP bind or connect (Landlock ABI 4+), no signal to a process outside and no abstract unix socket outside
(ABI 6+), no socket at all (seccomp: a unix socket with a path, UDP, netlink).

/dev/shm is not granted, not even on a GPU: a single-process reload shares no memory with another process (CUDA
writes there only as a client of an MPS server, NCCL only between ranks), and the audit may extract a package
there (flows/audit.py): a GPU child that could write it could rewrite another audit's files.

So a file of the package that makes a library write (an `offload_folder`), read (`~/.ssh`) or connect somewhere
meets the kernel's refusal (EACCES), whatever the loader let through. The child's cut_network (reload/child.py:
Python's connections, datagrams and name lookups refused) and HF_HUB_OFFLINE are the layers above.

Modes (`--confine`): "auto" confines as far as the kernel can and records what held (`none` where it has no
Landlock, `seccomp: none (why)` where no filter could be installed); "required" makes a machine without Landlock's
filesystem and network rules, or without seccomp filters, a usage error (exit 2, before any work), and a child that
could not confine itself fails its reload instead of loading.
"""
from __future__ import annotations

import functools
import glob
import os
import sys
from pathlib import Path

from ..model import UsageError
from ..options import CONFINEMENTS
from ..runtime import landlock, seccomp
from ..runtime.landlock import DEVICE, READ, READ_EXECUTE, WRITE_FILE, Confinement

MODES = CONFINEMENTS  # the run's option (options.py)
RECORD = "confinement"  # the file in the scratch folder where the child says what held (read by the runner)

# The libraries' caches and homes, pointed into the scratch folder: what they would write under ~ or /tmp.
SCRATCH_CACHES = {"XDG_CACHE_HOME": "cache", "HF_HOME": "hf-home", "CUDA_CACHE_PATH": "cuda-cache",
                  "TRITON_CACHE_DIR": "triton", "TRITON_HOME": "triton-home", "TORCHINDUCTOR_CACHE_DIR": "inductor",
                  "TORCH_EXTENSIONS_DIR": "torch-extensions", "MPLCONFIGDIR": "matplotlib"}

SYSTEM = (
    *((folder, READ_EXECUTE) for folder in ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")),
    *((name, READ) for name in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.preload",
                                "/etc/ssl", "/etc/pki", "/etc/ca-certificates", "/etc/localtime", "/etc/timezone",
                                "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/mime.types",
                                "/etc/os-release", "/etc/locale.alias", "/etc/gai.conf", "/etc/host.conf")),
    # This process's own entry (not the others'), and the machine facts the C runtimes read (CPUs, memory).
    *((name, READ) for name in ("/proc/self", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys",
                                "/proc/devices", "/proc/filesystems", "/sys")),
    *((name, READ | WRITE_FILE) for name in ("/dev/null", "/dev/zero", "/dev/full")),
    *((name, READ) for name in ("/dev/urandom", "/dev/random")),
)
GPU = (("/proc/driver/nvidia", READ), ("/dev/nvidia-caps", READ | DEVICE))
GPU_DEVICES = "/dev/nvidia*"


def check_mode(mode: str) -> None:
    """Before any work: a mode we do not know, or "required" on a machine that cannot confine a reload (no
    Landlock, one without its network rules, or no seccomp filter), is a usage error (exit 2)."""
    if mode not in MODES:
        raise UsageError(f"--confine {mode!r}: one of {', '.join(MODES)}")
    if mode != "required":
        return
    abi, why = landlock.abi_version()
    if abi < landlock.NET_ABI:
        held = why or f"Landlock ABI {abi} confines files but not TCP (ABI {landlock.NET_ABI} or later needed)"
        raise UsageError(f"--confine required: the reloads cannot be confined on this machine: {held}")
    filters, why = seccomp.available()
    if not filters:
        raise UsageError(f"--confine required: the reloads cannot be confined on this machine: {why}")


def scratch_variables(scratch: str | os.PathLike, hf_cache: str | None = None) -> dict[str, str]:
    """The variables that send the libraries' caches into `scratch`; the hub cache is the one given, else an
    empty one there (the child may read no other)."""
    folder = Path(scratch)
    found = {name: str(folder / sub) for name, sub in SCRATCH_CACHES.items()}
    found["HF_HUB_CACHE"] = hf_cache or str(folder / SCRATCH_CACHES["HF_HOME"] / "hub")
    return found


@functools.cache
def python_folders() -> tuple[str, ...]:
    """Where this interpreter imports from: its prefixes, its executable's folder, sys.path, LD_LIBRARY_PATH and
    the folders of the shared libraries already mapped (a library dlopens its neighbours lazily; a data file
    mapped by whoever forked this process is not a library). Found once per process: the zygote finds them
    after its imports (zygote.py), and its children, the same image, confine themselves without reading
    its 140 KB of /proc/self/maps again (some 10 ms of each child's start)."""
    found = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))]
    found += [entry for entry in sys.path if entry and os.path.isabs(entry)]
    found += [entry for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if os.path.isabs(entry)]
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if path.startswith("/") and ".so" in os.path.basename(path) and not path.endswith("(deleted)"):
                    found.append(os.path.dirname(path))
    except OSError:
        pass
    return tuple(sorted(set(found)))


def allowed(job: dict, scratch: str) -> tuple[list[tuple[str, int]], list[str]]:
    """(read-only paths with their rights, read-write folders) for `job`'s child."""
    read_only = list(SYSTEM) + [(folder, READ_EXECUTE) for folder in python_folders()]
    read_only += [(job[key], READ) for key in ("package_root", "hf_cache") if job.get(key)]
    if not str(job.get("device", "cpu")).startswith("cpu"):
        read_only += list(GPU) + [(device, DEVICE) for device in sorted(glob.glob(GPU_DEVICES))]
    return read_only, [scratch]


def describe(held: Confinement, sockets: seccomp.Sockets) -> str:
    """The report's words: `landlock ABI 7: fs, net; seccomp: no sockets`, `none (why); seccomp: no sockets`."""
    return held.describe() + (f" ({held.why_not})" if held.why_not else "") + "; " + sockets.describe()


def confine_child(job: dict, scratch: str) -> str:
    """Confine this process (the reload child, still single-threaded, nothing of the artifact opened) as `job`
    allows, and leave what held in the scratch folder (RECORD) for the runner, even if the reload then crashes.
    Under "required", anything short of a complete confinement stops the child (SystemExit) before it loads.
    Returns the words recorded."""
    read_only, read_write = allowed(job, scratch)
    held = landlock.confine(read_only, read_write)
    sockets = seccomp.refuse_sockets()
    words = describe(held, sockets)
    Path(scratch, RECORD).write_text(words, encoding="utf-8")
    if job.get("confine") == "required" and not (held.complete and sockets.refused):
        raise SystemExit(f"itera-verify: --confine required: this reload could not be confined: {words}")
    return words


def recorded(scratch: str | os.PathLike) -> str | None:
    """What the child of `scratch` said held (None: it never got that far)."""
    try:
        with open(Path(scratch, RECORD), encoding="utf-8", errors="replace") as handle:
            return handle.read(500).strip() or None
    except OSError:
        return None
