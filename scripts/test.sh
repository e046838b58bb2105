#!/usr/bin/env bash
# The whole suite: lint, then two pytest processes side by side (one per core) of about equal
# time: the chi-square laws of the one-layer pair, of eesd, of the n-gram, feature, suffix and
# hybrid drafters, the compiled path's tests, and the beam methods, in one; everything else
# (unit, Check, the step store, the packed target's law and the other model tests and laws, the
# embedded model, the UI, the browser, the simulated Space) in the other. Side by side on the
# AVX2-only Zen 3 (2026-12-05, warm caches, --durations=0) they took 1,234 s and 1,086 s, the
# first holding the packed target's law (67 s there) and most of the compiles (the compiled
# path's tests: 337 s side by side, 167 s alone); the law moved to the second. On an AMD EPYC
# Zen 4 (2026-12-04, a fresh clone) 857 s and 709 s with Check in the first, 15.8 min with
# set-up; each runs about 1.35x its time alone. Arguments go to both (e.g. -x). Exit code is
# non-zero if either fails.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p artifacts
.venv/bin/python -m ruff check engine specviz tests app.py || exit 1
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=10)
FIRST=(tests/model/test_sampling_exactness.py tests/model/test_eesd_sampling_exactness.py
       tests/model/test_compiled_kv.py
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
