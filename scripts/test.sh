#!/usr/bin/env bash
# The whole suite: lint, then two pytest processes side by side (one per core) of about equal
# time: the chi-square laws of the one-layer pair, of eesd, of the n-gram, feature and suffix
# drafters and of a packed target, the compiled path's tests and the beam methods, in one;
# everything else (unit, the hybrid drafter, the other model tests and laws, Check, the
# embedded model, the UI, the browser, the simulated Space) in the other (1,303 s and 1,319 s
# from a fresh clone, AMD EPYC Zen 4, 2026-12-03, 24.6 min with set-up). Arguments go to both
# (e.g. -x). Exit code is non-zero if either fails.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p artifacts
.venv/bin/python -m ruff check engine specviz tests app.py || exit 1
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=10)
FIRST=(tests/model/test_sampling_exactness.py tests/model/test_eesd_sampling_exactness.py
       tests/model/test_packed4_sampling_exactness.py tests/model/test_compiled_kv.py
       tests/model/test_ngram_sampling_exactness.py tests/model/test_feature_sampling_exactness.py
       tests/model/test_suffix_sampling_exactness.py tests/model/test_beam_methods.py)
"${PYTEST[@]}" "${FIRST[@]}" "$@" > artifacts/first.log 2>&1 &
first=$!
"${PYTEST[@]}" tests "${FIRST[@]/#/--ignore=}" "$@"
rest=$?
wait "$first"
first_rc=$?
echo "---- ${FIRST[*]} (artifacts/first.log) ----"
cat artifacts/first.log
[ "$rest" -eq 0 ] && [ "$first_rc" -eq 0 ]
