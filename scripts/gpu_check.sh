#!/usr/bin/env bash
# GPU runbook, one call of about 9 minutes (H200, 12-04: tests/cuda 104 s, the step table 93 s +
# 148 s with --compiled): the CUDA tests (tests/cuda: the three KV paths,
# tree attention against sequential decoding, greedy and beam methods against generate(),
# fp32 and bf16, device maps, compiled steps captured), the step table (engine/bench/steps.py:
# dynamic / static / captured / compiled steps, c_verify(n), c_draft, generate() eager,
# bandwidth limit; SmolLM2-1.7B- and
# Qwen2.5-7B-sized random models built from configs, no download), the method rows
# (engine/bench/gpu.py) and last the peer generate() with static cache + torch.compile.
# Needs no network and no pip: ./.venv/bin/python when present, else the system python3
# (torch >= 2.11, transformers >= 5.17 and pytest preinstalled). Results go to $OUT
# (default artifacts/gpu): cuda_tests.log, steps.json/.md, steps_peer.md (the table with the
# compiled peer added), gpu_bench.json/.md.
# Usage: bash scripts/gpu_check.sh [--quick | --rehearse]
#   --quick: fewer tokens and repeats; --rehearse: tiny sizes on the CPU (checks the script).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
OUT=${OUT:-artifacts/gpu}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False PYTHONUNBUFFERED=1
STEPS=(--sizes smollm2-1.7b qwen2.5-7b --tokens 48 --reps 8 --compiled)
PEER=(--sizes smollm2-1.7b --compile-peer smollm2-1.7b --tokens 48 --reps 3 --peer-only)
BENCH=(--new-tokens 48 --repeats 2)
case "${1:-}" in
  --quick) STEPS=(--sizes smollm2-1.7b --tokens 32 --reps 5 --compiled); BENCH=(--new-tokens 32 --repeats 2) ;;
  --rehearse) STEPS=(--small --tokens 8 --reps 2 --device cpu --compiled)
              PEER=(--small --compile-peer small-target --tokens 8 --reps 2 --peer-only --device cpu)
              BENCH=(--small --device cpu) ;;
esac

"$PY" - <<'PY' || [ "${1:-}" = "--rehearse" ] || exit 1
import torch, transformers
print(f"python torch {torch.__version__}, transformers {transformers.__version__}")
if not torch.cuda.is_available():
    raise SystemExit("error: torch sees no CUDA device")
print("device", torch.cuda.get_device_name(), "bf16 native:",
      torch.cuda.is_bf16_supported(including_emulation=False))
PY

status=0
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout 240 "$PY" -m pytest -q -p no:cacheprovider -rs --durations=5 --timeout=120 tests/cuda \
    2>&1 | tee "$OUT/cuda_tests.log"
  status=${PIPESTATUS[0]}
else
  echo "pytest is not installed for $PY: the CUDA tests did not run" | tee "$OUT/cuda_tests.log"
  status=1
fi
timeout 330 "$PY" -m engine.bench.steps "${STEPS[@]}" --out "$OUT/steps.json" \
  | tee "$OUT/steps.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 60 "$PY" -m engine.bench.gpu "${BENCH[@]}" --out "$OUT/gpu_bench.json" \
  | tee "$OUT/gpu_bench.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 100 "$PY" -m engine.bench.steps "${PEER[@]}" --out "$OUT/steps.json" \
  | tee "$OUT/steps_peer.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
