"""The OpenAI list envelope shared by every list endpoint."""

from __future__ import annotations

from typing import Any

__all__ = ["list_page"]


def list_page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}
