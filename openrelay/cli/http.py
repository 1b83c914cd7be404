"""The HTTP side of the user-facing `orl` commands.

Every command body gets an ``ApiClient`` through ``run``, the one place where failures become output: the
OpenAI error envelope as JSON on stdout (for scripts), one ``error: ...`` line on stderr (for people, saying what
to do next where the CLI can tell) and the exit code of docs/api-contract.md §9.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import orjson
import typer

from ..config import DEFAULT_DATA_DIR, ClientSettings
from ..errors import error_envelope

__all__ = [
    "ApiClient",
    "ApiError",
    "BadResponse",
    "Refused",
    "exit_code",
    "print_json",
    "run",
    "say",
]

# Creates validate up to 50,000 records and uploads/downloads can be large, so reads and writes get minutes;
# a server that is not there should still fail fast.
_TIMEOUT = httpx.Timeout(300.0, connect=10.0)


class ApiError(Exception):
    """A non-2xx answer; ``body`` is always an OpenAI error envelope (made up when the server sent none).
    ``advice``, when the CLI knows better than the answer what went wrong, is what a person is told instead."""

    def __init__(self, status: int, body: dict[str, Any], advice: str | None = None) -> None:
        self.status = status
        self.body = body
        self.advice = advice
        super().__init__(f"HTTP {status}: {self.message}")

    def advised(self, advice: str) -> ApiError:
        """The same answer, with ``advice`` for the person reading it."""
        return ApiError(self.status, self.body, advice)

    @property
    def error(self) -> dict[str, Any]:
        err = self.body.get("error")
        return err if isinstance(err, dict) else {}

    @property
    def code(self) -> str | None:
        code = self.error.get("code")
        return code if isinstance(code, str) else None

    @property
    def message(self) -> str:
        return str(self.error.get("message") or f"HTTP {self.status}")


class BadResponse(Exception):
    """A 2xx answer whose body is not the JSON we expect: a server or proxy bug, so exit 1."""


class Refused(Exception):
    """A command the CLI refuses itself, before sending what the server would refuse (an endpoint no model
    serves, records naming several endpoints): exit 2, as for the server's 400."""

    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.envelope = error_envelope(message, code=code, param=param)


def exit_code(status: int, code: str | None = None) -> int:
    """The `orl` exit code for an HTTP answer (docs/api-contract.md §9); ``status`` 0 means no answer at all."""
    if 200 <= status < 300:
        return 0
    if status in (401, 403):
        return 3
    if status == 404:
        return 4
    if status == 402:
        return 5
    if status == 409:
        return 6 if code == "feature_disabled" else 7
    if 400 <= status < 500:
        return 2
    # 5xx, unexpected 1xx/3xx (redirects are not followed) and network failures.
    return 1


def _error_from(resp: httpx.Response) -> ApiError:
    """Keep the server's envelope as is; wrap anything else (a proxy's HTML, FastAPI's ``detail``) in one."""
    try:
        body = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return ApiError(resp.status_code, body)
    text = resp.text.strip()[:500] or resp.reason_phrase or f"HTTP {resp.status_code}"
    return ApiError(resp.status_code, error_envelope(text, type_="http_error"))


class ApiClient:
    """A thin httpx.Client over the OpenRelay `/v1` API; paths are relative to the base URL (``batches``)."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None) -> None:
        told = ClientSettings.from_env()
        self.base_url = (base_url or told.base_url).rstrip("/")
        key = api_key if api_key is not None else told.api_key
        self.has_key = bool(key)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        # A trailing slash makes httpx append relative paths under /v1 instead of replacing its last segment.
        self.http = httpx.Client(base_url=self.base_url + "/", headers=headers, timeout=_TIMEOUT)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send one request and return its decoded JSON; raise ApiError on a non-2xx answer."""
        resp = self.http.request(method, path.lstrip("/"), **kwargs)
        if not resp.is_success:
            raise self._refusal(resp)
        try:
            return orjson.loads(resp.content)
        except orjson.JSONDecodeError as exc:
            raise BadResponse(f"{method} {path} answered {resp.status_code}, not JSON: {exc}") from exc

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.request("GET", path, params={k: v for k, v in (params or {}).items() if v is not None})

    def post(self, path: str, body: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        # orjson bytes are sent as they are, so an idempotent retry can reproduce the exact same body.
        content = orjson.dumps(body if body is not None else {})
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        return self.request("POST", path, content=content, headers=all_headers)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def upload(self, path: Path, purpose: str) -> dict[str, Any]:
        """POST /files; httpx reads the open file in 64 KiB chunks, so the file is never held in memory."""
        with path.open("rb") as fh:
            files = {"file": (path.name, fh, "application/jsonl")}
            return self.request("POST", "files", files=files, data={"purpose": purpose})

    def download(self, path: str, sink: BinaryIO) -> None:
        """Stream a GET answer's body into ``sink`` chunk by chunk."""
        with self.http.stream("GET", path.lstrip("/")) as resp:
            if not resp.is_success:
                resp.read()
                raise self._refusal(resp)
            for chunk in resp.iter_bytes():
                sink.write(chunk)
        sink.flush()

    def download_from(self, path: str, offset: int, sink: BinaryIO) -> int:
        """Stream the bytes of a GET answer from ``offset`` on (``Range: bytes=N-``) into ``sink``; returns how
        many were written. Nothing past the end (416) and no such file (404) are 0."""
        headers = {"Range": f"bytes={offset}-"}
        with self.http.stream("GET", path.lstrip("/"), headers=headers) as resp:
            if resp.status_code in (404, 416):
                resp.read()
                return 0
            if not resp.is_success:
                resp.read()
                raise self._refusal(resp)
            skip = offset if resp.status_code == 200 else 0  # a server that ignores Range sends it all
            written = 0
            for chunk in resp.iter_bytes():
                if skip:
                    chunk, skip = chunk[skip:], max(0, skip - len(chunk))
                sink.write(chunk)
                written += len(chunk)
        sink.flush()
        return written

    def _refusal(self, resp: httpx.Response) -> ApiError:
        """The answer's error; when the base URL lacks the API's /v1 and the answer is what a path outside the API
        gets (no such route, another method's, the dashboard's redirect to its login), advice saying so."""
        error = _error_from(resp)
        if self.base_url.endswith("/v1") or not (resp.status_code in (404, 405) or resp.is_redirect):
            return error
        return error.advised(f"OPENRELAY_BASE_URL is {self.base_url}, which does not end in /v1: the API is under "
                             f"/v1, so set OPENRELAY_BASE_URL={self.base_url}/v1 ({resp.request.method} "
                             f"{resp.request.url} answered {resp.status_code})")

    def download_to(self, path: str, target: str) -> None:
        """Download to a file, or to stdout when ``target`` is ``-``."""
        if target == "-":
            sys.stdout.flush()
            self.download(path, sys.stdout.buffer)
            return
        dest = Path(target)
        # Write beside the target and rename at the end, so a failed download never leaves a truncated file.
        part = dest.with_name(dest.name + ".part")
        try:
            with part.open("wb") as fh:
                self.download(path, fh)
            part.replace(dest)
        finally:
            part.unlink(missing_ok=True)


def print_json(obj: Any) -> None:
    """Machine-readable output: pretty JSON on stdout."""
    sys.stdout.flush()
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.buffer.flush()


def say(text: str) -> None:
    """Human-readable output goes to stderr, so stdout stays pure JSON."""
    print(text, file=sys.stderr, flush=True)


def _fail(envelope: dict[str, Any], message: str, code: int) -> typer.Exit:
    print_json(envelope)
    say(f"error: {message}")
    return typer.Exit(code)


def _no_key_message() -> str:
    """What a person without a key is told: the variable, and where `orl serve` wrote the key it made."""
    written = DEFAULT_DATA_DIR / "api-key"
    here = f" (there is one here: {written})" if written.is_file() else ""
    return ("no API key: set OPENRELAY_API_KEY. `orl serve` writes the key it makes on its first start to "
            f"<data-dir>/api-key (default data dir: {DEFAULT_DATA_DIR}, in the directory it runs in){here}: "
            f"export OPENRELAY_API_KEY=$(cat {written})")


def run(body: Callable[[ApiClient], object]) -> None:
    """Run a command body against the API and turn every failure into envelope + message + exit code."""
    client = ApiClient()
    try:
        with client:
            if not client.has_key:  # every /v1 route needs one, and the server's 401 cannot say where it is
                message = _no_key_message()
                raise _fail(error_envelope(message, code="invalid_api_key"), message, 3)
            body(client)
    except ApiError as exc:
        raise _fail(exc.body, exc.advice or exc.message, exit_code(exc.status, exc.code)) from None
    except Refused as exc:
        raise _fail(exc.envelope, exc.message, 2) from None
    except httpx.HTTPError as exc:
        message = f"cannot talk to {client.base_url}: {exc or type(exc).__name__}"
        raise _fail(error_envelope(message, type_="connection_error"), message, 1) from None
    except BadResponse as exc:
        raise _fail(error_envelope(str(exc), type_="invalid_response"), str(exc), 1) from None
    except OSError as exc:
        # A local file that cannot be read or written; not the server's doing, but still "unexpected".
        raise _fail(error_envelope(str(exc), type_="local_error"), str(exc), 1) from None
