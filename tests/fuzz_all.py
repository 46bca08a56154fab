"""`make fuzz`: every reader's property at N examples (default 10,000), then the bypass corpus and the fault
tests, then the survival table (docs/survival.md).

    python -m tests.fuzz_all [--examples 10000] [--jobs 2] [--reader NAME ...] [--workdir DIR]

Unlike the CI test, a failing input does not stop its reader: every input is tried, failures are grouped by
where they happen (exception type and innermost itera_verify frame) and the first input of each group is
written, with its traceback, to WORKDIR/fuzz-failures.txt.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Offline before anything imports huggingface_hub (it reads these once, at import): run directly, not through
# `make fuzz`, the fixture build's PEFT save asked huggingface.co for the base's config.
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
SEED = 20261120  # fixed: the 10,000-example run is reproducible, and differs from CI's derandomized examples


def build_base(workdir: Path) -> tuple[Path, Path]:
    """The example package and its hub cache, built once per work folder (reused by later runs)."""
    package, hf_cache = workdir / "package", workdir / "hf-cache"
    if not (package / "manifest.json").is_file():
        sys.path.insert(0, str(ROOT))
        from transformers.utils import logging as hf_logging

        from fixtures.build import build_hub_cache, build_package

        hf_logging.disable_progress_bar()  # the table is the output; the fixture's training is not news
        hf_logging.set_verbosity_error()
        shutil.rmtree(package, ignore_errors=True)
        build_hub_cache(hf_cache)
        build_package(package, hf_cache)
    return package, hf_cache


def _signature(error: BaseException) -> str:
    """Where a failure happens: the innermost frame in the tool, else the assertion's first line."""
    text = "".join(traceback.format_exception(error))
    frames = re.findall(r'File "[^"]*/(itera_verify/[^"]+)", line (\d+), in (\w+)', text)
    cause = re.findall(r"^(\w+(?:Error|Exception|Hang)\b.*)$", text, re.M)
    if frames:
        path, line, func = frames[-1]
        return f"{cause[-1].split(':')[0] if cause else type(error).__name__} at {path}:{line} ({func})"
    return str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__


def fuzz_reader(name: str, examples: int, package: str, hf_cache: str) -> dict:
    """Run one reader's property on `examples` inputs; never stops at a failure."""
    sys.path.insert(0, str(ROOT))
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from tests.fuzz.properties import READERS
    from tests.fuzz.workspace import Workspace

    reader = next(r for r in READERS if r.name == name)
    stats = {"reader": name, "tried": 0, "failed": 0, "groups": {}, "seconds": 0.0, "skipped": False}
    if not reader.tools_present():
        stats["skipped"] = True
        return stats
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-workspace-"))
    workspace = Workspace(Path(package), Path(hf_cache), scratch)
    started = time.monotonic()

    @seed(SEED)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(reader.strategy(workspace))
    def run(example):
        stats["tried"] += 1
        try:
            reader.check(workspace, example)
        except Exception as error:  # noqa: BLE001 — counted and grouped, the run goes on
            stats["failed"] += 1
            group = stats["groups"].setdefault(_signature(error), {"count": 0})
            group["count"] += 1
            if group["count"] == 1:
                group["input"] = repr(example)[:4000]
                group["traceback"] = "".join(traceback.format_exception(error))[-6000:]

    try:
        run()
    except Exception as error:  # noqa: BLE001 — the generator's own fault: reported, the other readers go on
        stats["harness_error"] = "".join(traceback.format_exception(error))[-3000:]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    stats["seconds"] = round(time.monotonic() - started, 1)
    return stats


def run_pytest_file(test_file: str, junit: Path) -> list[tuple[str, str]]:
    """(test name, passed|failed|skipped|xfailed) for each test of one file."""
    subprocess.run([sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider",
                    f"--junitxml={junit}"], cwd=ROOT, capture_output=True, text=True)
    if not junit.is_file():
        return []
    results = []
    for case in ET.parse(junit).iter("testcase"):
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
            elif child.tag == "skipped":
                status = "xfailed" if "xfail" in (child.get("type", "") + child.get("message", "")) else "skipped"
        results.append((case.get("name"), status))
    return results


def _bypass_rows(results: list[tuple[str, str]]) -> tuple[list[str], int]:
    """One row per bypass form: refused when both its static and its command-line test passed."""
    forms: dict[str, dict[str, str]] = {}
    for name, status in results:
        test, _, form = name.partition("[")
        kind = "static" if "static" in test else "cli" if "command_line" in test else "live"
        forms.setdefault(form.rstrip("]"), {})[kind] = status
    rows, refused = [], 0
    for form, got in forms.items():
        ok = got.get("static") == "passed" and got.get("cli") == "passed"
        refused += ok
        verdict = "refused (IV506)" if ok else "**not refused**" if "failed" in got.values() else \
            f"known bypass ({got.get('static')})"
        live = {"passed": "yes", None: "n/a"}.get(got.get("live"), got.get("live"))
        rows.append(f"| `{form}` | {verdict} | {live} |")
    return rows, refused


BLOCK_BEGIN = "<!-- fuzz:begin (make fuzz writes this block: python -m tests.fuzz_all; do not edit by hand) -->"
BLOCK_END = "<!-- fuzz:end -->"


def with_block(document: str, block: str) -> str:
    """`document` with its generated block replaced by `block`; the notes written by hand around it are kept. A
    document without the block (a new one) gets a heading and the block."""
    begin, end = document.find(BLOCK_BEGIN), document.find(BLOCK_END)
    if begin < 0 or end < begin:
        return f"## Survival table\n\n{BLOCK_BEGIN}\n{block}\n{BLOCK_END}\n" + (f"\n{document}" if document else "")
    return document[:begin] + f"{BLOCK_BEGIN}\n{block}\n" + document[end:]


def survival_markdown(reader_stats: list[dict], bypasses, faults, examples: int) -> str:
    lines = [f"Produced by `make fuzz` (`python -m tests.fuzz_all --examples {examples}`). "
             "A failure is a traceback, a hang, an unpickled global, a started process, a stray write, a wrong exit "
             "code, a report breaking its schema or a missed IV506.", "",
             "| reader fuzzed | inputs tried | failures | distinct causes |", "|---|---:|---:|---:|"]
    for s in reader_stats:
        tried = "not available" if s["skipped"] else f"{s['tried']:,}" + (" (fuzzer error)" if s.get(
            "harness_error") else "")
        lines.append(f"| {s['reader']} | {tried} | {s['failed']:,} | {len(s['groups'])} |")
    total = sum(s["tried"] for s in reader_stats)
    lines += [f"| **all readers** | **{total:,}** | **{sum(s['failed'] for s in reader_stats):,}** | |", ""]
    rows, refused = _bypass_rows(bypasses)
    lines += [f"**Pickle bypass forms: {refused} of {len(rows)} refused** (IV506 in the static checks and through "
              "the command line with reloads; the payload's marker file never appeared).", "",
              "| form | verdict | payload proven live |", "|---|---|---|", *rows, ""]
    survived = sum(1 for _, status in faults if status == "passed")
    lines += [f"**Faults injected: {survived} of {len(faults)} survived** with nothing lost (clear exit code, no "
              "final or partial archive, no stray process, no temporary folder left).", "",
              "| fault | result |", "|---|---|", *[f"| `{name}` | {status} |" for name, status in faults], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz_all", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000, help="inputs per reader (default 10,000)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")), help="readers in parallel")
    parser.add_argument("--reader", action="append", help="only this reader (repeatable)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".fuzz-work", help="fixture and failure files")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/survival.md", help="survival table")
    parser.add_argument("--no-tests", action="store_true", help="skip the bypass corpus and the fault tests")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    package, hf_cache = build_base(args.workdir.resolve())

    sys.path.insert(0, str(ROOT))
    from tests.fuzz.properties import READERS

    names = args.reader or [r.name for r in READERS]
    print(f"fuzzing {len(names)} readers at {args.examples:,} examples each ({args.jobs} in parallel)", flush=True)
    stats: dict[str, dict] = {}
    failures_file = args.workdir / "fuzz-failures.txt"
    context = multiprocessing.get_context("spawn")  # torch is imported: never fork it
    with futures.ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool, \
            failures_file.open("w", encoding="utf-8") as failures:
        jobs = {pool.submit(fuzz_reader, name, args.examples, str(package), str(hf_cache)): name for name in names}
        for job in futures.as_completed(jobs):
            s = stats[jobs[job]] = job.result()
            print(f"  {s['reader']:<34} tried {s['tried']:>7,}  failures {s['failed']:>6,}  "
                  f"causes {len(s['groups']):>3}  {s['seconds']:>7.1f} s", flush=True)
            if s.get("harness_error"):
                print(f"  {s['reader']}: the fuzzer itself failed after {s['tried']} inputs:\n{s['harness_error']}")
            for signature, group in s["groups"].items():  # as each reader ends: a long run is readable early
                failures.write(f"=== {s['reader']}: {signature} ({group['count']} inputs)\n"
                               f"input: {group['input']}\n{group['traceback']}\n")
            failures.flush()
    ordered = [stats[name] for name in names]
    bypasses = faults = []
    if not args.no_tests:
        bypasses = run_pytest_file("tests/test_pickle_bypasses.py", args.workdir / "bypasses.xml")
        faults = run_pytest_file("tests/test_faults.py", args.workdir / "faults.xml")
    table = survival_markdown(ordered, bypasses, faults, args.examples)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    existing = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    args.out.write_text(with_block(existing, table.rstrip("\n")), encoding="utf-8")
    print("\n" + table + f"\nfailures (first input and traceback per cause): {failures_file}")
    return 1 if any(s["failed"] or s.get("harness_error") for s in ordered) else 0


if __name__ == "__main__":
    sys.exit(main())
