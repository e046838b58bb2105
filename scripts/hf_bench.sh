#!/usr/bin/env bash
# transformers' own assisted generation against the engine's methods on the embedded model
# (docs/benchmarks.md, "transformers' own modes against the engine's"): the held-out set
# (assets/heldout/heldout.jsonl, never tuned on), one torch thread, 48 new tokens, each run interleaved with its matching
# generate() call; then the time split per round (scripts/time_split.py). About 25 minutes
# on a 2-core CPU. Runs resume: delete bench-out/hf-* to measure afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
S=(env SPECVIZ_THREADS=1 .venv/bin/python -m engine bench-set --set assets/heldout/heldout.jsonl
   --max-new-tokens 48 --report)
# prompt lookup against the engine's n-gram drafter
"${S[@]}" --draft ngram --methods greedy,sd,hf_prompt_lookup --out bench-out/hf-ngram
# an assistant model: the engine's sd / eesd against transformers' assisted generation with
# the same early exit lent as its assistant_model, and transformers' own early exit
"${S[@]}" --draft early-exit --methods sd,eesd,hf_assisted,hf_early_exit --out bench-out/hf-exit
.venv/bin/python scripts/time_split.py bench-out/hf-ngram bench-out/hf-exit
