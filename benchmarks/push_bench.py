"""Leaving the machine: the seal and push against the shell tools and SDK doing the same, side by side, one run.

    .venv/bin/python benchmarks/push_bench.py [--package campaign|small|both] [--size 300M] [--rounds 3]
                                              [--cores split|shared|both] [--link MB/s] [--no-rclone]
                                              [--out FILE]

Two packages, each valid (it passes its checks before it is timed):

  campaign  a recorded campaign (itera_verify.record: plan, stop rules, metrics, predictions, the decision) of
            three runs, each with a Trainer-like checkpoint folder: a bf16 `model.safetensors` (about a third)
            and an `optimizer.pt` of fp32 Adam moments written by torch.save (the rest): what a rental ends with.
            --size sets its total (300M default; 2G for the issue's "2 GB and more").
  small     seal_bench.py's package of --size (the example package plus weight shards, a large JSONL and 20,000
            small JSON files): the case where the checks dominate.

starts one SeaweedFS on loopback (tests/push_stores.py, the store the tests use) and, in each round, times:

  verify --push   itera-verify DIR --no-reload -o OUT --push s3://bench/a/   (checks, seal, read-back, push
                                                                            overlapping the seal, the store's
                                                                            CRC64NVME, receipt)
  tar|zstd+upload tar -cf - DIR | zstd -T0 -3 -o FILE, then boto3 upload_file (default TransferConfig)
  rclone copy     rclone copy DIR of the raw folder to the same store (checksums per file by rclone)

Each command is its own process; peak memory is its process tree's maximum resident set (wait4), its CPU the
tree's; `store cpu s` is what the store's process used meanwhile. Medians over the rounds; the order of the
commands alternates from round to round, so a burst of load elsewhere does not always fall on the same one. The
ratio the issue asks for is verify --push over the sequential pair. Run on a quiet machine (`uptime` before and
after is written with the results).

Where the store runs (--cores, one table each by default):
  split   the store (and the --link proxy) on half of the cores, every command on the other half, as a store on
          another machine is: the store's CPU never comes out of the command's. This is the case a rental is in,
          and the one the overlap is for: the seal's work runs while the store takes the parts.
  shared  everything on every core. SeaweedFS spends about one core-second per 110 MB it takes in (its own
          MD5, SHA-256 and CRC checks, its volume writes): on 2 cores both commands are then bound by the CPU of
          the two processes together, and the ratio is theirs, whatever overlaps (verify --push also checks the
          package and reads the archive back; the pair does neither). Kept as the worst case.
The tool's bytecode is compiled first, as `pip install` leaves it: run from a source tree with
PYTHONDONTWRITEBYTECODE=1, every itera-verify process would otherwise compile its ~110 modules again (0.2-0.4 s
of CPU that no installed copy pays), while boto3 and the shell tools start compiled.
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
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
RUNS = ("control", "lora-r16", "lora-r64")
# The throttled link runs in a process of its own: the bodies it holds would otherwise count in the peak memory
# of every command forked from this one (a forked child's RSS starts as its parent's).
LINK = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.push_stores import FaultProxy
proxy = FaultProxy(sys.argv[2])
proxy.rate = float(sys.argv[3])
print(proxy.endpoint, flush=True)
sys.stdin.read()
"""


# ---- the campaign package ----------------------------------------------------------------------------------
def generate_campaign(root: Path, total: int) -> None:
    """Runs in a child (torch and numpy must not count in this process): the campaign through the recorder."""
    import numpy as np
    import torch
    from itera_verify.record import open_campaign

    ids = [f"q-{i:04d}" for i in range(200)]
    campaign = open_campaign(root, "lora-sweep-2026-12", "Does LoRA r16 match full fine-tuning on the reviews?",
                             "reviews", "v3", ids)
    campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}], reserved_hours=40)
    campaign.declare_stop_rules([{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"}])
    rng = np.random.default_rng(7)
    per_run, chunk = total // len(RUNS), 4 * seal_bench.MiB  # chunk: values per tensor
    for index, run_id in enumerate(RUNS):
        run = campaign.start_run(run_id, "control" if index == 0 else "variant",
                                 params={"seed": index, "learning_rate": 2e-4, "lora_r": [0, 16, 64][index]})
        for step in range(1, 201):
            run.log_dict(step, {"loss": 2.0 / step ** (0.3 + index / 50), "learning_rate": 2e-4})
        folder = root / "checkpoints" / run_id / "checkpoint-200"
        folder.mkdir(parents=True)
        tensors = max(1, per_run // 3 // (2 * chunk))  # bf16 weights: a third of the run
        header = {f"model.layers.{t}.weight": {"dtype": "BF16", "shape": [chunk // 1024, 1024],
                                               "data_offsets": [t * 2 * chunk, (t + 1) * 2 * chunk]}
                  for t in range(tensors)}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / "model.safetensors", "wb") as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            for _ in range(tensors):
                values = rng.standard_normal(chunk, dtype=np.float32) * 0.02
                fh.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
        groups = max(1, (per_run - tensors * 2 * chunk) // (8 * seal_bench.MiB))  # two fp32 moments of 1 Mi values
        state = {g: {"step": torch.tensor(200.0),
                     "exp_avg": torch.from_numpy(rng.standard_normal(seal_bench.MiB, dtype=np.float32) * 1e-3),
                     "exp_avg_sq": torch.from_numpy(rng.random(seal_bench.MiB, dtype=np.float32) * 1e-6)}
                 for g in range(groups)}
        torch.save({"state": state, "param_groups": [{"lr": 2e-4, "params": list(range(groups))}]},
                   folder / "optimizer.pt")
        torch.save({"last_epoch": 200, "_step_count": 201}, folder / "scheduler.pt")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": 200, "epoch": 1.0}))
        run.artifact(folder / "model.safetensors", "safetensors")
        with run.predictions() as stream:
            for position, example in enumerate(ids):
                stream.write(example, ("positive", "negative", "neutral")[(position + index) % 3])
        run.complete()
    campaign.decision("continue", after="pilot")
    campaign.close("positive", "r16 matches the control", accepted=list(RUNS[:2]), error_analysis="# none\n",
                   observed_hours=40)


def build_campaign(work: Path, size: int) -> Path:
    package = work / f"campaign-{size >> 20}mib" / "lora-sweep-2026-12"
    if not (package / "manifest.json").exists():
        shutil.rmtree(package.parent, ignore_errors=True)
        package.parent.mkdir(parents=True)
        subprocess.run([sys.executable, __file__, "--generate-campaign", str(package), str(size)], check=True,
                       env=seal_bench.ENV)
        check = subprocess.run([*seal_bench.CLI, str(package), "--no-reload", "--no-seal", "-q"],
                               env=seal_bench.ENV, capture_output=True, text=True)
        if check.returncode != 0:
            sys.exit(f"the campaign package does not pass its checks:\n{check.stdout}{check.stderr}")
    return package


# ---- measuring ---------------------------------------------------------------------------------------------
def store_cpu(pid: int) -> float:
    """CPU-seconds (user + system) the store's process has used so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_of(package: Path, out: Path, env: dict, endpoint: str, number: int, rclone: bool,
             store_pid: int) -> dict[str, dict]:
    def verify_push():
        return seal_bench.measure([*seal_bench.CLI, str(package), "--no-reload", "-q", "-o", str(out), "--push",
                                   f"s3://bench/a{number}/"], env=env)

    def pair():
        archive = out / "shell.tar.zst"
        return seal_bench.measure(
            f"tar -cf - -C {package.parent} {package.name} | zstd -q -T0 -3 -o {archive} && "
            f"{sys.executable} -c '{UPLOAD}' {archive} b{number}/{archive.name}", shell=True, env=env)

    def rclone_copy():
        remote = {"RCLONE_CONFIG_STORE_TYPE": "s3", "RCLONE_CONFIG_STORE_PROVIDER": "SeaweedFS",
                  "RCLONE_CONFIG_STORE_ACCESS_KEY_ID": ACCESS, "RCLONE_CONFIG_STORE_SECRET_ACCESS_KEY": SECRET,
                  "RCLONE_CONFIG_STORE_ENDPOINT": endpoint}
        return seal_bench.measure([str(BIN / "rclone"), "copy", str(package), f"store:bench/c{number}/",
                                   "--config", "/dev/null", "--transfers", "4"], env={**env, **remote})

    def with_store(command):  # the store's CPU-seconds during the command: on shared cores it is part of the cost
        def timed():
            before = store_cpu(store_pid)
            result = command()
            result["store_cpu"] = store_cpu(store_pid) - before
            return result
        return timed

    order = [("verify --push", verify_push), ("tar|zstd+upload", pair)]
    if number % 2:  # alternate: neither side always runs first
        order.reverse()
    if rclone:
        order.append(("rclone copy", rclone_copy))
    results = {}
    for name, command in order:
        for old in out.glob("*"):
            old.unlink()
        results[name] = with_store(command)()
    return results


def split_cores() -> tuple[set[int], set[int]] | None:
    """(the store's cores, the commands' cores): the later half for the store and the link (the larger one on an
    odd count), the rest for the commands; None on a single core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return set(cores[half:]), set(cores[:half])


def bench(package: Path, title: str, rounds: int, rclone: bool, work: Path, link: float | None = None,
          split: bool = False) -> list[str]:
    """`split`: the store (and the link) run on cores of their own and every command on the others, as a store on
    another machine does; otherwise all share every core."""
    everywhere = os.sched_getaffinity(0)
    cores = split_cores() if split else None
    if cores is not None:
        title += f", the store on core(s) {','.join(map(str, sorted(cores[0])))} and the commands on " \
                 f"{','.join(map(str, sorted(cores[1])))}"
    elif split:
        title += ", one core: shared"
    else:
        title += ", the store sharing every core with the commands"
    store = proxy = None
    try:
        if cores is not None:  # the store's process and the link's inherit these; the commands the others
            os.sched_setaffinity(0, cores[0])
        store = start_seaweedfs(work / "seaweedfs")
        store.client().create_bucket(Bucket="bench")
        endpoint = store.endpoint
        if link is not None:  # every command reaches the same store through one link of `link` bytes/s
            proxy = subprocess.Popen([sys.executable, "-c", LINK, str(ROOT), store.endpoint, str(link)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            endpoint = proxy.stdout.readline().strip()
            title += f", over a {link / 1e6:.0f} MB/s link"
        if cores is not None:
            os.sched_setaffinity(0, cores[1])
        env = {**seal_bench.ENV, **store_env(endpoint), "PYTHONPATH": seal_bench.ENV["PYTHONPATH"]}
        out = work / "out"
        out.mkdir(exist_ok=True)
        results = []
        for number in range(rounds):
            results.append(round_of(package, out, env, endpoint, number, rclone, store.process.pid))
            print(f"{title} round {number + 1}: " + ", ".join(f"{name} {r['seconds']:.2f} s"
                                                              for name, r in results[-1].items()), flush=True)
        for old in out.glob("*"):
            old.unlink()
    finally:
        os.sched_setaffinity(0, everywhere)
        if proxy is not None:
            proxy.stdin.close()
            proxy.wait(10)
        if store is not None:
            store.stop()
        shutil.rmtree(work / "seaweedfs", ignore_errors=True)
    files = [f for f in package.rglob("*") if f.is_file()]
    lines = [f"{title}: {sum(f.stat().st_size for f in files) / seal_bench.MiB:.0f} MiB ({len(files)} files), "
             f"{rounds} rounds", f"{'command':<18}{'median s':>10}{'min s':>9}{'max s':>9}{'cpu s':>9}"
             f"{'store cpu s':>13}{'peak RSS MiB':>14}"]
    medians = {}
    for name in ("verify --push", "tar|zstd+upload", "rclone copy"):
        if name not in results[0]:
            continue
        times = [r[name]["seconds"] for r in results]
        medians[name] = statistics.median(times)
        lines.append(f"{name:<18}{medians[name]:>10.2f}{min(times):>9.2f}{max(times):>9.2f}"
                     f"{statistics.median(r[name]['cpu'] for r in results):>9.2f}"
                     f"{statistics.median(r[name]['store_cpu'] for r in results):>13.2f}"
                     f"{max(r[name]['rss'] for r in results) / seal_bench.MiB:>14.0f}")
    pairs = [r["verify --push"]["seconds"] / r["tar|zstd+upload"]["seconds"] for r in results]
    ratio = medians["verify --push"] / medians["tar|zstd+upload"]
    lines.append(f"verify --push / (tar|zstd + upload_file) = {ratio:.2f} (target <= 0.9; per round: "
                 f"{', '.join(f'{x:.2f}' for x in pairs)})")
    if "rclone copy" in medians:
        lines.append(f"verify --push / rclone copy = {medians['verify --push'] / medians['rclone copy']:.2f}")
    else:
        lines.append("rclone copy: not run (--no-rclone)")
    return lines


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1:].upper() in units else int(text)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--generate-campaign":
        generate_campaign(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", choices=("campaign", "small", "both"), default="both")
    parser.add_argument("--size", default="300M", help="the campaign package's size (300M, 2G)")
    parser.add_argument("--small-size", default="0.25G", help="the small-file package's size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-rclone", action="store_true", help="skip rclone copy (slow on large packages)")
    parser.add_argument("--link", type=float, default=None, metavar="MB/s",
                        help="reach the store through a loopback link of this many MB/s (tests/push_stores."
                             "FaultProxy, one body at a time): a rental's uplink rather than a store on the same "
                             "cores")
    parser.add_argument("--cores", choices=("split", "shared", "both"), default="both",
                        help="split: the store (and --link) on half the cores, the commands on the others, as a "
                             "store on another machine is; shared: everything on every core (the store then "
                             "competes with the command it serves); both (default): one table each")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "itera-push-bench")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"push-{date.today()}.txt")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    link = args.link * 1e6 if args.link else None
    compileall.compile_dir(ROOT / "validator", quiet=1)
    lines = [f"push benchmark {date.today()}: one SeaweedFS on loopback; command order alternating per round",
             *seal_bench.machine(), f"uptime before: {uptime()}",
             f"command: {' '.join([Path(sys.executable).name, *sys.argv])}"]
    splits = {"split": [True], "shared": [False], "both": [True, False]}[args.cores]
    if args.package in ("campaign", "both"):
        package = build_campaign(args.work, parse_size(args.size))
        for split in splits:
            lines += ["", *bench(package, "campaign package (3 runs, safetensors + optimizer.pt)", args.rounds,
                                 not args.no_rclone, args.work, link, split)]
    if args.package in ("small", "both"):
        package = seal_bench.build_package(args.work, parse_size(args.small_size) / seal_bench.GiB)
        for split in splits:
            lines += ["", *bench(package, "small-file package (seal_bench.py's builder)", args.rounds,
                                 not args.no_rclone, args.work, link, split)]
    lines += ["", f"uptime after: {uptime()}",
              "verify --push also runs every check, reads the archive back, and proves the remote copy equal "
              "(the store's CRC64NVME); the shell pair and rclone check nothing of the package."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
