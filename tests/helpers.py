"""Helpers tests import: `from tests.helpers import static_findings, codes, run_cli`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def context(package_dir, **options):
    """The run context of a package as the workflows build it: these options (RunOptions' names), settled
    without a configuration file."""
    from itera_verify.flows.config import Config, settle
    from itera_verify.package import RunContext, discover

    return RunContext(discover(package_dir), settle(Config(), **options))


def static_findings(package_dir: Path, **selection):
    """Every static finding of a package, through the library: no subprocess, no reload."""
    from itera_verify.flows.checks import run_checks
    from itera_verify.rules import Selection

    return run_checks(context(package_dir), Selection(**selection), "static")


def codes(findings) -> set[str]:
    return {f.code for f in findings}


def run_cli(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The real command line in a child process, offline."""
    base = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}  # CI must not switch the format
    full_env = {**base, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "itera_verify", *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def torchrun_two(script: str, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node 2 SCRIPT` from the venv, on a free port (other test sessions may run torchrun
    too), its output captured; the caller checks the return code. Its temporary folder (torchelastic's log folder)
    is under `cwd`, removed with the test's."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    torchrun = Path(__file__).resolve().parents[1] / ".venv/bin/torchrun"
    scratch = Path(cwd) / ".torchrun-tmp"
    scratch.mkdir(exist_ok=True)
    return subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", port, script], cwd=cwd,
                          env={**env, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=timeout, check=False)
