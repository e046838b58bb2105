#!/usr/bin/env bash
# The whole suite: lint, then two pytest processes side by side (one per core) of about equal
# time: the chi-square laws of the one-layer pair, of eesd, of the n-gram, feature, suffix and
# hybrid drafters and of a packed target, the compiled path's tests, and the beam methods, in
# one; everything else (unit, Check, the step store and the other model tests and laws, the
# embedded model, the UI, the browser, the simulated Space) in the other. Each alone on one
# core of an AMD EPYC Zen 4 (2026-12-04, warm caches): 754 s and 1,025 s before the hybrid
# drafter and the step store (100 s alone) moved to the first; side by side each runs about
# 1.35x its time alone (a fresh clone with Check in the first too: 857 s and 709 s, 15.8 min
# with set-up). On the AVX2-only Zen 3 (fresh clone, 2026-12-04) 1,240 s and 1,019 s side by
# side, 22.1 min with set-up; with the step store back in the second, 1,173 s and 1,064 s, 20.9
# min. Arguments go to both (e.g. -x). Exit code is non-zero if either fails.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p artifacts
.venv/bin/python -m ruff check engine specviz tests app.py || exit 1
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=10)
FIRST=(tests/model/test_sampling_exactness.py tests/model/test_eesd_sampling_exactness.py
       tests/model/test_packed4_sampling_exactness.py tests/model/test_compiled_kv.py
       tests/model/test_ngram_sampling_exactness.py tests/model/test_feature_sampling_exactness.py
       tests/model/test_suffix_sampling_exactness.py tests/model/test_beam_methods.py
       tests/model/test_hybrid_drafter.py)
"${PYTEST[@]}" "${FIRST[@]}" "$@" > artifacts/first.log 2>&1 &
first=$!
"${PYTEST[@]}" tests "${FIRST[@]/#/--ignore=}" "$@"
rest=$?
wait "$first"
first_rc=$?
echo "---- ${FIRST[*]} (artifacts/first.log) ----"
cat artifacts/first.log
[ "$rest" -eq 0 ] && [ "$first_rc" -eq 0 ]
