"""Continuation tokens: opaque to clients, checked on the way back in.

A token is base64url of a small JSON object and a MAC over it. The MAC binds the token to the
query it continues (``scope``: the endpoint and its filters), so a token that was altered,
cut short, or taken from another query is refused (400) before anything reads the store.
The key is fixed in the app: the MAC detects tampering, it does not keep the content secret
(a token holds only a table key the caller could page to anyway), and every value decoded
from a token is checked again and used only as a parameter of a filter.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from typing import Any

_KEY = b"orders-continuation-token-v1"
_MAC_BYTES = 16
MAX_TOKEN_LENGTH = 1024
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


class InvalidToken(ValueError):
    """The continuation token was not issued by this app for this query."""


def _mac(scope: str, payload: bytes) -> bytes:
    return hmac.new(_KEY, scope.encode("utf-8") + b"\x00" + payload, hashlib.sha256).digest()[:_MAC_BYTES]


def issue(scope: str, position: dict[str, Any]) -> str:
    """A token for ``position`` within the query named by ``scope``."""
    payload = json.dumps(position, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return _encode(_mac(scope, payload) + payload)


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def redeem(scope: str, token: str) -> dict[str, Any]:
    """The position a token holds, if it was issued for ``scope``; else ``InvalidToken``."""
    if not token or len(token) > MAX_TOKEN_LENGTH or not _ALPHABET.fullmatch(token):
        raise InvalidToken("malformed")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except ValueError as exc:
        raise InvalidToken("not base64url") from exc
    if _encode(raw) != token:  # another spelling of the same bytes (spare bits) is not ours
        raise InvalidToken("not base64url in the form this app writes")
    mac, payload = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
    if len(mac) != _MAC_BYTES or not hmac.compare_digest(mac, _mac(scope, payload)):
        raise InvalidToken("not issued for this query")
    try:
        position = json.loads(payload)
    except ValueError as exc:  # pragma: no cover - a MAC we issued covers JSON we wrote
        raise InvalidToken("unreadable") from exc
    if not isinstance(position, dict):
        raise InvalidToken("unreadable")
    return position
