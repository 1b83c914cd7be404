"""`orl worker` processes for tests: started beside an `orl serve` on its store, or on any store and catalog."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.forked import start_orl
from tests.support.polling import wait_for
from tests.support.server import Server


class WorkerProcess:
    """One `orl worker`; it has started once its log says it serves ``test/echo`` (its claim loop is running)."""

    def __init__(self, *, data_dir: Path, database_url: str, catalog: Path, log_path: Path, env: dict[str, str],
                 args: tuple[str, ...] = (), cwd: Path | None = None, serving: str = "test/echo") -> None:
        self.log_path = log_path
        self.proc = start_orl(["worker", "--data-dir", str(data_dir), "--database-url", database_url, "--catalog",
                               str(catalog), *args], stdout=log_path, env={**os.environ, **env}, cwd=cwd)
        wait_for(lambda: f"serving {serving}" in self.log() or self.proc.poll() is not None,
                 f"{log_path.stem} to start", timeout=60, every=0.05)
        assert self.proc.poll() is None, f"the worker exited {self.proc.returncode}:\n{self.log()}"

    @classmethod
    def beside(cls, server: Server, name: str = "worker", args: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> WorkerProcess:
        """A worker on ``server``'s store, blobs and catalog, with its environment (tick, lease, retries) and
        ``env`` over it."""
        return cls(data_dir=server.data_dir, database_url=server.database_url, catalog=server.data_dir / "catalog.toml",
                   log_path=server.data_dir / f"{name}.log", env={**server.env, **(env or {})}, args=args)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def took(self, batch_id: str) -> bool:
        return f"took batch {batch_id}" in self.log()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no drain, its leases are left to lapse."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a drain), then kill -9 if it does not end within ``timeout``; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)

