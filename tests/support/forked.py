"""`orl` processes for tests, forked from a process that has imported OpenRelay once.

Importing OpenRelay costs a new `orl` process most of its start-up (about 1.5 s of CPU for `orl serve`, 0.8 s for
an `orl admin` command), and the suite starts several hundred. So each test process keeps one multiprocessing
forkserver that imports them once (``PRELOAD``) and forks a child per `orl` run. The child is a process of its own
running `orl`'s entry point, ``openrelay.cli.main.main``, with the run's arguments, environment, working directory
and standard streams, and exits with its exit status; the test sees its pid, signals and exit status as a
``subprocess.Popen``'s. OpenRelay reads its environment when it runs, never when it is imported, so a child
started by fork sees what one started by exec does.

Forking is for the suite: under pytest (whose main module a child need not import again) every `orl` these
helpers start is forked unless ``OPENRELAY_TEST_FORK=0``; elsewhere (the benchmarks) it is started by exec unless
``OPENRELAY_TEST_FORK=1``. The tests that spawn `orl` themselves always exec it, the console script included.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

__all__ = ["ORL", "start_orl", "run_orl"]

ORL = str(Path(sys.executable).parent / "orl")
FORK = os.environ.get("OPENRELAY_TEST_FORK", "1" if "pytest" in sys.modules else "0") != "0"
# What `orl serve`, `orl worker` and `orl admin` import, and the MCP SDK that tool-calling records load.
PRELOAD = ["openrelay.server", "openrelay.cli.main", "openrelay.worker.tools"]

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def _orl_main(args: list[str], env: dict[str, str], cwd: str, stdin: str, stdout: str, stderr: str | None) -> None:
    """The forked child: become `orl ARGS` run in ``cwd`` with ``env`` and the given streams, and exit as it
    does (the interpreter's exit steps included: flushed streams and atexit handlers)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path, flags in ((0, stdin, os.O_RDONLY), (1, stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
                            (2, stderr or stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin, as an interpreter opens it
    sys.argv = [ORL, *args]
    code = 0
    try:
        from openrelay.cli.main import main

        main()
    except SystemExit as exc:
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(code)


class ForkedOrl:
    """A forked `orl` seen as a ``subprocess.Popen``: ``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``,
    ``kill`` and ``returncode``."""

    def __init__(self, args: list[str], process: Any) -> None:
        self.args = [ORL, *args]
        self._process = process
        self.pid: int = process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self._process.terminate()

    def kill(self) -> None:
        self._process.kill()


def start_orl(args: list[str], *, env: dict[str, str], stdout: Path, stderr: Path | None = None,
              stdin: Path | None = None, cwd: Path | None = None, fork: bool = FORK
              ) -> ForkedOrl | subprocess.Popen[bytes]:
    """`orl ARGS` with exactly ``env`` as its environment, its output appended to ``stdout`` (and ``stderr``, or
    the same file), its input read from ``stdin`` (or /dev/null), running until it exits or is stopped."""
    where = str(cwd) if cwd is not None else os.getcwd()
    if not fork:
        with open(stdout, "ab") as out, open(stdin or os.devnull, "rb") as into, \
                open(stderr or os.devnull, "ab") as err:  # the child keeps its own descriptors
            return subprocess.Popen([ORL, *args], stdin=into, stdout=out,
                                    stderr=subprocess.STDOUT if stderr is None else err, env=env, cwd=where)
    process = _context.Process(target=_orl_main, daemon=True,
                               args=(list(args), dict(env), where, str(stdin or os.devnull), str(stdout),
                                     None if stderr is None else str(stderr)))
    process.start()
    return ForkedOrl(list(args), process)


def run_orl(args: list[str], *, env: dict[str, str], timeout: float, cwd: Path | None = None,
            input: str | None = None, fork: bool = FORK) -> subprocess.CompletedProcess[str]:
    """`orl ARGS` run to its end, as ``subprocess.run(..., capture_output=True, text=True)`` returns it; a run
    past ``timeout`` is killed and raises ``subprocess.TimeoutExpired``."""
    with tempfile.TemporaryDirectory(prefix="orl-run-") as scratch:
        streams = Path(scratch)
        for name in ("stdout", "stderr"):
            (streams / name).touch()
        stdin = None
        if input is not None:
            stdin = streams / "stdin"
            stdin.write_text(input)
        proc = start_orl(args, env=env, stdout=streams / "stdout", stderr=streams / "stderr", stdin=stdin, cwd=cwd,
                         fork=fork)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
        return subprocess.CompletedProcess([ORL, *args], code, (streams / "stdout").read_text(),
                                           (streams / "stderr").read_text())
