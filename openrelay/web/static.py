"""The dashboard's static files, served from the package (no CDN: it works offline), each under a URL that
carries its content hash, so browsers may keep it for a year and still never run a stale copy.

Vendored: ``htmx.min.js`` is htmx.org 2.0.11 from the npm registry (package ``htmx.org``, ``dist/htmx.min.js``),
sha256 d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717; ``static/VENDORED.txt`` says the same
and ``tests/unit/test_dashboard_static.py`` checks the file against it.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from .views import STATIC_DIR

__all__ = ["static_url", "serve_static", "STATIC_FILES"]

CACHE_FOREVER = "public, max-age=31536000, immutable"


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    media_type: str
    digest: str


def _load() -> dict[str, StaticFile]:
    found = {}
    for path in sorted(STATIC_DIR.iterdir()):
        if path.suffix not in (".js", ".css", ".svg", ".png"):
            continue
        body = path.read_bytes()
        media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if media.startswith("text/") or media.endswith("javascript"):
            media += "; charset=utf-8"
        found[path.name] = StaticFile(body=body, media_type=media, digest=hashlib.sha256(body).hexdigest())
    return found


STATIC_FILES = _load()


def static_url(name: str) -> str:
    return f"/static/{name}?v={STATIC_FILES[name].digest[:16]}"


async def serve_static(request: Request) -> Response:
    found = STATIC_FILES.get(request.path_params["name"])
    if found is None:
        return Response("not found", status_code=404, media_type="text/plain")
    etag = f'"{found.digest[:32]}"'
    headers = {"cache-control": CACHE_FOREVER, "etag": etag, "x-content-type-options": "nosniff"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(found.body, media_type=found.media_type, headers=headers)
