"""How long `scan_predictions` takes and how much memory it holds, for 10^5, 10^6 and 2·10^6 lines.

    .venv/bin/python benchmarks/predictions_bench.py [--sizes 100000,1000000,2000000] [--out FILE]

Each size is measured in fresh child processes (so one size's memory never counts for the next): one run
timed without instrumentation, reporting the process's peak RSS; one run under tracemalloc, reporting the
peak Python allocation during the scan alone. The predictions miss 10 ids, repeat 10 and add 10 unknown
ones, so the scan does its full bookkeeping. The memory the scan needs grows with the number of eval ids
(one dict entry each), never with the size of the predictions file.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "validator"))


def build(folder: Path, size: int) -> None:
    """Written line by line: the parent stays small, so nothing it holds is mistaken for the scan's memory."""
    folder.mkdir(parents=True, exist_ok=True)
    eval_id = "ex-{:08d}".format
    with open(folder / "eval_ids.txt", "w") as fh:
        for i in range(size):
            fh.write(eval_id(i) + "\n")
    with open(folder / "predictions.jsonl", "w") as fh:
        for i in itertools.chain(range(size - 10), range(10)):  # 10 missing, 10 repeated
            fh.write(json.dumps({"id": eval_id(i), "prediction": "positive", "label": "negative", "score": 0.731})
                     + "\n")
        for i in range(10):
            fh.write(json.dumps({"id": f"unknown-{i}", "prediction": "positive"}) + "\n")


def peak_rss_bytes() -> int:
    """The process's own high-water mark. ru_maxrss survives exec on Linux (it would count the parent), VmHWM
    does not."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(folder: str, trace: bool) -> None:
    """Runs in a fresh process: read the eval ids, scan the predictions, print one JSON line."""
    import tracemalloc

    from itera_verify.package import readers
    from itera_verify.flows.config import Config, settle
    from itera_verify.package import RunContext, discover

    package = RunContext(discover(folder), settle(Config()))
    rss_before = peak_rss_bytes()
    started = time.perf_counter()
    eval_ids = readers.read_eval_ids(package, "eval_ids.txt")
    ids_seconds = time.perf_counter() - started
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    scan = readers.scan_predictions(package, "predictions.jsonl", eval_ids)
    scan_seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if trace else None
    print(json.dumps({
        "ids_seconds": ids_seconds, "scan_seconds": scan_seconds, "traced_peak_bytes": peak,
        "rss_before_bytes": rss_before, "rss_peak_bytes": peak_rss_bytes(),
        "records": scan.records, "missing": scan.missing_count, "duplicates": scan.duplicate_count,
        "unexpected": scan.unexpected_count,
    }))


def measure(folder: Path, trace: bool) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(folder)] + (["--trace"] if trace else []),
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def mib(value: float) -> str:
    return f"{value / 2**20:8.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000,2000000")
    parser.add_argument("--out", type=Path, default=None, help="also write the results to this file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.trace)
        return 0

    lines = [f"# scan_predictions benchmark, {date.today().isoformat()}",
             f"# {' '.join(platform.uname())}", f"# nproc {os.cpu_count()}, Python {platform.python_version()}",
             "#  lines   file size     ids read   scan time   lines/s     RSS peak   RSS growth  traced peak"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="itera-bench-") as work:
        for size in (int(s) for s in args.sizes.split(",")):
            folder = Path(work) / str(size)
            build(folder, size)
            plain, traced = measure(folder, False), measure(folder, True)
            assert plain["missing"] == 10 and plain["duplicates"] == 10 and plain["unexpected"] == 10
            file_size = (folder / "predictions.jsonl").stat().st_size
            line = (f"{size:>8}  {mib(file_size)}  {plain['ids_seconds']:8.2f} s  {plain['scan_seconds']:8.2f} s "
                    f"{plain['records'] / plain['scan_seconds']:9.0f}  {mib(plain['rss_peak_bytes'])} "
                    f"{mib(plain['rss_peak_bytes'] - plain['rss_before_bytes'])} {mib(traced['traced_peak_bytes'])}")
            print(line, flush=True)
            lines.append(line)
            for path in folder.iterdir():
                path.unlink()
    lines.append("# RSS growth: peak RSS minus RSS before the eval ids were read (ids list + id table + scan);"
                 " traced peak: Python allocations during the scan alone (the id table, no prediction held).")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
