#!/usr/bin/env bash
# GPU check (issue 17): on CUDA, one prepared script, offline, under 10 minutes on one GPU:
#   1. the example package's reloads (zygote + forked children, one child per GPU): devices, timings, host and
#      device peak memory, beside --isolation spawn for the start-up it saves;
#   2. a mid-size model (about 0.47 B parameters, bf16, sharded safetensors, random weights) reloaded by the tool
#      against a bare from_pretrained of the same folder (benchmarks/reload_bench.py --sections midsize);
#   3. "larger than one GPU", forced: ITERA_RELOAD_GPU_MEMORY caps each GPU's free memory below the model, so it
#      is spread over every GPU or, where they are too few or too small, refused: must end in IV504 naming the
#      offload (never a silent pass);
#   4. the multi-GPU training outputs the fixtures build (fixtures/multigpu.py), reloaded on the GPU;
#   5. the pytest GPU tests;
#   6. the loaders beyond text models (fixtures/extra_loaders.py): a tiny diffusers pipeline's denoising step and a
#      GGUF file dequantized on the device.
#
#   bash scripts/gpu-check.sh            (or: make gpu-check)
#
# On a real GPU the whole output is kept as benchmarks/results/gpu-check-<date>.txt. GPU_CHECK_TESTS=0 skips the
# pytest GPU tests, GPU_CHECK_MIDSIZE=0 the mid-size model, GPU_CHECK_MULTIGPU=0 the multi-GPU fixtures,
# GPU_CHECK_LOADERS=0 the diffusers and GGUF loaders. GPU_CHECK_ISOLATIONS: section 1's passes (default "auto
# spawn"; the suite's rehearsal gives "auto": the spawn pass is the same command, with four fresh imports).
# GPU_CHECK_PACKAGE=DIR with GPU_CHECK_HF_CACHE=DIR: a package and hub cache `python -m fixtures.build` already
# made, checked in place instead of building them (the test suite's rehearsal reuses the ones its session built).
# GPU_CHECK_DEVICE=cpu rehearses it without a GPU (sections 1, 2 and 4 on the CPU; 3, 4b and 5 need CUDA and are
# skipped; nothing kept): the device time a lent GPU has is short, so the plumbing is proven before it is spent.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONPATH="$ROOT/validator:${PYTHONPATH:-}"

DEVICE="${GPU_CHECK_DEVICE:-cuda}"
if [ "$DEVICE" = cpu ]; then
    echo "gpu-check: rehearsal on the CPU (GPU_CHECK_DEVICE=cpu): sections 3, 4b and 5 need CUDA and are skipped" >&2
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: no CUDA GPU here (nvidia-smi or torch.cuda missing); nothing to check" >&2
    exit 2
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/itera-gpu-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p benchmarks/results
RESULT="benchmarks/results/gpu-check-$(date +%F).txt"
[ -e "$RESULT" ] && RESULT="benchmarks/results/gpu-check-$(date +%F-%H%M%S).txt"
[ "$DEVICE" = cpu ] && RESULT="$WORK/rehearsal.txt"  # a rehearsal is not a GPU result: not kept
PREBUILT="${GPU_CHECK_PACKAGE:-}"
PACKAGE="${GPU_CHECK_PACKAGE:-$WORK/package}"
HF_CACHE="${GPU_CHECK_HF_CACHE:-$WORK/hf-cache}"
if [ -n "$PREBUILT" ] && { [ ! -f "$PACKAGE/manifest.json" ] || [ ! -d "$HF_CACHE" ]; }; then
    echo "gpu-check: GPU_CHECK_PACKAGE needs a built package and GPU_CHECK_HF_CACHE its hub cache" >&2
    exit 2
fi

run() {
    local started=$SECONDS
    echo "== itera-verify GPU check, $(date -u +%FT%TZ)"
    echo "== machine: $(uname -srm), $(nproc) CPUs"
    if [ "$DEVICE" = cuda ]; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || return 2
        "$PY" -c 'import torch, transformers, peft; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, peft {peft.__version__}, device {torch.cuda.get_device_name(0)}")' || return 2
    fi

    if [ -n "$PREBUILT" ]; then
        echo "== the fixture package built before: $PACKAGE"
    else
        echo "== building the fixture package"
        "$PY" -m fixtures.build "$PACKAGE" --hf-cache "$HF_CACHE" >"$WORK/build.log" 2>&1 \
            || { tail -n 20 "$WORK/build.log"; return 2; }
        tail -n 1 "$WORK/build.log"
    fi

    local status=0
    local isolations="${GPU_CHECK_ISOLATIONS:-auto spawn}"
    echo "== 1. the example package on $DEVICE, --isolation ${isolations// / then }" \
         "(auto: a zygote and forked children; spawn: a fresh interpreter each)"
    for isolation in $isolations; do
        local t0=$SECONDS
        "$PY" -m itera_verify "$PACKAGE" --device "$DEVICE" --no-seal --hf-cache "$HF_CACHE" \
            --isolation "$isolation" --format json >"$WORK/report-$isolation.json" 2>"$WORK/err-$isolation.log" \
            || status=$?
        [ -s "$WORK/report-$isolation.json" ] || { tail -n 5 "$WORK/err-$isolation.log"; echo "no report"; return 2; }
        echo "-- isolation $isolation: the whole verify in $((SECONDS - t0)) s;" \
             "$(grep -o 'reloading artifacts: done.*' "$WORK/err-$isolation.log" | tail -n 1)"
        "$PY" - "$WORK/report-$isolation.json" <<'PYEOF' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
print(f"{'artifact':<20}{'loader':<22}{'devices':<16}{'ok':<5}{'total s':>8}{'load s':>8}{'start-up s':>11}"
      f"{'host MiB':>10}{'GPU MiB':>9}  isolation")
for r in report.get("reloads", []):
    facts = r.get("facts", {})
    print(f"{r['artifact']:<20}{r['loader']:<22}{','.join(r.get('devices') or [r['device']]):<16}"
          f"{'yes' if r['ok'] else 'NO':<5}{r['seconds']:>8.2f}{facts.get('load_seconds', float('nan')):>8.2f}"
          f"{facts.get('startup_seconds', float('nan')):>11.2f}{(r.get('host_peak_memory_bytes') or 0) / 2**20:>10.0f}"
          f"{(r.get('device_peak_memory_bytes') or 0) / 2**20:>9.1f}  {facts.get('isolation')}")
    if not r["ok"]:
        print(f"    {r.get('failure')}: {r.get('error')}")
zygote = {r.get("facts", {}).get("zygote_import_seconds") for r in report.get("reloads", [])} - {None}
if zygote:
    print(f"zygote imports (once for every child): {min(zygote):.2f} s")
refused = {r.get("facts", {}).get("fork_refused") for r in report.get("reloads", [])} - {None}
if refused:
    print(f"not forked: {'; '.join(sorted(refused))}")
names = {r.get("facts", {}).get("device_name") for r in report.get("reloads", [])} - {None}
print(f"device name reported by the reload children: {', '.join(sorted(names)) or '?'}")
print(f"verdict: {report.get('verdict')}; findings: {[f['code'] for f in report.get('findings', [])]}")
sys.exit(0 if report.get("verdict") == "pass" else 1)
PYEOF
    done

    if [ "${GPU_CHECK_MIDSIZE:-1}" != 0 ]; then
        echo "== 2. mid-size model on $DEVICE: the tool against a bare from_pretrained, same run"
        "$PY" benchmarks/reload_bench.py --package "$PACKAGE" --hf-cache "$HF_CACHE" --device "$DEVICE" \
            --repeat 1 --sections midsize --keep "$WORK/midsize" --no-save >"$WORK/midsize.txt" \
            2>"$WORK/midsize.log" || { tail -n 20 "$WORK/midsize.log"; status=1; }
        sed -n '/== mid-size/,$p' "$WORK/midsize.txt"

        echo "== 3. larger than one GPU, forced: each GPU capped at 256 MiB of free memory for the mid-size model"
        if [ "$DEVICE" = cpu ]; then
            echo "skipped in a rehearsal (needs CUDA)"
        elif [ -d "$WORK/midsize/midsize-package" ]; then
            ITERA_RELOAD_GPU_MEMORY=256MiB "$PY" -m itera_verify "$WORK/midsize/midsize-package" --device cuda \
                --no-seal --hf-cache "$HF_CACHE" --format json >"$WORK/capped.json" 2>"$WORK/capped.log" || true
            "$PY" - "$WORK/capped.json" <<'PYEOF' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
(result,) = [r for r in report["reloads"] if r["artifact"] == "control-model"]
codes = [f["code"] for f in report["findings"] if f.get("artifact") == "control-model"]
print(f"control-model: ok={result['ok']} devices={result.get('devices')} findings={codes}")
print(f"  {result.get('error')}")
refused = not result["ok"] and "IV504" in codes and "offload" in (result.get("error") or "")
print("capped reload: " + ("refused as IV504, the offload named (expected)" if refused else
                           "NOT refused as an offload: a silent pass or another failure"))
sys.exit(0 if refused else 1)
PYEOF
        else
            echo "no mid-size package (section 2 failed)"; status=1
        fi
    fi

    if [ "${GPU_CHECK_MULTIGPU:-1}" != 0 ]; then
        echo "== 4. multi-GPU training outputs (fixtures/multigpu.py) reloaded on $DEVICE"
        if "$PY" -m fixtures.multigpu "$PACKAGE" "$WORK/multigpu" >"$WORK/multigpu-build.log" 2>&1; then
            local built="$WORK/multigpu"
            [ -f "$built/manifest.json" ] || built="$WORK/multigpu/package"
            "$PY" -m itera_verify "$built" --device "$DEVICE" --no-seal --hf-cache "$HF_CACHE" \
                --format json >"$WORK/multigpu.json" 2>"$WORK/multigpu.log" || true
            "$PY" - "$WORK/multigpu.json" <<'PYEOF' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
bad = 0
for r in report.get("reloads", []):
    bad += not r["ok"]
    print(f"{r['artifact']:<24}{r['loader']:<24}{','.join(r.get('devices') or [r['device']]):<14}"
          f"{'yes' if r['ok'] else 'NO':<5}{r['seconds']:>7.2f} s" + ("" if r["ok"] else f"  {r.get('error')}"))
print(f"verdict: {report.get('verdict')}; findings: {sorted({f['code'] for f in report.get('findings', [])})}")
sys.exit(1 if bad else 0)
PYEOF
        else
            tail -n 15 "$WORK/multigpu-build.log"; status=1
        fi
    fi
    if [ "${GPU_CHECK_MULTIGPU:-1}" != 0 ] && [ "$DEVICE" = cuda ]; then
        # accelerate enables FSDP only on GPUs (under MULTI_CPU its fsdp_plugin is dropped and the Trainer trains
        # plain DDP), so the Trainer's own sharded FSDP checkpoint can only be made here.
        local gpus
        gpus="$("$PY" -c 'import torch; print(min(2, torch.cuda.device_count()))')"
        echo "== 4b. a real FSDP2 Trainer run (SHARDED_STATE_DICT) on $gpus GPU(s), its checkpoint-2/ reloaded"
        mkdir -p "$WORK/fsdp-trainer"
        if (cd "$WORK/fsdp-trainer" && PYTHONPATH="$ROOT:$PYTHONPATH" "$PY" -m torch.distributed.run --standalone \
                --nproc_per_node "$gpus" -m fixtures.multigpu_ranks trainer-fsdp .) >"$WORK/fsdp-trainer.log" 2>&1; then
            "$PY" - "$WORK/fsdp-trainer" <<'PYEOF' || status=1
import sys
from pathlib import Path

import torch
from itera_verify.reload.common import Outcome
from itera_verify.reload.loaders import loader_module

work = Path(sys.argv[1])
checkpoint = work / "run/checkpoint-2"
print("files:", sorted(p.name for p in checkpoint.iterdir()))
job = {"loader": "hf-trainer-checkpoint", "path": str(checkpoint), "package_root": str(work),
       "config": str(work / "model-config")}
outcome = Outcome(job)
loader_module("hf-trainer-checkpoint").reload(job, torch.device("cuda"), outcome)
print(f"layout {outcome.facts.get('layout')}, forward {outcome.forward}, problems {outcome.problems}")
sys.exit(0 if outcome.ok and outcome.facts.get("layout") == "fsdp" else 1)
PYEOF
        else
            tail -n 15 "$WORK/fsdp-trainer.log"; status=1
        fi
    fi
    if [ "${GPU_CHECK_LOADERS:-1}" != 0 ]; then
        echo "== 6. loaders beyond text models on $DEVICE: a diffusers pipeline's denoising step, a GGUF file read"
        "$PY" - "$WORK/loaders" "$DEVICE" <<'PYEOF' || status=1
import sys
from pathlib import Path

from fixtures.extra_loaders import reload_package, write_diffusers_pipeline, write_gguf, write_package

root, device = Path(sys.argv[1]) / "package", sys.argv[2]
(root / "artifacts").mkdir(parents=True)
write_diffusers_pipeline(root / "artifacts/sd", root.parent / "tokenizer")
write_gguf(root / "artifacts/model.gguf")
write_package(root, [("sd", "diffusers-pipeline", "artifacts/sd", {"loader": "diffusers"}),
                     ("gguf", "gguf", "artifacts/model.gguf", {"loader": "gguf"})])
results, findings = reload_package(root, device=device)
for r in results.values():
    print(f"{r.artifact}: ok={r.ok} device={r.device} {r.seconds:.1f} s, peak {r.peak_memory_bytes} B, "
          f"forward: {r.forward}; {r.error or ''}")
for finding in findings:
    print(f"{finding.code} {finding.message}")
sys.exit(0 if all(r.ok and r.device.startswith(device) for r in results.values()) and not findings else 1)
PYEOF
    fi

    if [ "${GPU_CHECK_TESTS:-1}" != 0 ] && [ "$DEVICE" = cuda ]; then
        echo "== 5. pytest GPU tests"
        "$PY" -m pytest tests/test_gpu.py -q -p no:cacheprovider -m gpu || status=1
    fi
    echo "== done in $((SECONDS - started)) s (exit $status)"
    return $status
}

set +e
run 2>&1 | tee "$RESULT"
status=${PIPESTATUS[0]}
if [ "$DEVICE" = cpu ]; then echo "rehearsal: nothing kept"; else echo "kept: $RESULT"; fi
exit "$status"
