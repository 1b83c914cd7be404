"""The "a request of this process wrote an organization's batches" hook, handed to the API and the dashboard by
whoever assembles them (``server.py``); neither looks for the other's."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["OrgWrites"]


class OrgWrites:
    """What keeps answers of an organization (the API's poll cache, ``api/poll_cache.py``) listens and forgets
    them when told, so the caller's next poll here sees its own write. Each request that writes calls ``wrote``
    when it returns or fails."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[str], None]] = []

    def listen(self, forget: Callable[[str], None]) -> None:
        """Call ``forget(org_id)`` after each write of ``org_id``'s batches."""
        self._listeners.append(forget)

    def wrote(self, org_id: str) -> None:
        for forget in self._listeners:
            forget(org_id)
