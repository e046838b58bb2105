#!/usr/bin/env bash
# The README's benchmark table: every method at its default settings (the default pair's:
# embedded-q4:a8, the GGUF as shipped, and its tuned settings) over the held-out set
# (assets/heldout/heldout.jsonl, never tuned on), one torch thread, each run interleaved with
# its matching generate() call, on the default path: compiled steps (bench-set's default for a
# packed target on a CPU, as in the app; the step store keeps them, so a second run compiles
# nothing); then the table is written into README.md and docs/benchmarks.md between their
# bench-table markers; then the token methods on the fp32 model (`embedded`, 2 repeats) and on
# embedded-q4 (16-bit activations) into docs/benchmarks.md's fp32-table block, eager
# (SPECVIZ_KV=dynamic: that table compares the weights, not the paths). About 25 minutes on a
# 2-core CPU with an empty step store. Runs resume: delete bench-out/ to measure afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
S=(env SPECVIZ_THREADS=1 .venv/bin/python -m engine bench-set
   --set assets/heldout/heldout.jsonl --report)
"${S[@]}" --methods greedy,sd,mcsd --max-new-tokens 48 --out bench-out/token
"${S[@]}" --categories chat --methods greedy,eesd --max-new-tokens 48 --out bench-out/eesd
"${S[@]}" --raw --categories code --methods beam,atspeed_strict --max-new-tokens 32 --repeats 4 \
  --out bench-out/beam
"${S[@]}" --categories code --temperature 1 --methods beam_sample,dsbd --max-new-tokens 32 \
  --repeats 4 --out bench-out/beam-sample
for page in README.md docs/benchmarks.md; do
  .venv/bin/python scripts/bench_table.py bench-out/token bench-out/eesd bench-out/beam \
    bench-out/beam-sample --readme "$page"
done
for t in embedded embedded-q4; do
  SPECVIZ_KV=dynamic "${S[@]}" --target "$t" --methods greedy,sd,mcsd --max-new-tokens 48 \
    --repeats 2 --out "bench-out/$t"
done
.venv/bin/python scripts/bench_table.py bench-out/embedded bench-out/embedded-q4 \
  --readme docs/benchmarks.md --block fp32-table
