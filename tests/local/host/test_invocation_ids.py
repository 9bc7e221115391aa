"""The local host's own ids: invocation ids are version-4 GUIDs, traceparents valid W3C ones."""

from __future__ import annotations

import re
import uuid

from local.host.app import new_invocation_id, new_traceparent

TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-01")


def test_invocation_ids_are_version_4_guids() -> None:
    ids = [new_invocation_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        u = uuid.UUID(text)
        assert str(u) == text and u.version == 4 and u.variant == uuid.RFC_4122


def test_every_random_bit_is_used() -> None:
    # the 122 random bits of a v4 GUID each take both values over a few thousand ids
    seen_one, seen_zero = 0, 0
    for _ in range(4000):
        n = uuid.UUID(new_invocation_id()).int
        seen_one |= n
        seen_zero |= ~n
    fixed = (0xF000 << 64) | (0xC000 << 48)
    assert seen_one & seen_zero & ((1 << 128) - 1) == ((1 << 128) - 1) & ~fixed


def test_new_traceparents_are_valid_and_distinct() -> None:
    values = [new_traceparent() for _ in range(2000)]
    assert len(set(values)) == len(values)
    assert all(TRACEPARENT.fullmatch(v) for v in values)
