"""Leaving the machine: the seal and push against the shell tools and SDK doing the same, side by side, one run.

    .venv/bin/python benchmarks/push_bench.py [--size-gib 0.25] [--rounds 3] [--out FILE]

Builds a valid package of about --size-gib (seal_bench.py's builder: the example package plus weight shards, a
large JSONL and small files), starts one SeaweedFS on loopback (tests/push_stores.py, the store the tests use)
and, in each round, times:

  verify --push   itera-verify DIR --no-reload -o OUT --push s3://bench/a/   (checks, seal, read-back, push
                                                                            overlapping the seal, the store's
                                                                            CRC64NVME, receipt)
  tar|zstd+upload tar -cf - DIR | zstd -T0 -3 -o FILE, then boto3 upload_file (default TransferConfig)
  rclone copy     rclone copy DIR of the raw folder to the same store (checksums per file by rclone)

Each command is its own process; peak memory is its process tree's maximum resident set (wait4). Medians over
the rounds. The ratio the issue asks for is verify --push over the sequential pair. Run on a quiet machine: the
three share its cores with the store.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import seal_bench  # noqa: E402 - the package builder and the measuring of seal_bench.py
from tests.push_stores import ACCESS, SECRET, start_seaweedfs, store_env  # noqa: E402

BIN = Path(sys.executable).parent
UPLOAD = """
import sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))
s3.upload_file(sys.argv[1], "bench", sys.argv[2])
"""


def round_of(package: Path, out: Path, env: dict, endpoint: str, number: int) -> dict[str, dict]:
    results = {}
    for old in out.glob("*"):
        old.unlink()
    results["verify --push"] = seal_bench.measure(
        [*seal_bench.CLI, str(package), "--no-reload", "-q", "-o", str(out), "--push", f"s3://bench/a{number}/"],
        env=env)
    archive = out / "shell.tar.zst"
    results["tar|zstd+upload"] = seal_bench.measure(
        f"tar -cf - -C {package.parent} {package.name} | zstd -q -T0 -3 -o {archive} && "
        f"{sys.executable} -c '{UPLOAD}' {archive} b{number}/{archive.name}", shell=True, env=env)
    remote = {"RCLONE_CONFIG_STORE_TYPE": "s3", "RCLONE_CONFIG_STORE_PROVIDER": "SeaweedFS",
              "RCLONE_CONFIG_STORE_ACCESS_KEY_ID": ACCESS, "RCLONE_CONFIG_STORE_SECRET_ACCESS_KEY": SECRET,
              "RCLONE_CONFIG_STORE_ENDPOINT": endpoint}
    results["rclone copy"] = seal_bench.measure([str(BIN / "rclone"), "copy", str(package), f"store:bench/c{number}/",
                                                 "--config", "/dev/null", "--transfers", "4"], env={**env, **remote})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "itera-push-bench")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"push-{date.today()}.txt")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    package = seal_bench.build_package(args.work, args.size_gib)
    store = start_seaweedfs(args.work / "seaweedfs")
    try:
        store.client().create_bucket(Bucket="bench")
        env = {**seal_bench.ENV, **store_env(store.endpoint), "PYTHONPATH": seal_bench.ENV["PYTHONPATH"]}
        out = args.work / "out"
        out.mkdir(exist_ok=True)
        rounds = [round_of(package, out, env, store.endpoint, number) for number in range(args.rounds)]
    finally:
        store.stop()
        shutil.rmtree(args.work / "seaweedfs", ignore_errors=True)
    size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file())
    lines = [f"push benchmark {date.today()}: package {size / seal_bench.MiB:.0f} MiB "
             f"({sum(1 for f in package.rglob('*') if f.is_file())} files), {args.rounds} rounds, "
             "one SeaweedFS on loopback", *seal_bench.machine(), "",
             f"{'command':<18}{'median s':>10}{'min s':>9}{'max s':>9}{'cpu s':>9}{'peak RSS MiB':>14}"]
    medians = {}
    for name in rounds[0]:
        times = [r[name]["seconds"] for r in rounds]
        medians[name] = statistics.median(times)
        lines.append(f"{name:<18}{medians[name]:>10.2f}{min(times):>9.2f}{max(times):>9.2f}"
                     f"{statistics.median(r[name]['cpu'] for r in rounds):>9.2f}"
                     f"{max(r[name]['rss'] for r in rounds) / seal_bench.MiB:>14.0f}")
    lines += ["", f"verify --push / (tar|zstd + upload_file) = "
                  f"{medians['verify --push'] / medians['tar|zstd+upload']:.2f} (target <= 0.9)",
              f"verify --push / rclone copy = {medians['verify --push'] / medians['rclone copy']:.2f}",
              "verify --push also runs every check, reads the archive back, and proves the remote copy equal "
              "(the store's CRC64NVME); the shell pair and rclone check nothing of the package."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
