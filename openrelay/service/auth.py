"""Who is calling, and may they? 401 for no or an unknown key, 403 for a missing scope, 402 for a used-up budget.
Reads may use a key as the store showed it up to ``key_cache_seconds`` ago (``KeyCache.cached``: one round trip a
poll, and a revoke felt within that time, docs/api-contract.md §2); every write reads the key fresh."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import BudgetExceeded, InsufficientScope, Unauthorized
from ..store.accounts import Accounts, hash_key
from ..types import ApiKey

__all__ = ["KeyCache", "MAX_KEY_CACHE_SECONDS", "bearer_token", "authenticate", "authenticate_secret",
           "require", "require_budget"]

MAX_KEY_CACHE_SECONDS = 2.0  # docs/api-contract.md §2: a revoked key stops working within two seconds
_MAX_CACHED_KEYS = 10_000


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme in any case, the token stripped), or
    None for no header or another scheme. The one reading of the header, for API keys and the metrics token."""
    if not authorization or not authorization.lower().startswith("bearer "):
        return None
    return authorization[7:].strip()


def _secret(authorization: str | None) -> str:
    secret = bearer_token(authorization)
    if secret is None:
        raise Unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
    return secret


def authenticate(accounts: Accounts, authorization: str | None) -> ApiKey:
    """The caller's key as the store holds it now."""
    return _live_key(accounts, _secret(authorization))


def authenticate_secret(accounts: Accounts, secret: str) -> ApiKey:
    """The key of a secret given without a header (the dashboard's sign-in form), as the store holds it now."""
    return _live_key(accounts, secret.strip())


def _live_key(accounts: Accounts, secret: str) -> ApiKey:
    key = accounts.authenticate(secret)
    if key is None:
        raise Unauthorized("Incorrect API key provided.")
    return key


class KeyCache:
    """Authentication with a brief in-process memory of live keys, by the SHA-256 of their secret.

    An entry expires ``ttl`` seconds after the store read that filled it *began*, so it never shows a key as it
    was more than ``ttl`` before now. Unknown and revoked keys are not remembered: they are asked for again.
    """

    def __init__(self, accounts: Accounts, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= ttl <= MAX_KEY_CACHE_SECONDS:
            raise ValueError(f"the key cache TTL must be 0 to {MAX_KEY_CACHE_SECONDS:g} s, not {ttl:g}")
        self._accounts = accounts
        self._ttl = ttl
        self._clock = clock
        self._live: dict[str, tuple[float, ApiKey]] = {}

    def cached(self, authorization: str | None) -> ApiKey | None:
        """The key if the store showed it live less than ``ttl`` ago, else None (then ask ``for_read``). No I/O,
        so the event loop may call it."""
        secret = bearer_token(authorization) if self._live else None
        return None if secret is None else self._remembered(hash_key(secret))

    def for_read(self, authorization: str | None) -> ApiKey:
        """The key for a request that only reads: from memory when recent enough, else from the store."""
        secret = _secret(authorization)
        digest = hash_key(secret)
        key = self._remembered(digest)
        if key is not None:
            return key
        started = self._clock()
        key = _live_key(self._accounts, secret)
        if self._ttl > 0:
            if len(self._live) >= _MAX_CACHED_KEYS:
                self._forget_expired()
            self._live[digest] = (started + self._ttl, key)
        return key

    def authenticate(self, authorization: str | None) -> ApiKey:
        """The key for a request that writes: always as the store holds it now."""
        return _live_key(self._accounts, _secret(authorization))

    def _remembered(self, digest: str) -> ApiKey | None:
        entry = self._live.get(digest)
        if entry is None:
            return None
        if self._clock() >= entry[0]:
            self._live.pop(digest, None)
            return None
        return entry[1]

    def _forget_expired(self) -> None:
        now = self._clock()
        self._live = {d: e for d, e in self._live.items() if e[0] > now}
        if len(self._live) >= _MAX_CACHED_KEYS:
            self._live.clear()


def require(key: ApiKey, *scopes: str) -> None:
    missing = [s for s in scopes if s not in key.scopes]
    if missing:
        raise InsufficientScope(f"this key lacks the scope {', '.join(missing)}")


def require_budget(key: ApiKey) -> None:
    """Only "used up" is checked: one batch may pass what is left of a budget. A hard budget's reservation comes
    later in the create, once its maximum cost is known (``store/budgets.py``)."""
    if key.budget_nano_usd is not None and key.spent_nano_usd >= key.budget_nano_usd:
        raise BudgetExceeded("this key's spend budget is used up")
