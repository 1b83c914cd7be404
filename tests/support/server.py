"""Start real `orl serve` processes for tests, on SQLite or on a fresh PostgreSQL database each."""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.support import http_client
from tests.support.forked import ForkedOrl, run_orl, start_orl
from tests.support.polling import until_terminal

REPO = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = os.environ.get("OPENRELAY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

TEST_CATALOG = """
[pricing]
standard = 0.5
expedited = 0.75

[[models]]
name = "test/echo"
endpoints = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
slots = {slots}
concurrency = {concurrency}
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
engine = {{ kind = "openai", base_url = "{engine}", served_model = "echo-served", timeout_seconds = 30 }}

[[models]]
name = "test/embed"
endpoints = ["/v1/embeddings"]
slots = 1
concurrency = 4
input_usd_per_mtok = 0.02
output_usd_per_mtok = 0
engine = {{ kind = "openai", base_url = "{engine}" }}

[tools]
allow = ["http://127.0.0.1:9/mcp"]
"""

ECHO_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
TOOL_ALLOWED = "http://127.0.0.1:9/mcp"  # the test catalog's one allowed tool server (nothing listens there)


def catalog_text(engine: str, *, slots: int | str = 2, concurrency: int | str = 8, echo: str = "",
                 endpoints: tuple[str, ...] = ECHO_ENDPOINTS, engine_urls: list[str] | None = None,
                 timeout_seconds: float = 30, tools: tuple[str, ...] = (TOOL_ALLOWED,), tool_limits: str = "",
                 extra: str = "") -> str:
    """The test catalog (TEST_CATALOG) with the edits tests make to it: ``echo`` lines added to test/echo's table,
    its ``endpoints``, its engine at several ``engine_urls`` (replicas) or with another ``timeout_seconds``, the
    ``tools`` allow-list and ``tool_limits`` lines under it, and ``extra`` tables at the end."""
    text = TEST_CATALOG.format(engine=engine, slots=slots, concurrency=concurrency)

    def edit(old: str, new: str) -> None:
        nonlocal text
        assert text.count(old) == 1, old
        text = text.replace(old, new)

    if echo:
        edit('name = "test/echo"\n', f'name = "test/echo"\n{echo.rstrip()}\n')
    if endpoints != ECHO_ENDPOINTS:
        edit(f"endpoints = {_toml_list(ECHO_ENDPOINTS)}", f"endpoints = {_toml_list(endpoints)}")
    if engine_urls is not None:
        edit(f'base_url = "{engine}", served_model', f"base_urls = {_toml_list(engine_urls)}, served_model")
    if timeout_seconds != 30:
        edit("timeout_seconds = 30", f"timeout_seconds = {timeout_seconds}")
    edit(f"allow = {_toml_list((TOOL_ALLOWED,))}\n", f"allow = {_toml_list(tools)}\n{tool_limits}")
    return text + extra


def _toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


# Each store's pass of the suite takes its servers' ports from a range of its own, below Linux's ephemeral range
# (32768 and up, where bind(0) and outgoing connections take theirs), and each pytest-xdist worker of a pass a
# slice of it: scripts/test.sh runs the passes side by side, each in several processes, and a port one process found
# free must not be handed to another before its server binds it.
_PORT_RANGES = {"sqlite": range(20_000, 26_000), "postgres": range(26_000, 32_000)}
_given: set[int] = set()  # never hand out a port twice in one process: its server may not have bound it yet


def _my_ports() -> range:
    ports = _PORT_RANGES.get(os.environ.get("OPENRELAY_TEST_DB", "sqlite"), _PORT_RANGES["sqlite"])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest -n
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count <= 1:
        return ports
    size = len(ports) // count
    start = ports.start + int(worker[2:]) * size
    return range(start, start + size)


def free_port() -> int:
    ports = _my_ports()
    for _ in range(1000):
        port = random.choice(ports)
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {ports}")


def create_pg_database() -> str:
    import psycopg

    name = f"orl_test_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def drop_pg_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Server:
    """One running `orl serve`, with helpers to reach it the ways users do."""

    data_dir: Path
    database_url: str
    port: int
    env: dict[str, str]
    args: list[str]
    proc: ForkedOrl | subprocess.Popen[bytes] | None = None
    api_key: str = ""
    org: str = "default"  # the organization api_key belongs to (`orl serve` makes "default" on first start)
    log_path: Path = field(init=False)
    accounts: Any = field(default=None, repr=False)  # the store's accounts, opened in this process on first use
    keys_made: list[str] = field(default_factory=list, repr=False)  # every-scope keys of new organizations

    def __post_init__(self) -> None:
        self.log_path = self.data_dir / "serve.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 60.0) -> Server:
        cmd = ["serve", "--port", str(self.port), "--data-dir", str(self.data_dir),
               "--database-url", self.database_url, *self.args]
        self.proc = start_orl(cmd, stdout=self.log_path, env={**os.environ, **self.env})
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"orl serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                if http_client.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError(f"orl serve did not come up:\n{self.log()}")
        key_file = self.data_dir / "api-key"
        if key_file.exists() and not self.api_key:
            self.api_key = key_file.read_text().strip()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        self.close_store()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        """kill -9: no clean shutdown, leases left behind."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    # -- clients -------------------------------------------------------------------------------------------

    def client(self, api_key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=api_key or self.api_key, max_retries=0, timeout=60,
                             http_client=openai.DefaultHttpxClient(verify=http_client.ssl_context()))

    def http(self, method: str, path: str, api_key: str | None = None, **kwargs: Any) -> httpx.Response:
        headers = kwargs.pop("headers", {})
        if api_key != "":
            headers.setdefault("authorization", f"Bearer {api_key or self.api_key}")
        return http_client.request(method, self.base_url + path, headers=headers, timeout=120, **kwargs)

    def orl(self, *args: str, api_key: str | None = None, cwd: Path | None = None,
            input: bytes | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "OPENRELAY_BASE_URL": self.base_url, "OPENRELAY_API_KEY": api_key or self.api_key}
        return run_orl(list(args), env=env, timeout=300, cwd=cwd, input=input.decode() if input else None)

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_orl(["admin", "--database-url", self.database_url, *args], env=dict(os.environ), timeout=120)

    def new_org_key(self, name: str | None = None, *extra: str) -> str:
        """A fresh organization and a key of it (every scope unless ``extra`` says otherwise).

        ``extra`` takes `orl admin key create`'s ``--scopes`` and ``--budget-usd``. Made straight on the store
        in this process, as `orl admin` does (tests/test_admin.py covers the command itself): spawning it twice
        cost more than starting a server."""
        name = name or f"org-{secrets.token_hex(4)}"
        options = dict(zip(extra[::2], extra[1::2], strict=True))
        assert set(options) <= {"--scopes", "--budget-usd"}, extra
        accounts = self.store_accounts()
        org = accounts.create_org(name)
        scopes = options.get("--scopes")
        budget = options.get("--budget-usd")
        _key, secret = accounts.create_key(
            org.id, **({} if scopes is None else {"scopes": tuple(s for s in scopes.split(",") if s)}),
            budget_nano_usd=None if budget is None else int(Decimal(budget) * 10**9))
        if scopes is None:
            self.keys_made.append(secret)
        return secret

    def store_accounts(self) -> Any:
        if self.accounts is None:
            from openrelay.runtime import open_store  # SQLAlchemy: only for the tests that make accounts

            self.accounts = open_store(self.database_url)
        return self.accounts[1]

    def close_store(self) -> None:
        if self.accounts is not None:
            self.accounts[0].dispose()
            self.accounts = None

    def for_new_org(self) -> Server:
        """This same running server, seen by a fresh organization: its ``api_key`` and ``org`` are new."""
        org = f"org-{secrets.token_hex(6)}"
        self.store_accounts()  # opened once, here, and shared with the view; closed when this server stops
        view = replace(self, org=org, keys_made=[])
        view.api_key = view.new_org_key(org)
        return view

    def wait(self, batch_id: str, timeout: float = 120.0, api_key: str | None = None) -> dict[str, Any]:
        """Poll until the batch has ended; returns it."""
        try:
            return until_terminal(lambda: self.http("GET", f"/batches/{batch_id}", api_key=api_key).json(),
                                  f"batch {batch_id}", timeout=timeout, every=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log()[-3000:]}") from None
