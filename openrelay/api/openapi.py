"""The OpenAPI 3.1 document of the HTTP surface, kept by hand in ``openapi.json`` beside this module.

It is served byte for byte at ``GET /openapi.json``; ``tests/test_openapi.py`` holds it and the app's routes to
each other, and runs schemathesis against a live server with it.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["DOCUMENT_NAME", "document_bytes"]

DOCUMENT_NAME = "openapi.json"


def document_bytes() -> bytes:
    return resources.files(__package__).joinpath(DOCUMENT_NAME).read_bytes()
