#!/usr/bin/env bash
# The whole suite: lint, then pytest in two worker processes (one per core; pytest-xdist), each
# test file kept on one worker (--dist loadfile: a file's module fixtures, such as a law's
# shared runs or a compiled model, are built once) and handed out as workers free up, so both
# end together on any machine. A static split into two fixed lists ended 100-150 s apart
# (860 s beside 761 s on the Intel Xeon, 1,234 s beside 1,086 s on the AVX2-only Zen 3); the
# same tests handed out took 721 s on the Xeon (2026-12-06, warm caches). Arguments go to
# pytest (e.g. -x, -k). Exit code is pytest's.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m ruff check engine specviz tests app.py || exit 1
exec .venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=10 \
  -n 2 --dist loadfile tests "$@"
