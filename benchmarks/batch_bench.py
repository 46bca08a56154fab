"""A batch of audits against a shell loop of single audits, in the same run, alternating.

    .venv/bin/python benchmarks/batch_bench.py [--archives 50] [--rounds 3] [--jobs 2] [--out FILE]

Seals the tiny handmade package (tests/handmade.py) once per campaign id, --archives times, each archive with its
`.sha256` beside it, in one folder. Then, in each round, times:

  loop   for f in DIR/*.tar.zst; do itera-verify audit "$f" --format json; done   (an interpreter and the imports
         per archive, one archive at a time)
  batch  itera-verify audit DIR/ --jobs N --format jsonl   (one interpreter, the imports once, each archive in a
         forked child, N side by side)

Both write every report as JSON lines. The machine's load average is printed beside each round, since the
machine is shared: a ratio measured under load says so. Medians over the rounds; the ratio is batch / loop.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent / "itera-verify"


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
    env.update(HF_HUB_OFFLINE="1", NO_COLOR="1")
    return env


def build(folder: Path, count: int) -> None:
    from tests.handmade import write_tiny_package

    def campaign(index: int):
        def edit(manifest: dict) -> None:
            manifest["campaign_id"] = f"bench-{index:03d}"
        return edit

    for index in range(count):
        package = folder / "packages" / f"bench-{index:03d}"
        write_tiny_package(package, campaign(index))
        subprocess.run([str(BIN), str(package), "--no-reload", "-o", f"{folder / 'archives'}/", "-q"], check=True,
                       env=environment(), stdout=subprocess.DEVNULL)


def timed(command: str) -> float:
    started = time.monotonic()
    subprocess.run(["bash", "-c", command], check=False, env=environment(), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--archives", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    try:
        (work / "archives").mkdir()
        build(work, args.archives)
        archives = work / "archives"
        count = len(list(archives.glob("*.tar.zst")))
        loop = (f'for f in {archives}/*.tar.zst; do {BIN} audit "$f" --format json -q; done > {work}/loop.out')
        batch = f"{BIN} audit {archives}/ --jobs {args.jobs} --format jsonl -q > {work}/batch.out"
        rows = []
        for number in range(args.rounds):
            load = os.getloadavg()[0]
            loop_s, batch_s = (timed(loop), timed(batch)) if number % 2 == 0 else reversed((timed(batch), timed(loop)))
            rows.append({"round": number + 1, "loop_s": round(loop_s, 2), "batch_s": round(batch_s, 2),
                         "ratio": round(batch_s / loop_s, 3), "load_1min": round(load, 2)})
            print(json.dumps(rows[-1]), flush=True)
        audited = sum(1 for line in (work / "batch.out").read_text().splitlines() if line.strip())
        summary = {
            "archives": count, "audited_by_the_batch": audited, "jobs": args.jobs, "rounds": args.rounds,
            "loop_median_s": statistics.median(r["loop_s"] for r in rows),
            "batch_median_s": statistics.median(r["batch_s"] for r in rows),
            "ratio_median": statistics.median(r["ratio"] for r in rows),
            "load_1min_median": statistics.median(r["load_1min"] for r in rows),
            "cores": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        }
        text = "\n".join([json.dumps(r) for r in rows] + [json.dumps(summary)]) + "\n"
        print(json.dumps(summary))
        print(f"batch / loop = {summary['ratio_median']:.3f} ({summary['batch_median_s']:.1f} s against "
              f"{summary['loop_median_s']:.1f} s for {count} archives, load {summary['load_1min_median']:.1f})")
        if args.out:
            args.out.write_text(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
