"""The built-in chat model's llama-server is a child process of `orl serve` and `orl worker`
(openrelay/engines/llama_child.py): restarted when it dies, stopped with its parent, also when the parent is killed
with SIGKILL, and serving `/metrics`. Real processes throughout."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from tests.support import http_client
from tests.support.batches import create, results
from tests.support.forked import run_orl, start_orl
from tests.support.server import Server

pytestmark = pytest.mark.slow  # llama-server on SmolLM2

MODEL = "openrelay/smollm2-135m"


def llama_children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if p.name() == "llama-server"]


def the_llama_child(pid: int, *, other_than: int | None = None, timeout: float = 60) -> psutil.Process:
    """The one llama-server child of ``pid`` (a new one, when ``other_than`` names the one before)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in llama_children(pid) if p.pid != other_than]
        if found:
            [child] = found
            return child
        time.sleep(0.1)
    raise AssertionError(f"no llama-server child of {pid} came within {timeout} s")


def gone(process: psutil.Process) -> bool:
    """Whether the process ends, reaped or a zombie (a 60 s guard against a hang, not a timing)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def chat_batch_completes(server: Server, question: str) -> str:
    record = {"custom_id": "q", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "max_tokens": 12, "temperature": 0,
                       "messages": [{"role": "user", "content": question}]}}
    done = server.wait(create(server, [record])["id"], timeout=240)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 1, server.log()[-3000:]
    out, _ = results(server, done)
    return out["q"]["response"]["body"]["choices"][0]["message"]["content"]


def test_the_servers_llama_server_is_restarted_after_kill_9_and_killed_with_its_parent(make_server):
    server = make_server(catalog="builtin")
    first = the_llama_child(server.proc.pid)
    assert "--metrics" in first.cmdline()
    assert "paris" in chat_batch_completes(server, "What is the capital of France? One word.").lower()

    first.kill()  # kill -9
    assert gone(first)
    second = the_llama_child(server.proc.pid, other_than=first.pid)
    assert "paris" in chat_batch_completes(server, "What is the capital of France? One word.").lower()
    port = second.cmdline()[second.cmdline().index("--port") + 1]
    metrics = http_client.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert metrics.status_code == 200 and "llamacpp:prompt_tokens_total" in metrics.text  # the sharing's source

    server.kill()  # kill -9 of `orl serve`: nothing of its own runs to stop the child; the kernel does
    assert gone(second)


def test_a_stopped_worker_stops_its_llama_server_and_a_killed_one_leaves_none(tmp_path: Path):
    command = ["worker", "--data-dir", str(tmp_path / "data")]
    stopped = start_orl(command, stdout=tmp_path / "worker.log", env=dict(os.environ))
    child = the_llama_child(stopped.pid)
    stopped.terminate()  # SIGTERM: the worker drains, then stops its server
    assert stopped.wait(60) == 0, (tmp_path / "worker.log").read_text()
    assert gone(child)

    killed = start_orl(command, stdout=tmp_path / "killed.log", env=dict(os.environ))
    child = the_llama_child(killed.pid)
    killed.kill()
    killed.wait(10)
    assert gone(child)


def test_a_process_without_llama_server_refuses_to_start(tmp_path: Path):
    env = {**os.environ, "OPENRELAY_LLAMA_SERVER": str(tmp_path / "no-such-llama-server")}
    done = run_orl(["worker", "--data-dir", str(tmp_path / "data")], env=env, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "openrelay/smollm2-135m runs on llama-server" in done.stderr and "no-such-llama-server" in done.stderr
