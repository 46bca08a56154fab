"""The import floor: a run's reloads against importing the libraries they need, in the same run, alternating.

    python benchmarks/floor_bench.py [--rounds 5] [--work DIR] [--out FILE]

A reload cannot start before its libraries are imported. For two packages, the example campaign (fixtures/
build.py: safetensors, a transformers model, a PEFT adapter, Trainer and torch-resume checkpoints) and a
diffusers pipeline (fixtures/extra_loaders.py), each round times, each in a fresh process:

  zygote        a reload zygote for the package (reload/preloads.py decides what it imports), from its start to
                its ready message;
  zygote floor  `python -c "import M, ..."` of the same modules the zygote imported (the tool's own left out);
  verify        the whole `itera-verify PACKAGE --hf-cache CACHE`: checks, every reload, seal, HTML report (the
                diffusers package with --no-seal: its hand-made campaign is not a deliverable);
  floor         `python -c "import torch, transformers, peft"` (for the diffusers package: torch, transformers,
                diffusers): importing what its loaders need, and nothing else;
  shared        the same whole verify with ITERA_RELOAD_ZYGOTES set (reload/shared.py): its reloads forked from
                a zygote server that an earlier run of the package started (warmed once, untimed, before the
                rounds): what each run after the first costs on a machine that verifies many packages;
  load floor    for the diffusers package only: importing the classes its pipeline's load needs (the pipeline,
                UNet, VAE, scheduler, CLIP text encoder and tokenizer). `import diffusers` imports them lazily,
                so the floor above leaves out imports that any load of the pipeline makes.

It prints the medians and three ratios per package, zygote / zygote floor, verify / floor and shared / floor,
and writes them to
benchmarks/results/floor-<date>.txt and .json with the machine and its load (scripts/figures.py renders them).
The tool's bytecode is compiled first, as an installed tool's is.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "validator"))
from itera_verify.runtime.environment import RELOAD_ZYGOTES as SHARED  # noqa: E402

PYTHON = sys.executable
ENV = {key: value for key, value in os.environ.items() if key not in ("PYTHONDONTWRITEBYTECODE", SHARED)}
ENV.update(PYTHONPATH=os.pathsep.join([str(ROOT / "validator"), str(ROOT)]), HF_HUB_OFFLINE="1",
           TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", NO_COLOR="1")
PACKAGES = {
    "demo": {"title": "the example campaign (4 artifacts)", "floor_libraries": ["torch", "transformers", "peft"],
             "verify": ["--report", "html={out}/report.html", "-o", "{out}/"]},
    "diffusers": {"title": "a diffusers pipeline", "floor_libraries": ["torch", "transformers", "diffusers"],
                  "verify": ["--no-seal"],
                  # `import diffusers` (and transformers) import lazily: loading the pipeline needs these classes.
                  "load_classes": {"diffusers": ["StableDiffusionPipeline", "UNet2DConditionModel", "AutoencoderKL",
                                                 "DDIMScheduler"],
                                   "transformers": ["CLIPTextModel", "CLIPTokenizer"]}},
}


def load_floor_statement(classes: dict[str, list[str]]) -> str:
    """`import torch; from LIBRARY import CLASS, ...` for each library of `classes`."""
    return "; ".join(["import torch", *(f"from {library} import {', '.join(names)}"
                                        for library, names in classes.items())])


ZYGOTE = """
import json, sys, time
started = time.monotonic()
from itera_verify.flows.config import Config, settle
from itera_verify.package import RunContext, discover
from itera_verify.reload.runner import package_preloads, zygote_env
from itera_verify.reload.zygote_client import Zygote
from itera_verify.runtime.environment import Environment
from itera_verify.runtime.launcher import Launcher
ctx = RunContext(discover(sys.argv[1]), settle(Config(), hf_cache=sys.argv[2]))
wanted = package_preloads(ctx)
children = Launcher(Environment.read())
begun = time.monotonic()
zygote = Zygote(children, zygote_env(children.environment), preloads=wanted)
zygote.wait_ready()
ready = time.monotonic()
assert zygote.client is not None, zygote.why
zygote.close()
modules = [m for m in wanted.imports if not m.startswith("itera_verify")]
print(json.dumps({"seconds": ready - begun, "modules": modules, "without": list(wanted.without)}))
"""


# ---- the packages ------------------------------------------------------------------------------------------
def build(work: Path) -> dict[str, tuple[Path, Path]]:
    """Both packages and their hub caches, built once per work folder in a child process (torch must not inflate
    this one)."""
    if not (work / "built.json").exists():
        subprocess.run([PYTHON, __file__, "--build", str(work)], check=True, env=ENV)
    return {name: (Path(package), Path(cache)) for name, (package, cache) in
            json.loads((work / "built.json").read_text()).items()}


def build_here(work: Path) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "validator")]
    from fixtures.build import build_hub_cache, build_package
    from fixtures.extra_loaders import write_diffusers_pipeline, write_package

    demo, demo_cache = work / "demo" / "package", work / "demo" / "hf-cache"
    build_hub_cache(demo_cache)
    build_package(demo, demo_cache)
    pipeline = work / "diffusers" / "package"
    write_diffusers_pipeline(pipeline / "artifacts" / "pipeline", work / "diffusers" / "work")
    write_package(pipeline, [("pipeline", "diffusers-pipeline", "artifacts/pipeline", {"loader": "diffusers"})])
    (work / "diffusers" / "hf-cache").mkdir(exist_ok=True)
    built = {"demo": [str(demo), str(demo_cache)], "diffusers": [str(pipeline), str(work / "diffusers" / "hf-cache")]}
    (work / "built.json").write_text(json.dumps(built))


# ---- measuring -----------------------------------------------------------------------------------------------
def timed(command: list[str], env: dict | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, env={**ENV, **(env or {})}, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{command[:4]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, done.stdout


def verify_command(name: str, package: Path, cache: Path, out: Path) -> list[str]:
    for leftover in out.glob("*.tar.zst*"):
        leftover.unlink()
    return [PYTHON, "-m", "itera_verify", str(package), "--hf-cache", str(cache), "-q",
            *[part.format(out=out) for part in PACKAGES[name]["verify"]]]


def one_round(name: str, package: Path, cache: Path, out: Path, shared: Path) -> dict:
    spec = PACKAGES[name]
    zygote = json.loads(timed([PYTHON, "-c", ZYGOTE, str(package), str(cache)])[1])
    zygote_floor, _ = timed([PYTHON, "-c", "import " + ", ".join(zygote["modules"])])
    verify, _ = timed(verify_command(name, package, cache, out))
    floor, _ = timed([PYTHON, "-c", "import " + ", ".join(spec["floor_libraries"])])
    with_shared, _ = timed(verify_command(name, package, cache, out), {SHARED: str(shared)})
    measured = {"zygote": zygote["seconds"], "zygote_floor": zygote_floor, "verify": verify, "floor": floor,
                "shared": with_shared, "modules": zygote["modules"], "without": zygote["without"]}
    if "load_classes" in spec:
        measured["load_floor"] = timed([PYTHON, "-c", load_floor_statement(spec["load_classes"])])[0]
    return measured


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, help="build (or reuse) the packages here")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"floor-{date.today()}.txt")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        build_here(args.build)
        return 0
    subprocess.run([PYTHON, "-m", "compileall", "-q", str(ROOT / "validator")], check=True, env=ENV)
    work = args.work or Path(tempfile.mkdtemp(prefix="floor-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    packages = build(work)
    out = work / "out"
    out.mkdir(exist_ok=True)
    shared = Path(tempfile.mkdtemp(prefix="floor-bench-zygotes-"))  # private (0700): its servers end with it
    try:
        for name, (package, cache) in packages.items():  # each package's server started once, untimed
            timed(verify_command(name, package, cache, out), {SHARED: str(shared)})
        before = os.getloadavg()[0]
        rounds: dict[str, list[dict]] = {name: [] for name in packages}
        for number in range(args.rounds):
            for name, (package, cache) in (packages.items() if number % 2 == 0 else reversed(packages.items())):
                rounds[name].append(one_round(name, package, cache, out, shared))
                print(f"round {number + 1} {name}: " + ", ".join(f"{k} {v:.2f}s" for k, v in rounds[name][-1].items()
                                                                     if isinstance(v, float)), file=sys.stderr)
        after = os.getloadavg()[0]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    result = {"benchmark": "floor", "date": str(date.today()), "text": args.out.name, "machine": machine(),
              "python": platform.python_version(), "load": {"before": before, "after": after},
              "rounds": args.rounds, "packages": {}}
    lines = [f"# import floor benchmark, {date.today()}: {machine()}; load average {before:.2f} before, "
             f"{after:.2f} after; medians of {args.rounds} alternating rounds"]
    for name, each in rounds.items():
        median = {key: statistics.median(r[key] for r in each)
                  for key in ("zygote", "zygote_floor", "verify", "floor", "shared", "load_floor") if key in each[0]}
        result["packages"][name] = {**median, "title": PACKAGES[name]["title"], "artifacts": 4 if name == "demo" else 1,
                                    "floor_libraries": PACKAGES[name]["floor_libraries"],
                                    "zygote_modules": each[0]["modules"], "kept_out": each[0]["without"]}
        if "load_classes" in PACKAGES[name]:
            result["packages"][name]["load_classes"] = [cls for classes in PACKAGES[name]["load_classes"].values()
                                                        for cls in classes]
        lines += [f"{PACKAGES[name]['title']}:",
                  f"  zygote {median['zygote']:.2f} s / import of the same modules {median['zygote_floor']:.2f} s = "
                  f"{median['zygote'] / median['zygote_floor']:.2f}   (modules: {', '.join(each[0]['modules'])}; "
                  f"kept out: {', '.join(each[0]['without'])})",
                  f"  whole verify {median['verify']:.2f} s / import floor "
                  f"({', '.join(PACKAGES[name]['floor_libraries'])}) {median['floor']:.2f} s = "
                  f"{median['verify'] / median['floor']:.2f}   (target <= 1.1)",
                  f"  whole verify with a shared zygote {median['shared']:.2f} s / import floor "
                  f"{median['floor']:.2f} s = {median['shared'] / median['floor']:.2f}"]
        if "load_floor" in median:
            lines.append(f"  whole verify {median['verify']:.2f} s / importing the classes its load needs "
                         f"{median['load_floor']:.2f} s = {median['verify'] / median['load_floor']:.2f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
