"""`orl models`: the catalog of models offered for batch (GET /v1/models)."""

from __future__ import annotations

from openrelay.cli.http import print_json, run

__all__ = ["models"]


def models() -> None:
    """List the models offered for batch, with their endpoints."""
    run(lambda client: print_json(client.get("models")))
