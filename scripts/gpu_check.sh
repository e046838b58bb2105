#!/usr/bin/env bash
# GPU runbook: the CUDA exactness tests (tests/cuda, fp32 and bf16) and the GPU benchmark
# with random-initialised models of real sizes (engine/bench/gpu.py: a SmolLM2-1.7B-sized
# target, a 135M-sized drafter; no download). Needs no network and no pip: it uses
# ./.venv/bin/python when present, else the system python3 (torch >= 2.11 and
# transformers >= 5.17 preinstalled; pytest for the tests). Results go to $OUT
# (default artifacts/gpu): cuda_tests.log, gpu_bench.md, gpu_bench.json.
# Usage: bash scripts/gpu_check.sh [--quick]   (--quick: 32 tokens, 2 repeats)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
OUT=${OUT:-artifacts/gpu}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
BENCH=(--new-tokens 128 --repeats 5)
[ "${1:-}" = "--quick" ] && BENCH=(--new-tokens 32 --repeats 2)

"$PY" - <<'PY' || exit 1
import torch, transformers
print(f"python torch {torch.__version__}, transformers {transformers.__version__}")
if not torch.cuda.is_available():
    raise SystemExit("error: torch sees no CUDA device")
print("device", torch.cuda.get_device_name(), "bf16 native:",
      torch.cuda.is_bf16_supported(including_emulation=False))
PY

status=0
if "$PY" -c "import pytest" 2>/dev/null; then
  "$PY" -m pytest -q -p no:cacheprovider -rs tests/cuda 2>&1 | tee "$OUT/cuda_tests.log"
  status=${PIPESTATUS[0]}
else
  echo "pytest is not installed for $PY: the CUDA tests did not run" | tee "$OUT/cuda_tests.log"
  status=1
fi
"$PY" -m engine.bench.gpu "${BENCH[@]}" --out "$OUT/gpu_bench.json" | tee "$OUT/gpu_bench.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
