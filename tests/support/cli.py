"""What an `orl` run's outcome must look like (docs/api-contract.md §9): JSON on stdout, people's text on stderr."""

from __future__ import annotations

import json
import subprocess
from typing import Any

__all__ = ["ok", "refused", "words"]


def ok(done: subprocess.CompletedProcess[str]) -> Any:
    """Exit 0 and stdout parses as JSON; returns the JSON."""
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return json.loads(done.stdout)


def refused(done: subprocess.CompletedProcess[str], exit_code: int, code: str | None) -> dict[str, Any]:
    """The given exit code, the error envelope on stdout, an ``error:`` line on stderr; returns the error object."""
    assert done.returncode == exit_code, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    envelope = json.loads(done.stdout)
    assert envelope["error"]["code"] == code, envelope
    assert "error: " in done.stderr
    return envelope["error"]


def words(text: str) -> str:
    """``text`` as one line of words, as a person reads it whatever the terminal's width wrapped (help's box
    borders too)."""
    return " ".join(text.replace("│", " ").split())
