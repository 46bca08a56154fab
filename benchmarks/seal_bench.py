"""Seal and audit against the shell tools doing the same work, in the same run, alternating.

    .venv/bin/python benchmarks/seal_bench.py [--size-gib 2] [--rounds 3] [--small-files 20000] [--memory-sizes 1,4]
        [--out FILE]

Builds a valid package of about --size-gib: the real example package (fixtures/build.py) plus bf16-like
safetensors shards (~75 %), a large JSONL file (~20 %) and 20,000 small JSON files (--small-files: 0 is the
shape of a package with a few large files). Then, in each round, times:

  tar|zstd      tar -cf - DIR | zstd -T0 -3 -o FILE          (compress only: no checksum, no sync, no check)
  sha256sum     find DIR -type f | xargs sha256sum           (checksums only)
  seal pass     the seal's streaming pass alone: read, hash, compress, write, fsync (library call)
  seal+verify   the same call, including the read-back verification of the archive
  whole         itera-verify DIR --no-reload -o FILE          (discovery, every check, seal, read-back)
  audit         itera-verify audit FILE                       (private folder in /dev/shm when it fits)
  audit (disk)  TMPDIR=<work folder> itera-verify audit FILE   (the same, extracting to the disk)
  unzstd|sha    zstd -dc FILE | tar -xOf - | sha256sum

Each command runs in its own process; peak memory is that process tree's maximum resident set (wait4). The
page cache is warm (the package fits in memory): disk speed is not what is measured. Medians over the rounds.
Every command writes a new file: the previous round's output is deleted before the command starts (outside its
time), as on a first seal. Overwriting in place would favour `zstd -f`, which truncates its old output and reuses
those pages at once, while the seal never writes over an archive in place (it publishes by rename); on a VM whose
host maps guest memory lazily, writing into pages the guest has not reused costs up to 2 s of system time per GB.
The archive the audits read is read once before them, untimed: the seal writes it past the page cache, and the
first command to read it would otherwise pay for the disk alone.
--memory-sizes seals packages of those sizes (GiB) once more each and prints the seal's peak RSS, to show it
does not grow with the package.
The result is appended to --out as text and written beside it as JSON (same name, .json), with the machine and
its load: scripts/figures.py renders the README's figures from the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CLI = [PYTHON, "-m", "itera_verify"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "validator"), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
MiB, GiB = 1 << 20, 1 << 30
SMALL_FILES = 20_000


# ---- the package -----------------------------------------------------------------------------------------
def build_base(work: Path) -> Path:
    """The real example package, built once per work folder (tiny real models), in a child process: torch
    must not inflate this process, whose memory its children inherit in their peak-RSS figures."""
    base = work / "base"
    if not (base / "manifest.json").exists():
        subprocess.run([PYTHON, __file__, "--build-base", str(work)], check=True, env=ENV)
    return base


def build_base_here(work: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from fixtures.build import build_hub_cache, build_package

    shutil.rmtree(work / "hf-cache", ignore_errors=True)
    shutil.rmtree(work / "base", ignore_errors=True)
    build_hub_cache(work / "hf-cache")
    build_package(work / "base", work / "hf-cache")


def generate_bulk(folder: str, total_bytes: int, small_files: int = SMALL_FILES) -> None:
    """Runs in a child (numpy's memory must not count as the benchmark's): shards, JSONL, small files."""
    import numpy as np

    root = Path(folder)
    rng = np.random.default_rng(7)
    shards_bytes = int(total_bytes * 0.75)
    shard_size, chunk = 256 * MiB, 16 * MiB
    shards = max(1, round(shards_bytes / shard_size))
    (root / "artifacts" / "bulk-shards").mkdir(parents=True)
    for index in range(shards):
        size = min(shard_size, shards_bytes - index * shard_size) if index == shards - 1 else shard_size
        tensors = max(1, size // chunk)
        header = {f"layer.{t}.weight": {"dtype": "BF16", "shape": [chunk // 2 // 4096, 4096],
                                        "data_offsets": [t * chunk, (t + 1) * chunk]} for t in range(tensors)}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(root / "artifacts" / "bulk-shards" / f"model-{index + 1:05d}-of-{shards:05d}.safetensors",
                  "wb") as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            for _ in range(tensors):
                values = rng.standard_normal(chunk // 2, dtype=np.float32) * 0.02
                fh.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    words = [f"w{n}" for n in range(5000)] + ["the", "model", "review", "good", "bad", "product", "quality"]
    random.seed(7)
    with open(root / "analysis" / "eval-traces.jsonl", "w") as fh:
        written, step = 0, 0
        while written < total_bytes * 0.2:
            line = json.dumps({"id": f"ex-{step % 40 + 1:04d}", "step": step, "label": random.choice("pnu"),
                               "text": " ".join(random.choices(words, k=random.randint(10, 40))),
                               "logits": [round(random.gauss(0, 2), 4) for _ in range(3)]}) + "\n"
            fh.write(line)
            written += len(line)
            step += 1
    samples = root / "analysis" / "samples"
    for index in range(small_files):
        folder_path = samples / f"{index // 1000:02d}"
        folder_path.mkdir(parents=True, exist_ok=True)
        body = {"id": f"ex-{index % 40 + 1:04d}", "tokens": random.choices(words, k=random.randint(5, 300))}
        (folder_path / f"{index:05d}.json").write_text(json.dumps(body))


def build_package(work: Path, size_gib: float, small_files: int = SMALL_FILES) -> Path:
    package = work / f"pkg-{size_gib:g}gib-{small_files}" / "reviews-lora-2026-11"
    if package.exists():
        return package
    shutil.copytree(build_base(work), package, symlinks=True)
    subprocess.run([PYTHON, __file__, "--generate", str(package), str(int(size_gib * GiB)), str(small_files)],
                   check=True, env=ENV)
    check = subprocess.run([*CLI, str(package), "--no-reload", "--no-seal", "-q"], env=ENV, capture_output=True,
                           text=True)
    if check.returncode != 0:
        sys.exit(f"the benchmark package does not pass its checks:\n{check.stdout}{check.stderr}")
    return package


# ---- measuring -------------------------------------------------------------------------------------------
def measure(command, *, shell: bool = False, env: dict | None = None) -> dict:
    """Wall time, CPU time and peak RSS of one command (its whole process tree, through wait4). Each starts with
    no writeback pending (an untimed sync): the disk-extracting audit and the deletions before a command leave
    gigabytes for the kernel to write or discard, and whichever command came next would pay for them."""
    os.sync()
    started = time.perf_counter()
    child = subprocess.Popen(command, shell=shell, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             executable="/bin/bash" if shell else None)
    stdout = child.stdout.read()
    child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in (0,):
        raise SystemExit(f"{command} failed with {child.returncode}")
    return {"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss * 1024,
            "stdout": stdout.decode(errors="replace")}


SEAL_ONLY = """
import json, sys
from pathlib import Path
from itera_verify.flows.config import Config, settle
from itera_verify.package import RunContext, discover
from itera_verify.seal import seal_package
package = RunContext(discover(sys.argv[1]), settle(Config()))
result = seal_package(package, "reviews-lora-2026-11", {"SEAL/verification.json": b"{}"}, Path(sys.argv[2]),
                      overwrite=True)
print(json.dumps(result))
"""


def warm(path: Path) -> None:
    """Read a file once, outside any timing, so that it is in the page cache. The seal writes its archive past
    the cache (O_DIRECT); the first command to read it would pay the disk and the cache's filling alone, and the
    commands compared with it would not. The archive a reviewer audits was just downloaded: it is in the cache."""
    with open(path, "rb") as source:
        while source.read(8 << 20):
            pass


def fresh(*paths: Path) -> None:
    """Delete a previous output (and its .sha256) so that the next command writes a new file."""
    for path in paths:
        for each in (path, path.with_name(path.name + ".sha256")):
            each.unlink(missing_ok=True)


def round_of(package: Path, out: Path) -> dict[str, dict]:
    parent, name = package.parent, package.name
    results = {}
    fresh(out / "baseline.tar.zst")
    results["tar|zstd"] = measure(f"tar -cf - -C {parent} {name} | zstd -T0 -3 -q -f -o {out}/baseline.tar.zst",
                                  shell=True)
    results["tar|zstd"]["bytes"] = (out / "baseline.tar.zst").stat().st_size
    fresh(out / "seal-only.tar.zst")
    sealed = measure([PYTHON, "-c", SEAL_ONLY, str(package), str(out / "seal-only.tar.zst")])
    facts = json.loads(sealed["stdout"])
    results["seal+verify"] = {**sealed, "bytes": facts["bytes"]}
    results["seal pass"] = {"seconds": facts["write_seconds"], "cpu": float("nan"), "rss": sealed["rss"],
                            "bytes": facts["bytes"]}
    results["read-back"] = {"seconds": facts["verify_seconds"], "cpu": float("nan"), "rss": sealed["rss"]}
    results["sha256sum"] = measure(f"find {package} -type f -print0 | xargs -0 sha256sum > /dev/null", shell=True)
    fresh(out / "whole.tar.zst")
    results["whole"] = measure([*CLI, str(package), "--no-reload", "-q", "-o",
                                str(out / "whole.tar.zst")])
    results["whole"]["bytes"] = (out / "whole.tar.zst").stat().st_size
    warm(out / "whole.tar.zst")
    results["audit"] = measure([*CLI, "audit", str(out / "whole.tar.zst"), "-q"])
    results["audit (disk)"] = measure([*CLI, "audit", str(out / "whole.tar.zst"), "-q"],
                                      env={**ENV, "TMPDIR": str(out)})
    results["unzstd|sha"] = measure(f"zstd -dc {out}/whole.tar.zst | tar -xOf - | sha256sum > /dev/null", shell=True)
    return results


def machine() -> list[str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    tools = [subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
             for cmd in (["zstd", "--version"], ["tar", "--version"], ["sha256sum", "--version"])]
    import zstandard

    return [f"{platform.platform()}", f"cpu: {cpu}; nproc {os.cpu_count()}; "
            f"memory {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GiB:.0f} GiB",
            f"Python {platform.python_version()}, zstandard {zstandard.__version__} (libzstd "
            f"{'.'.join(map(str, zstandard.ZSTD_VERSION))})", *tools]


def du(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(p.stat().st_size for p in files), len(files)


def summary(rounds: list[dict], package: Path, memory: list[tuple], load: tuple[float, float], text: str,
            small_files: int = SMALL_FILES) -> dict:
    """The run as JSON, for scripts/figures.py: medians in seconds, sizes in MiB."""
    cpu = platform.processor()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), cpu)
    size, count = du(package)
    keys = list(rounds[0])
    cpus = {key: statistics.median(r[key]["cpu"] for r in rounds) for key in keys}
    return {
        "benchmark": "seal", "date": str(date.today()), "text": text,
        "machine": f"{os.cpu_count()} cores ({cpu}), "
                   f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GiB:.0f} GiB",
        "python": platform.python_version(), "load": {"before": load[0], "after": load[1]},
        "package": {"gib": round(size / GiB, 2), "files": count,
                    "shape": "the example package, bf16-like safetensors shards, a large JSONL file"
                             + (f" and {small_files:,} small JSON files" if small_files else "")},
        "rounds": len(rounds),
        "median_seconds": {key: round(statistics.median(r[key]["seconds"] for r in rounds), 3) for key in keys},
        "median_cpu_seconds": {key: round(value, 3) for key, value in cpus.items() if value == value},  # NaN: a part
        "archive_mib": {key: round(rounds[0][key]["bytes"] / MiB, 1) for key in ("whole", "tar|zstd")},
        "seal_peak_rss_mib": {f"{size_gib:g}": round(rss / MiB, 1) for size_gib, rss, _ in memory},
    }


def report(rounds: list[dict], package: Path, memory: list[tuple]) -> list[str]:
    median = {key: {field: statistics.median(r[key][field] for r in rounds) for field in ("seconds", "rss")}
              for key in rounds[0]}
    for key in rounds[0]:
        median[key]["cpu"] = statistics.median(r[key]["cpu"] for r in rounds)
        if "bytes" in rounds[0][key]:
            median[key]["bytes"] = rounds[0][key]["bytes"]
    size, count = du(package)
    lines = [f"package: {size / GiB:.2f} GiB in {count} files; rounds: {len(rounds)} (alternating); page cache warm",
             f"{'command':<14}{'median s':>10}{'cpu s':>9}{'peak RSS':>12}{'output':>14}   each round (s)"]
    for key, values in median.items():
        each = " ".join(f"{r[key]['seconds']:.2f}" for r in rounds)
        output = f"{values['bytes'] / MiB:,.1f} MiB" if "bytes" in values else ""
        cpu = "-" if values["cpu"] != values["cpu"] else f"{values['cpu']:.2f}"  # NaN: a part of a run
        lines.append(f"{key:<14}{values['seconds']:>10.2f}{cpu:>9}{values['rss'] / MiB:>9.1f} MiB"
                     f"{output:>14}   {each}")
    base = median["tar|zstd"]["seconds"]
    lines += [
        "",
        f"seal pass / tar|zstd            = {median['seal pass']['seconds'] / base:.2f}   (target <= 0.9)",
        f"whole --no-reload / tar|zstd    = {median['whole']['seconds'] / base:.2f}   (target <= 1.3)",
        f"archive size / tar|zstd output  = {median['whole']['bytes'] / median['tar|zstd']['bytes']:.4f} "
        "(target <= 1.02)",
        f"audit / zstd -dc|tar -xO|sha256sum = {median['audit']['seconds'] / median['unzstd|sha']['seconds']:.2f}"
        "   (target <= 0.6)",
        f"audit extracting to the disk / the same = "
        f"{median['audit (disk)']['seconds'] / median['unzstd|sha']['seconds']:.2f}",
        f"seal peak RSS (library call, whole process) = {median['seal+verify']['rss'] / MiB:.1f} MiB; "
        f"whole command = {median['whole']['rss'] / MiB:.1f} MiB   (target <= 200 MiB)",
    ]
    for size_gib, rss, seconds in memory:
        lines.append(f"memory check: {size_gib:g} GiB package -> seal peak RSS {rss / MiB:.1f} MiB ({seconds:.1f} s)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-sizes", default="", help="e.g. 1,4: seal packages of these sizes, print RSS")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"seal-{date.today()}.txt")
    parser.add_argument("--small-files", type=int, default=SMALL_FILES,
                        help="small JSON files in the package (default 20,000; 0: a few large files only)")
    parser.add_argument("--generate", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--build-base", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        return generate_bulk(args.generate[0], int(args.generate[1]), int(args.generate[2]))
    if args.build_base:
        return build_base_here(args.build_base)
    work = args.work or Path(tempfile.mkdtemp(prefix="seal-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        package = build_package(work, args.size_gib, args.small_files)
        out = work / "out"
        out.mkdir(exist_ok=True)
        rounds = []
        before = os.getloadavg()[0]
        for number in range(args.rounds):
            rounds.append(round_of(package, out))
            print(f"round {number + 1}: " + ", ".join(f"{k} {v['seconds']:.2f}s" for k, v in rounds[-1].items()),
                  file=sys.stderr)
        memory = []
        for size_gib in [float(s) for s in args.memory_sizes.split(",") if s]:
            other = build_package(work, size_gib, args.small_files)
            fresh(out / "memory.tar.zst")
            sealed = measure([PYTHON, "-c", SEAL_ONLY, str(other), str(out / "memory.tar.zst")])
            memory.append((size_gib, sealed["rss"], sealed["seconds"]))
            shutil.rmtree(other.parent)
        result = summary(rounds, package, memory, (before, os.getloadavg()[0]), args.out.name, args.small_files)
        lines = [f"# seal benchmark, {date.today()}", *("# " + m for m in machine()),
                 *report(rounds, package, memory)]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        fh.write(text + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
