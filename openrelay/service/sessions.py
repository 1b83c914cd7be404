"""Dashboard sign-in: a pasted API key opens a session that acts as that key until it ends or the key is revoked.

The session adds no rule of its own: the key it names is read fresh from the store on every page, so its
organization and scopes, and a revoke, rule the dashboard exactly as they rule the API.
"""

from __future__ import annotations

from ..errors import Unauthorized
from ..store.accounts import Accounts
from ..store.sessions import Sessions
from ..types import ApiKey
from .auth import authenticate_secret

__all__ = ["SESSION_SECONDS", "sign_in", "session_key", "sign_out"]

SESSION_SECONDS = 12 * 3600  # a sign-in lasts a working day; signing out ends it at once


def sign_in(accounts: Accounts, sessions: Sessions, api_key: str) -> tuple[str, ApiKey]:
    """A new session id (for the cookie, never stored) and the key it acts as; 401 for an unknown key."""
    key = authenticate_secret(accounts, api_key)
    return sessions.open(key_id=key.id, org_id=key.org_id, lifetime_seconds=SESSION_SECONDS), key


def session_key(accounts: Accounts, sessions: Sessions, session_id: str | None) -> ApiKey:
    """The key a live session acts as, as the store holds it now; 401 when the session or its key has ended."""
    key_id = sessions.key_id(session_id or "")
    if key_id is None:
        raise Unauthorized("Your session has ended. Sign in again.")
    key = accounts.key(key_id)
    if key.revoked_at is not None:
        sessions.close(session_id or "")
        raise Unauthorized("The API key of this session was revoked. Sign in again.")
    return key


def sign_out(sessions: Sessions, session_id: str | None) -> None:
    sessions.close(session_id or "")
