"""Continuation tokens: opaque to clients, checked on the way back in.

A token is base64url of a small JSON object and a MAC over it. The MAC binds the token to the
query it continues (``scope``: the endpoint and its filters), so a token that was altered,
cut short, or taken from another query is refused (400) before anything reads the store.
The MAC's keys are the ``TokenKeys`` app setting (``shared.core.sealed.Keys``: the current key
signs, a token by the previous one is still redeemed), given by the caller (``Runtime.keys``).
The MAC detects tampering, it does not keep the content secret (a token holds only a table key
the caller could page to anyway), and every value decoded from a token is checked again and used
only as a parameter of a filter.
"""

from __future__ import annotations

import json
from typing import Any

from shared.core import sealed

# The kind of token the MAC is taken under (not a key): a fencing token never redeems as one.
_LABEL = b"orders-continuation-token-v1"
MAX_TOKEN_LENGTH = 1024


class InvalidToken(ValueError):
    """The continuation token was not issued by this app for this query."""


def _label(scope: str) -> bytes:
    return _LABEL + b"\x00" + scope.encode("utf-8")


def issue(keys: sealed.Keys, scope: str, position: dict[str, Any]) -> str:
    """A token for ``position`` within the query named by ``scope``, by the current key."""
    payload = json.dumps(position, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return sealed.seal(keys, _label(scope), payload)


def redeem(keys: sealed.Keys, scope: str, token: str) -> dict[str, Any]:
    """The position a token holds, if it was issued for ``scope`` (by either key); else ``InvalidToken``."""
    try:
        payload = sealed.unseal(keys, _label(scope), token, MAX_TOKEN_LENGTH, foreign="not issued for this query")
    except sealed.Unsealed as exc:
        raise InvalidToken(str(exc)) from exc
    try:
        position = json.loads(payload)
    except ValueError as exc:  # pragma: no cover - a MAC we issued covers JSON we wrote
        raise InvalidToken("unreadable") from exc
    if not isinstance(position, dict):
        raise InvalidToken("unreadable")
    return position
