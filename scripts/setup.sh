#!/usr/bin/env bash
# Install everything specviz needs into ./.venv (idempotent; registries only): the app's
# requirements.txt (the embedded model included, see its comment) plus the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# a stamp of what was installed: unchanged requirements skip pip (10-20 s) on later runs
STAMP=.venv/specviz-setup.sha256
WANT=$(cat requirements.txt requirements-dev.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0  # the GGUF's conversion, if its cache was emptied since, happens at first load
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch first and alone, so nothing else can pull a CUDA build
.venv/bin/python -m pip install -q --no-compile torch==2.13.0
.venv/bin/python -m pip install -q --no-compile -r requirements-dev.txt
# then the byte-code of all of it on every core (pip compiles one file at a time: 53 s against
# 34 on 2 cores, Intel Xeon, 2026-12-07). Needed where PYTHONDONTWRITEBYTECODE is set: nothing
# would write it later, and every process would compile torch's modules at each import. Some
# files are other Pythons' syntax (torch's py312 test helpers): compileall's exit code is 1.
.venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages > /dev/null || true
# convert the GGUF once into the safetensors cache (about 20 s the first time)
.venv/bin/python -c "from engine.run.models import embedded_model_dir; print('embedded model:', embedded_model_dir())"
echo "$WANT" > "$STAMP"
