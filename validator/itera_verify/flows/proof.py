"""The resume proof's background process (record/proofs.py starts it): one checkpoint of a package reloaded by the
reload `itera-verify` runs, at the lowest CPU and I/O priority, its findings written as JSON.

    python -m itera_verify.flows.proof PACKAGE ARTIFACT RESULT.json [--device cpu] [--timeout S]
                                                                          [--hf-cache DIR]

The same code as the verify's: the static scan and resume facts (IV506-IV508, rules/), then the reload child
(reload.run_reloads, weights_only, every component, under the reload's host memory limit), then the rules over
its facts (IV504-IV508). Only the findings about this artifact count."""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
import time

STATIC_CODES = ("IV506", "IV507", "IV508")
RELOAD_CODES = ("IV504", "IV505", "IV507", "IV508")
# ioprio_set(2): which = IOPRIO_WHO_PROCESS, class IDLE (3) in the top bits; the syscall number per machine.
IOPRIO_WHO_PROCESS, IOPRIO_CLASS_IDLE, IOPRIO_CLASS_SHIFT = 1, 3, 13
RESULT_SECONDS = 5.0  # of the proof's timeout, kept to judge the reload and write the result
SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "i686": 289, "ppc64le": 273, "s390x": 282}


def lowest_priority() -> dict:
    """nice 19 and the idle I/O class for this process (and the reload child it starts, which inherits both):
    the training's steps and its saves come first. Returns what was set."""
    done = {"nice": os.nice(19 - os.nice(0))}
    number = SYS_IOPRIO_SET.get(platform.machine())
    if sys.platform.startswith("linux") and number is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(number, IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) == 0:
            done["ioprio"] = "idle"
    if "ioprio" not in done and shutil.which("ionice"):
        if subprocess.run(["ionice", "-c3", "-p", str(os.getpid())], check=False,
                          capture_output=True).returncode == 0:
            done["ioprio"] = "idle"
    return done


def _concerns(finding, artifact: str, rel: str | None) -> bool:
    if finding.artifact is not None:
        return finding.artifact == artifact
    path = finding.path or ""
    return rel is not None and (path == rel or path.startswith(rel.rstrip("/") + "/"))


def prove(root: str, artifact: str, *, device: str, timeout: float, hf_cache: str | None,
          started: float | None = None) -> dict:
    """`timeout` bounds the whole proof from `started` (time.monotonic(), default now): the reload gets what the
    start-up and the scan left of it, less a few seconds to judge it and write the result."""
    started = time.monotonic() if started is None else started
    from dataclasses import replace

    from ..options import Selection
    from ..package import RunContext, discover
    from ..reload import run_reloads
    from ..runtime.progress import NULL_PROGRESS
    from .checks import run_checks
    from .config import Config, settle

    # No configuration file: the proof judges the artifact by the rules' own levels, as the recorder declared.
    options = settle(Config(), device=device, timeout=timeout, hf_cache=hf_cache, seal=False)
    ctx = RunContext(discover(root), options)
    listed = next((a for a in ctx.documents.artifacts() if a.get("id") == artifact), None)
    if listed is None:
        return {"ok": False, "error": f"{artifact} is not an artifact of the package", "codes": []}
    rel = ctx.inventory.normalise_ref(listed["path"]) if isinstance(listed.get("path"), str) else None
    findings = [f for f in run_checks(ctx, Selection(select=STATIC_CODES), "static")
                if _concerns(f, artifact, rel)]
    left = timeout - (time.monotonic() - started) - RESULT_SECONDS
    reloads = run_reloads(ctx, device=device, timeout=max(1.0, left), jobs=1, progress=NULL_PROGRESS,
                          only={artifact})
    ctx = replace(ctx, reloads=reloads)
    findings += [f for f in run_checks(ctx, Selection(select=RELOAD_CODES), "reload")
                 if _concerns(f, artifact, rel)]
    reload = reloads[0] if reloads else None
    result = {"ok": bool(reload is not None and reload.ok and not findings),
              "seconds": round(reload.seconds, 3) if reload is not None else None,
              "device": reload.device if reload is not None else device,
              "codes": sorted({f.code for f in findings}),
              "findings": _unique(findings)[:5]}
    if reload is not None and reload.error and not reload.ok:
        result["error"] = reload.error
    if reload is not None and reload.confinement is not None:
        result["confinement"] = reload.confinement  # its reload child's Landlock confinement (reload/confine.py)
    return result


def _unique(findings) -> list[dict]:
    said: list[dict] = []
    for finding in findings:
        entry = {"code": finding.code, "message": finding.message}
        if finding.path:
            entry["file"] = finding.path
        if entry not in said:
            said.append(entry)
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m itera_verify.flows.proof")
    parser.add_argument("package")
    parser.add_argument("artifact")
    parser.add_argument("result")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--hf-cache")
    args = parser.parse_args(argv)
    priority = lowest_priority()
    started = time.monotonic()
    result = prove(args.package, args.artifact, device=args.device, timeout=args.timeout, hf_cache=args.hf_cache,
                   started=started)
    result["priority"] = priority
    result["proof_seconds"] = round(time.monotonic() - started, 3)
    temporary = args.result + ".part"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(temporary, args.result)
    return 0


if __name__ == "__main__":
    from ..runtime.ending import end_program

    end_program(lambda: sys.exit(main()))
