"""Who is calling, and may they? 401 for no or an unknown key, 403 for a missing scope."""

from __future__ import annotations

from ..errors import BudgetExceeded, InsufficientScope, Unauthorized
from ..runtime import Runtime
from ..types import ApiKey

__all__ = ["authenticate", "require", "require_budget"]


def authenticate(rt: Runtime, authorization: str | None) -> ApiKey:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
    key = rt.accounts.authenticate(authorization[7:].strip())
    if key is None:
        raise Unauthorized("Incorrect API key provided.")
    return key


def require(key: ApiKey, *scopes: str) -> None:
    missing = [s for s in scopes if s not in key.scopes]
    if missing:
        raise InsufficientScope(f"this key lacks the scope {', '.join(missing)}")


def require_budget(key: ApiKey) -> None:
    """Only "used up" is checked: one batch may pass what is left of a budget."""
    if key.budget_nano_usd is not None and key.spent_nano_usd >= key.budget_nano_usd:
        raise BudgetExceeded("this key's spend budget is used up")
