"""The llama-server behind each ``kind = "llama-cpp"`` model: a child process of `orl serve` / `orl worker`, started
with it, restarted when it dies, killed with it (``PR_SET_PDEATHSIG``), reached over HTTP like any remote engine.
Why and how: docs/engines.md, "The built-in chat model's llama-server"."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from ..backoff import Backoff
from ..catalog import Catalog, ModelSpec
from ..errors import ConfigError
from .openai_http import OpenAIEngine
from .packaged import packaged_file

__all__ = ["LlamaChild", "children_of", "supervising", "running"]

log = logging.getLogger("openrelay.engines")

_START_SECONDS = 60.0  # a process starts serving once its servers answer, or after this long without them
_RESTARTS = Backoff(base=0.5, cap=30.0)  # the wait before a restart, doubling while it keeps dying young
_STEADY_SECONDS = 60.0  # a server that ran this long had no part in the failures before it
_RUNNING: dict[str, LlamaChild] = {}  # this process's servers by model: engines and counting find them here
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child between fork and exec: the kernel kills it when the thread that forked it ends (the event
    loop's, which lives as long as its process), so a parent killed with SIGKILL leaves no server behind."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before the prctl: nobody would signal
        os._exit(1)


class LlamaChild:
    """One model's llama-server: ``--parallel`` slots for the calls one process sends it at once (the model's
    ``concurrency`` x ``slots``), each with the catalog's ``n_ctx`` tokens of context."""

    def __init__(self, spec: ModelSpec, binary: Path, log_path: Path) -> None:
        self.name = spec.name
        parallel = spec.concurrency * spec.slots
        n_ctx = int(spec.engine.get("n_ctx", 2048))
        threads = int(spec.engine.get("threads", min(parallel, os.cpu_count() or 1)))
        with socket.socket() as s:  # a free port, kept across restarts
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.command = [str(binary), "--model", str(packaged_file(str(spec.engine["gguf"]))), "--alias", spec.name,
                        "--host", "127.0.0.1", "--port", str(port), "--parallel", str(parallel),
                        "--ctx-size", str(parallel * n_ctx), "--threads", str(threads), "--threads-batch",
                        str(threads), "--metrics", "--no-webui"]
        self.log_path = log_path
        self.http = OpenAIEngine({"base_url": self.url + "/v1"}, max_connections=parallel)
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"llama-server {self.name}")

    async def _supervise(self) -> None:
        failures = 0
        with open(self.log_path, "ab") as out:
            while True:
                started = time.monotonic()
                try:
                    self._proc = await asyncio.create_subprocess_exec(  # its own session: a terminal's ^C is ours
                        *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                        start_new_session=True, preexec_fn=_die_with_parent)
                except OSError as exc:  # the program went away since the start: tried again like a crash
                    code: int | str = f"{exc.__class__.__name__}: {exc}"
                else:
                    log.info("llama-server for %s started (pid %d, %s)", self.name, self._proc.pid, self.url)
                    code = await self._proc.wait()  # calls meanwhile are refused: the gate probes until it is back
                failures = 1 if time.monotonic() - started > _STEADY_SECONDS else failures + 1
                delay = _RESTARTS.delay(failures)
                log.warning("llama-server for %s exited with %s; restarting in %.1f s (its log: %s)", self.name,
                            code, delay, self.log_path)
                await asyncio.sleep(delay)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await self.http.aclose()


def children_of(catalog: Catalog, binary: str, log_dir: Path) -> list[LlamaChild]:
    """A server for each ``llama-cpp`` model of the catalog, not yet started; ``ConfigError`` when there are such
    models and ``binary`` (``OPENRELAY_LLAMA_SERVER``) is not a program."""
    specs = [spec for spec in catalog.models.values() if spec.engine.get("kind") == "llama-cpp"]
    path = Path(binary).expanduser()
    if specs and not os.access(path, os.X_OK):
        raise ConfigError(f"{', '.join(s.name for s in specs)} runs on llama-server, and {str(path)!r} is not a "
                          "program: scripts/setup.sh builds it there, or OPENRELAY_LLAMA_SERVER names another")
    return [LlamaChild(spec, path, log_dir / f"llama-server.{spec.name.replace('/', '_')}.log") for spec in specs]


@contextlib.asynccontextmanager
async def supervising(children: list[LlamaChild]) -> AsyncIterator[None]:
    """The servers run (and are found by ``running``) inside this block, which starts once they answer, and are
    stopped when it ends."""
    for child in children:
        _RUNNING[child.name] = child
        child.start()
    try:
        deadline = time.monotonic() + _START_SECONDS  # counts are exact from the first request (engines/counting.py)
        for child in children:
            while not await child.http.healthy() and time.monotonic() < deadline:  # 503 while the model loads
                await asyncio.sleep(0.1)
        yield
    finally:
        for child in children:
            _RUNNING.pop(child.name, None)
            await child.stop()


def running(model: str) -> LlamaChild | None:
    return _RUNNING.get(model)

