"""Reload benchmark: itera-verify's isolated reloads against a bare load of the same files, in the same run.

    python benchmarks/reload_bench.py [--package DIR --hf-cache DIR] [--repeat N] [--device cpu|cuda]
                                      [--sections phase,midsize,artifacts]

Without --package the fixture package is built in a temporary folder. `phase` and `midsize` are issue 17's
side-by-side comparisons (reload_scale.py says what they time). `artifacts`: for each artifact, interleaved and
repeated (median), it times:
  start-up   a fresh `python -c "import <what the reload child imports>"`: the price of a new process;
  bare       the plain library calls (from_pretrained / PeftModel.from_pretrained / safe_open / torch.load)
             in a fresh process: `bare total` is the whole process, `bare load` the calls alone;
  isolated   run_reloads for that artifact, its whole wall: the zygote's start (its imports) and one forked child
             with every check and the forward pass.
The design may add process start-up to a reload and nothing more: `isolated / bare total` should stay near 1,
and `isolated - start-up - bare load` is what the checks themselves cost. Output goes to stdout and to
benchmarks/results/reload-<date>.txt with the machine.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "validator")]
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
                  TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore")
ARTIFACTS = {"control-model": "transformers", "control-resume": "hf-trainer-checkpoint",
             "lora-r16-adapter": "peft", "lora-r16-resume": "torch-resume",
             "(every .safetensors file)": "safetensors"}


def nproc() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def child_imports(loader: str) -> list[str]:
    from itera_verify.reload.preloads import IMPORTS

    return ["torch", *IMPORTS[loader]]


# --- the bare loads (bare_loads.py), run in a fresh process by `--bare ARTIFACT` -------------------------

def bare_main(artifact: str, package: Path, hf_cache: Path, device: str) -> None:
    import importlib

    for module in child_imports(ARTIFACTS[artifact]):  # the same imports as the reload child, untimed
        importlib.import_module(module)
    from bare_loads import bare_load

    started = time.perf_counter()
    bare_load(artifact, package, hf_cache, device)
    print(json.dumps({"load_seconds": time.perf_counter() - started}))


# --- timing ------------------------------------------------------------------------------------------------

def timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, done.stdout


def measure(artifact: str, package: Path, hf_cache: Path, device: str) -> dict:
    imports = ", ".join(child_imports(ARTIFACTS[artifact]))
    startup, _ = timed([sys.executable, "-c", f"import {imports}"])
    bare_total, out = timed([sys.executable, __file__, "--bare", artifact, "--package", str(package),
                             "--hf-cache", str(hf_cache), "--device", device])
    row = {"start-up": startup, "bare total": bare_total, "bare load": json.loads(out)["load_seconds"]}
    if artifact.startswith("("):
        return row
    from reload_scale import tool_reload

    tool = tool_reload(package, hf_cache, device, {artifact}, "auto")  # the zygote's start included
    (result,) = tool["results"]
    row.update({"isolated": tool["wall"], "in-child load": result.facts.get("load_seconds", 0.0)})
    return row


def header(device: str) -> list[str]:
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return [f"reload benchmark, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}",
            f"machine: {' '.join(platform.uname()[:3])} {platform.machine()}, nproc {nproc()}",
            f"python {platform.python_version()}, torch {torch.__version__}, device {device}"
            + (f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else ""),
            f"load average before the run: {' '.join(f'{x:.2f}' for x in load)} (the machine is shared: other "
            "work slows every column alike)", ""]


def report(package: Path, hf_cache: Path, device: str, repeat: int) -> list[str]:
    rows: dict[str, list[dict]] = {name: [] for name in ARTIFACTS}
    for _ in range(repeat):  # interleaved, so a busy moment of the machine spreads over every column
        for name in ARTIFACTS:
            rows[name].append(measure(name, package, hf_cache, device))
    med = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in rows.items()}
    lines = ["== each artifact alone: start-up, bare load, one isolated reload (run_reloads, default isolation)",
             f"median of {repeat} interleaved run(s); seconds", "",
             f"{'artifact':<27}{'start-up':>9}{'bare load':>10}{'bare total':>11}{'isolated':>10}"
             f"{'in-child load':>14}{'isolated/bare total':>21}{'checks cost':>12}"]
    for name, m in med.items():
        line = f"{name:<27}{m['start-up']:>9.2f}{m['bare load']:>10.3f}{m['bare total']:>11.2f}"
        if "isolated" in m:
            line += (f"{m['isolated']:>10.2f}{m['in-child load']:>14.3f}{m['isolated'] / m['bare total']:>21.2f}"
                     f"{m['isolated'] - m['start-up'] - m['bare load']:>12.2f}")
        lines.append(line)
    lines += ["", "start-up: a fresh python importing what the child imports for that loader;",
              "bare total: the same process plus the bare library load; isolated: run_reloads' whole wall "
              "(the zygote's imports, fork, scan, every check, forward pass, JSON result);",
              "checks cost = isolated - start-up - bare load: what itera-verify adds beyond a new process.", ""]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path)
    parser.add_argument("--hf-cache", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--sections", default="phase,midsize,artifacts",
                        help="phase (whole reload phase vs one plain process), midsize (a 0.5 B model vs a bare "
                             "from_pretrained), artifacts (each artifact vs a bare load)")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep what was built (the mid-size "
                                                   "package: scripts/gpu-check.sh reloads it again, capped)")
    parser.add_argument("--midsize-layers", type=int, action="append",
                        help="the mid-size model's layer counts, each its own section (default 24: 0.47 B "
                             "parameters; 96: 1.7 B)")
    parser.add_argument("--no-save", action="store_true", help="print only; no benchmarks/results file")
    parser.add_argument("--bare", help=argparse.SUPPRESS)  # internal: one bare load in this fresh process
    parser.add_argument("--plain", help=argparse.SUPPRESS)  # internal: reload_scale's plain process
    args = parser.parse_args()
    if args.bare:
        bare_main(args.bare, args.package, args.hf_cache, args.device)
        return 0
    if args.plain:
        from reload_scale import plain_main

        plain_main(args.plain, args.package, args.hf_cache, args.device)
        return 0
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(str(args.keep)) if args.keep else
          tempfile.TemporaryDirectory(prefix="itera-bench-")) as work:
        package, hf_cache = args.package, args.hf_cache
        if package is None:
            from fixtures.build import build_package

            package, hf_cache = Path(work) / "package", Path(work) / "hf-cache"
            build_package(package, hf_cache)
        package, hf_cache = package.resolve(), hf_cache.resolve()
        lines = header(device)
        if "phase" in sections:
            from reload_scale import phase_section

            lines += phase_section(package, hf_cache, device, args.repeat)
        if "midsize" in sections:
            from reload_scale import midsize_section

            for layers in args.midsize_layers or [24]:
                lines += midsize_section(package, hf_cache, device, args.repeat, Path(work), layers)
        if "artifacts" in sections:
            lines += report(package, hf_cache, device, args.repeat)
        lines.append(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.no_save:
        return 0
    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"reload-{datetime.date.today():%Y-%m-%d}.txt").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
