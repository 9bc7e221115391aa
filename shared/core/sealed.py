"""Sealed strings: base64url of a 16-byte MAC and a payload, checked on the way back in.

The one envelope of the app's opaque tokens: continuation tokens (``shared.api.tokens``, the MAC
binds the query) and fencing tokens (``shared.storage.fence``, the order's rows). Each caller brings its
own ``sign`` (its key, and what else the MAC covers) and its own exception; a token is refused
if it is empty or too long, not base64url in the form written here, or its MAC does not match.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Callable

MAC_BYTES = 16
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")

Sign = Callable[[bytes], bytes]  # payload -> MAC_BYTES bytes


class Unsealed(ValueError):
    """The string is not one this app sealed (the message says how)."""


def mac(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data``, cut to ``MAC_BYTES``."""
    return hmac.new(key, data, hashlib.sha256).digest()[:MAC_BYTES]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def seal(sign: Sign, payload: bytes) -> str:
    return _b64(sign(payload) + payload)


def unseal(sign: Sign, token: str, max_length: int, *, foreign: str) -> bytes:
    """The payload ``token`` seals; :class:`Unsealed` (``foreign``: the message for a MAC that
    does not match) for anything else."""
    if not token or len(token) > max_length or not _ALPHABET.fullmatch(token):
        raise Unsealed("malformed")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except ValueError as exc:
        raise Unsealed("not base64url") from exc
    if _b64(raw) != token:  # another spelling of the same bytes (spare bits) is not ours
        raise Unsealed("not base64url in the form this app writes")
    tag, payload = raw[:MAC_BYTES], raw[MAC_BYTES:]
    if len(tag) != MAC_BYTES or not hmac.compare_digest(tag, sign(payload)):
        raise Unsealed(foreign)
    return payload
