"""The suite's forked `orl` (tests/support/forked.py) behaves as the `orl` started by exec: the same output, exit
status, environment, working directory and input, and a signal's death reported the same way."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support import http_client
from tests.support.forked import ORL, run_orl, start_orl
from tests.support.polling import wait_for
from tests.support.server import catalog_text, free_port

UNREACHABLE = "http://127.0.0.1:9/v1"


def _healthy(port: int) -> bool:
    try:
        return http_client.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _exec(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ORL, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [["--help"], ["batches", "list"], ["batches", "get", "batch_nope"],
                                  ["admin", "org", "list", "--database-url", "nope://x"]])
def test_a_forked_orl_answers_exactly_as_the_exec_one(args):
    env = {**os.environ, "OPENRELAY_BASE_URL": UNREACHABLE, "OPENRELAY_API_KEY": "sk-test"}
    forked, execed = run_orl(args, env=env, timeout=60, fork=True), _exec(args, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (execed.returncode, execed.stdout, execed.stderr)


def test_each_forked_orl_sees_its_own_environment_and_working_directory(tmp_path):
    # The base URL comes from the environment: each run reports the one it was given, not the forkserver's.
    for port in (free_port(), free_port()):
        done = run_orl(["batches", "list"], env={**os.environ, "OPENRELAY_BASE_URL": f"http://127.0.0.1:{port}/v1",
                                                 "OPENRELAY_API_KEY": "sk-test"}, timeout=60, fork=True)
        assert done.returncode == 1 and f"127.0.0.1:{port}" in done.stdout + done.stderr
    # A relative input path is read from the run's working directory.
    (tmp_path / "in.jsonl").write_text("")
    env = {**os.environ, "OPENRELAY_BASE_URL": UNREACHABLE, "OPENRELAY_API_KEY": "sk-test"}
    args = ["files", "upload", "in.jsonl"]
    forked, execed = run_orl(args, env=env, timeout=60, cwd=tmp_path, fork=True), _exec(args, env, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (execed.returncode, execed.stdout, execed.stderr)
    assert "No such file" not in forked.stdout + forked.stderr


def test_a_forked_server_dies_of_kill_9_and_stops_on_sigint_as_an_exec_one_does(tmp_path):
    for sig, expected in ((signal.SIGKILL, -signal.SIGKILL), (signal.SIGINT, 0)):
        port = free_port()
        data = tmp_path / f"data-{sig}"
        catalog = tmp_path / "catalog.toml"
        catalog.write_text(catalog_text(UNREACHABLE))
        proc = start_orl(["serve", "--port", str(port), "--data-dir", str(data), "--catalog", str(catalog)],
                         env=dict(os.environ), stdout=tmp_path / f"serve-{sig}.log", fork=True)
        wait_for(lambda port=port, proc=proc: _healthy(port) or proc.poll() is not None, "orl serve to answer")
        assert proc.poll() is None, (tmp_path / f"serve-{sig}.log").read_text()
        proc.send_signal(sig)
        assert proc.wait(30) == expected
