"""The process environment, read once per run: at the entry point (the command line, or a `verify`/`audit` call
through flows/config.py `settle`) and handed down, so that every stage of one run sees the same settings, the
report can say which applied, and the reload children get the same variables through the launcher.

The settings the tool itself reads are listed here, once. So is what a child process is handed (CHILD_VARIABLES,
CHILD_PREFIXES): what the libraries need to start and to find the machine's libraries and GPUs, and nothing else.
No cloud key, no token, no `SSH_AUTH_SOCK`, no proxy, no `XDG_RUNTIME_DIR`: a package that ever got code to run
in a reload child finds none of them. Not even `PATH` (a subprocess finds /bin and /usr/bin without it), nor
torch's own switches (`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` would turn `weights_only=True` off).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

RELOAD_HOST_MEMORY = "ITERA_RELOAD_HOST_MEMORY"  # the host memory limit of every reload child (reload/limits.py)
RELOAD_GPU_MEMORY = "ITERA_RELOAD_GPU_MEMORY"  # a cap on the GPU memory a placement counts (reload/placement.py)
RELOAD_ZYGOTES = "ITERA_RELOAD_ZYGOTES"  # a private folder of zygotes shared by many runs (reload/shared.py)
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # which GPUs, in CUDA's order (reload/gpus.py)
HF_HUB_CACHE, HF_HOME = "HF_HUB_CACHE", "HF_HOME"  # the hub cache (runtime/hfcache.py)
TEMP_FOLDERS = ("TMPDIR", "TEMP", "TMP")  # a temporary folder the user chose (the audit's scratch, IV2xx paths)
GITHUB_ACTIONS, GITHUB_WORKSPACE = "GITHUB_ACTIONS", "GITHUB_WORKSPACE"  # the default format; annotation paths
NO_COLOR = "NO_COLOR"
AWS_ENDPOINTS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # an S3-compatible store (push/store.py)
RAY_ADDRESS = "RAY_ADDRESS"  # audit --engine ray: an existing Ray cluster (flows/batch_ray.py)
RESULTS_KEY = "ITERA_RESULTS_KEY"  # the reviewer's key file, as --results-key (runtime/reviewer_key.py)
XDG_CONFIG_HOME = "XDG_CONFIG_HOME"  # where the reviewer's key file is by default

SETTINGS = (RELOAD_HOST_MEMORY, RELOAD_GPU_MEMORY, RELOAD_ZYGOTES, CUDA_VISIBLE_DEVICES, HF_HUB_CACHE, HF_HOME,
            *TEMP_FOLDERS, GITHUB_ACTIONS, GITHUB_WORKSPACE, NO_COLOR, *AWS_ENDPOINTS, RAY_ADDRESS, RESULTS_KEY,
            XDG_CONFIG_HOME)

# What a child process (a reload child, the zygote, the resume proof) is handed of the environment; the caller
# adds its own settings (reload/runner.py child_env: TMPDIR and the caches in the scratch folder, the hub cache,
# HF_HUB_OFFLINE, PYTHONPATH).
CHILD_VARIABLES = (
    "HOME", "USER", "LOGNAME",  # names, not secrets: what getpass and expanduser read before /etc/passwd
    "LANG", "LANGUAGE", "TZ",  # locale and time (LC_* below)
    "LD_LIBRARY_PATH", "LD_PRELOAD", "GLIBC_TUNABLES",  # the dynamic loader and glibc's malloc (MALLOC_* below)
    "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH",  # what a spawned child imports
    "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONFAULTHANDLER", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONMALLOC",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK",  # torch's device allocator
    "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",  # thread pools (OMP_* below)
)
# CUDA_VISIBLE_DEVICES, CUDA_HOME, CUDA_MODULE_LOADING, ...; OpenMP's and MKL's thread settings; the tool's own.
CHILD_PREFIXES = ("LC_", "CUDA_", "OMP_", "KMP_", "MKL_", "MALLOC_", "ITERA_")


# Never handed down, whatever its prefix: the way to the shared zygotes' servers, which fork unconfined processes;
# the reviewer's key file, which no reload has a use for.
NEVER_TO_CHILDREN = (RELOAD_ZYGOTES, RESULTS_KEY)

TOOL_FOLDER = str(Path(__file__).resolve().parents[2])  # the folder holding this copy of the itera_verify package


def tool_first(pythonpath: str | None) -> str:
    """PYTHONPATH for a child that imports this copy of the tool: its folder first, and only there. Once, so that a
    run started by another run (a command a test or a script runs, the recorder's proof) hands its zygote the path
    its parent would: the same zygote (reload/shared.py keys a server by its environment)."""
    rest = [entry for entry in pythonpath.split(os.pathsep) if entry != TOOL_FOLDER] if pythonpath else []
    return os.pathsep.join([TOOL_FOLDER, *rest])


def handed_to_children(name: str) -> bool:
    """A variable a child process is given (CHILD_VARIABLES, CHILD_PREFIXES, not NEVER_TO_CHILDREN)."""
    return (name in CHILD_VARIABLES or name.startswith(CHILD_PREFIXES)) and name not in NEVER_TO_CHILDREN


@dataclass(frozen=True)
class Environment:
    """A frozen copy of the environment variables at the entry point, and the installed torch's version (read
    with them: which torch unpickles is a fact of the machine, runtime/torchsafety.py)."""

    variables: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    torch_version: str | None = None

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> "Environment":
        from .torchsafety import installed_torch

        return cls(MappingProxyType(dict(os.environ if environ is None else environ)), installed_torch())

    @property
    def torch_advisory(self) -> str | None:
        """One line when the installed torch's weights_only unpickler has a published hole (torchsafety.py)."""
        from .torchsafety import advisory

        return advisory(self.torch_version)

    def get(self, name: str) -> str | None:
        return self.variables.get(name)

    def __reduce__(self):  # to a Ray task by value: the read-only view goes as a dict
        return (_rebuild, (dict(self.variables), self.torch_version))

    def applied(self) -> dict[str, str]:
        """The settings the tool reads that are set (the report's `configuration.environment`)."""
        return {name: self.variables[name] for name in SETTINGS if name in self.variables}

    def for_child(self, **overrides: str) -> dict[str, str]:
        """The variables a child process starts with: those of these it is handed (CHILD_VARIABLES), then
        `overrides`."""
        return {**{k: v for k, v in self.variables.items() if handed_to_children(k)}, **overrides}

    def for_tool(self, **overrides: str) -> dict[str, str]:
        """A child that runs the tool itself (the resume proof, flows/proof.py): a child's variables, plus the
        settings the tool reads (SETTINGS: the hub cache, the temporary folder, the reload limits)."""
        return {**self.for_child(), **self.applied(), **overrides}

    @property
    def reload_host_memory(self) -> str | None:
        return self.get(RELOAD_HOST_MEMORY)

    @property
    def reload_gpu_memory(self) -> str | None:
        return self.get(RELOAD_GPU_MEMORY)

    @property
    def reload_zygotes(self) -> str | None:
        return self.get(RELOAD_ZYGOTES) or None

    @property
    def cuda_visible_devices(self) -> str | None:
        return self.get(CUDA_VISIBLE_DEVICES)

    @property
    def hub_cache(self) -> Path:
        """HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub (huggingface_hub's own order)."""
        if self.get(HF_HUB_CACHE):
            return Path(self.variables[HF_HUB_CACHE]).expanduser().absolute()
        if self.get(HF_HOME):
            return Path(self.variables[HF_HOME]).expanduser().absolute() / "hub"
        return Path("~/.cache/huggingface/hub").expanduser()

    @property
    def temp_folder_chosen(self) -> bool:
        """The user chose a temporary folder (TMPDIR, TEMP or TMP, Python's own order)."""
        return any(self.get(name) for name in TEMP_FOLDERS)

    @property
    def tmpdir(self) -> str:
        """TMPDIR without its trailing slash ("" when unset)."""
        return (self.get("TMPDIR") or "").rstrip("/")

    @property
    def github_actions(self) -> bool:
        return self.get(GITHUB_ACTIONS) == "true"

    @property
    def github_workspace(self) -> str | None:
        return self.get(GITHUB_WORKSPACE) or None

    @property
    def no_color(self) -> bool:
        return bool(self.get(NO_COLOR))

    @property
    def s3_endpoint_set(self) -> bool:
        return any(self.get(name) for name in AWS_ENDPOINTS)

    @property
    def ray_address(self) -> str | None:
        return self.get(RAY_ADDRESS) or None

    @property
    def results_key(self) -> Path | None:
        """ITERA_RESULTS_KEY: the reviewer's key file named in place of the default one."""
        return Path(self.variables[RESULTS_KEY]).expanduser() if self.get(RESULTS_KEY) else None

    @property
    def config_home(self) -> Path:
        """XDG_CONFIG_HOME when it is an absolute path (the XDG rule), else ~/.config."""
        chosen = self.get(XDG_CONFIG_HOME)
        if chosen and os.path.isabs(chosen):
            return Path(chosen)
        home = self.get("HOME")
        return (Path(home) if home and os.path.isabs(home) else Path.home()) / ".config"


def _rebuild(variables: dict[str, str], torch_version: str | None) -> Environment:
    return Environment(MappingProxyType(variables), torch_version)
