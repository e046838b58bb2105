#!/usr/bin/env bash
# The whole suite: lint, then two pytest processes side by side (one per core): the
# 20,000-sample chi-square tests in one, everything else (unit, model, embedded, UI,
# browser) in the other. Exit code is non-zero if either fails.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p artifacts
.venv/bin/python -m ruff check engine specviz tests app.py || exit 1
CHI=tests/model/test_sampling_exactness.py
.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=1800 "$CHI" \
    > artifacts/chi-square.log 2>&1 &
chi=$!
.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --ignore="$CHI" "$@"
rest=$?
wait "$chi"
chi_rc=$?
echo "---- chi-square tests ($CHI) ----"
cat artifacts/chi-square.log
[ "$rest" -eq 0 ] && [ "$chi_rc" -eq 0 ]
