#!/usr/bin/env bash
# GPU check: build the fixture package, reload every artifact on CUDA, print the device and per-artifact timings.
#
#   bash scripts/gpu-check.sh            (or: make gpu-check)
#
# Runs offline in well under 5 minutes on one GPU. On a real GPU the whole output (device, driver, timings) is
# kept as benchmarks/results/gpu-check-<date>.txt. Set GPU_CHECK_TESTS=0 to skip the pytest GPU tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONPATH="$ROOT/validator:${PYTHONPATH:-}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: no CUDA GPU here (nvidia-smi or torch.cuda missing); nothing to check" >&2
    exit 2
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/itera-gpu-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p benchmarks/results
RESULT="benchmarks/results/gpu-check-$(date +%F).txt"
[ -e "$RESULT" ] && RESULT="benchmarks/results/gpu-check-$(date +%F-%H%M%S).txt"

run() {
    local started=$SECONDS
    echo "== itera-verify GPU check, $(date -u +%FT%TZ)"
    echo "== machine: $(uname -srm), $(nproc) CPUs"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || return 2
    "$PY" -c 'import torch, transformers, peft; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, peft {peft.__version__}, device {torch.cuda.get_device_name(0)}")' || return 2

    echo "== building the fixture package"
    "$PY" -m fixtures.build "$WORK/package" --hf-cache "$WORK/hf-cache" >"$WORK/build.log" 2>&1 \
        || { tail -n 20 "$WORK/build.log"; return 2; }
    tail -n 1 "$WORK/build.log"

    echo "== reloading every artifact on cuda"
    local status=0
    "$PY" -m itera_verify "$WORK/package" --device cuda --no-seal --hf-cache "$WORK/hf-cache" \
        --format json >"$WORK/report.json" || status=$?
    [ -s "$WORK/report.json" ] || { echo "no report (exit $status)"; return 2; }
    "$PY" - "$WORK/report.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
print(f"{'artifact':<20}{'loader':<24}{'device':<9}{'ok':<5}{'total s':>9}{'load s':>9}{'start-up s':>12}"
      f"{'waited s':>10}{'peak MiB':>10}")
for r in report.get("reloads", []):
    facts = r.get("facts", {})
    peak = r.get("peak_memory_bytes") or 0
    print(f"{r['artifact']:<20}{r['loader']:<24}{r['device']:<9}{'yes' if r['ok'] else 'NO':<5}{r['seconds']:>9.2f}"
          f"{facts.get('load_seconds', float('nan')):>9.2f}{facts.get('startup_seconds', float('nan')):>12.2f}"
          f"{facts.get('gate_wait_seconds', 0):>10.2f}{peak / 2**20:>10.1f}")
    if not r["ok"]:
        print(f"    {r.get('failure')}: {r.get('error')}")
print("(waited: imported and ready while the previous artifact held the GPU; not part of its total)")
names = {r.get("facts", {}).get("device_name") for r in report.get("reloads", [])} - {None}
print(f"device name reported by the reload children: {', '.join(sorted(names)) or '?'}")
print(f"verdict: {report.get('verdict')}; findings: {[f['code'] for f in report.get('findings', [])]}")
EOF
    if [ "${GPU_CHECK_TESTS:-1}" != 0 ]; then
        echo "== pytest GPU tests"
        "$PY" -m pytest tests/test_gpu.py -q -p no:cacheprovider -m gpu || status=1
    fi
    echo "== done in $((SECONDS - started)) s (exit $status)"
    return $status
}

set +e
run 2>&1 | tee "$RESULT"
status=${PIPESTATUS[0]}
echo "kept: $RESULT"
exit "$status"
