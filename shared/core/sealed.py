"""Sealed strings: base64url of a 16-byte MAC and a payload, checked on the way back in.

The one envelope of the app's opaque tokens: continuation tokens (``shared.api.tokens``, the MAC
binds the query) and fencing tokens (``shared.core.fence``, the order's rows). Both are MAC'd
with the same :class:`Keys` (the ``TokenKeys`` app setting, ``shared.settings``), each under its
own ``label`` (what kind of token it is, and what else the MAC covers), so a token of one kind is
never one of the other. A token is refused if it is empty or too long, not base64url in the form
written here, or its MAC is by neither key (the same refusal as a changed token).

The keys are given, never read here: the core reads no setting.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass, field

MAC_BYTES = 16
MIN_KEY_BYTES = 32  # HMAC-SHA256: a key shorter than its 32-byte output only weakens it
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


class Unsealed(ValueError):
    """The string is not one this app sealed (the message says how)."""


def mac(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data``, cut to ``MAC_BYTES``."""
    return hmac.new(key, data, hashlib.sha256).digest()[:MAC_BYTES]


@dataclass(frozen=True)
class Keys:
    """The MAC keys, for two-key rotation: ``current`` signs every new token; a MAC by ``current``
    or by ``previous`` (if any) is accepted, so tokens issued before a rotation keep working until
    ``previous`` is dropped. The keys never show in a repr (logs, test failures)."""

    current: bytes = field(repr=False)
    previous: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for key in (self.current, self.previous):
            if key is not None and len(key) < MIN_KEY_BYTES:
                raise ValueError(f"a MAC key must have at least {MIN_KEY_BYTES} bytes")

    def sign(self, label: bytes, payload: bytes) -> bytes:
        """The MAC of ``payload`` under ``label``, by the current key."""
        return mac(self.current, _covered(label, payload))

    def verifies(self, tag: bytes, label: bytes, payload: bytes) -> bool:
        """``tag`` is the MAC of ``payload`` under ``label`` by the current or the previous key."""
        data = _covered(label, payload)
        return any(hmac.compare_digest(tag, mac(key, data)) for key in (self.current, self.previous)
                   if key is not None)


def _covered(label: bytes, payload: bytes) -> bytes:
    # The label first, NUL-terminated. Every label starts with its kind of token (no NUL in it),
    # so a MAC of one kind never verifies as one of another.
    return label + b"\x00" + payload


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def seal(keys: Keys, label: bytes, payload: bytes) -> str:
    return _b64(keys.sign(label, payload) + payload)


def unseal(keys: Keys, label: bytes, token: str, max_length: int, *, foreign: str) -> bytes:
    """The payload ``token`` seals under ``label``; :class:`Unsealed` (``foreign``: the message
    for a MAC by neither key) for anything else."""
    if not token or len(token) > max_length or not _ALPHABET.fullmatch(token):
        raise Unsealed("malformed")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except ValueError as exc:
        raise Unsealed("not base64url") from exc
    if _b64(raw) != token:  # another spelling of the same bytes (spare bits) is not ours
        raise Unsealed("not base64url in the form this app writes")
    tag, payload = raw[:MAC_BYTES], raw[MAC_BYTES:]
    if len(tag) != MAC_BYTES or not keys.verifies(tag, label, payload):
        raise Unsealed(foreign)
    return payload
