#!/usr/bin/env bash
# One call on a lent GPU, inside a time budget: the shipped feature drafter trained further on
# fresh shards of the shipped prompt set (assets/selfgen_prompts.jsonl; the shipped drafter's
# data held none of it), at each learning rate of LRS while time is left. Needs the GGUF's
# pieces in /tmp/gg/ and the gguf wheel in .whl/ (docs/training.md). Every stage is
# scripts/gpu_train.sh's; the shards come back packed before any training starts, and each
# training run writes its best epoch so far after every epoch, so a run cut by the budget
# still leaves weights.
#
# Usage: bash scripts/gpu_finetune.sh OUTDIR
#   env: BUDGET (seconds for the whole script, 520), GEN_SECONDS (230), LRS ("0.0003 0.0001"),
#        EPOCHS (3), MAX_NEW (160), LIMIT_PROMPTS (0 = all), DEVICE (cuda),
#        WORK (/tmp/specviz-finetune: its own, so no shard of a gpu_train.sh run is reused)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/gpu_finetune.sh OUTDIR}
budget=${BUDGET:-520}
export OUT=$out N_SYNTH=0 SAMPLES=0.5 BEAMS=0 WORK=${WORK:-/tmp/specviz-finetune}
mkdir -p "$out"
bash scripts/gpu_train.sh setup || exit 1
bash scripts/gpu_train.sh synth || exit 1
timeout "${GEN_SECONDS:-230}" bash scripts/gpu_train.sh generate
echo "generate: rc $?, $SECONDS s"
bash scripts/gpu_train.sh pack
for lr in ${LRS:-0.0003 0.0001}; do
  left=$((budget - SECONDS))
  if [ "$left" -lt 60 ]; then echo "lr $lr: no time left"; break; fi
  INIT=assets/feature_drafter/feature.safetensors LR=$lr EPOCHS=${EPOCHS:-3} \
    timeout "$left" bash scripts/gpu_train.sh train ce "_lr$lr"
  echo "lr $lr: rc $?, $SECONDS s"
done
