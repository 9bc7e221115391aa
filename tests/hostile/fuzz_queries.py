"""The query side of the fuzz run (tests/hostile/fuzz.py): search, history and dead letters.

* ``HOSTILE_QUERY_VALUES``: values a generated search or history request may have one of its
  query parameters replaced with (OData injection, huge and non-ASCII numbers, dates that are
  not dates, key-range prefixes of the search index, control characters).
* ``Tokens``: the continuation tokens the app handed out during the run, so that later
  requests send them back: unchanged (with the query they came from, or another one), or
  tampered with (``tamper``).
* ``search_violations``: what a 200 of ``GET /api/orders`` must never hold: an order of
  another customer, of another category, created outside the range asked for, or out of
  order (newest first).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from typing import Any

# The query parameters each query operation takes (path -> names).
QUERY_PARAMS: dict[str, tuple[str, ...]] = {
    "/orders": ("state", "customerId", "workflow", "failedStep", "createdFrom", "createdTo", "limit",
                "continuationToken"),
    "/orders/{id}/history": ("limit", "continuationToken"),
    "/deadletters": ("queue", "limit", "from"),
}
# Queues GET /deadletters knows (a setting, or a queue's name in any case), for pages that exist.
DEAD_LETTER_QUEUES: tuple[str, ...] = ("SchedulerQueue", "alerts", "AGENT-PAYMENT", "replies")

HOSTILE_QUERY_VALUES: tuple[str, ...] = (
    "x' or PartitionKey ne '",
    "' or '1' eq '1",
    "') or (RowKey ne '",
    "2020-01-01' or 1 eq 1",
    "2020-01-01T00:00:00Z' or PartitionKey ne '",
    "processed' or RowKey gt '",
    "all-", "cust-", "cat-processed-", "fin-", "history-", "order", "~", "\uffff",
    "0", "-1", "201", "1001", "1000000000", "1" + "0" * 40, "1e309", "NaN", "-Infinity", "1.5", "0x10", "1_0",
    "\u0663", "\uff11", "+5", " 5", "5 ",
    "PROCESSED", "inflight", "held", "failed", "processed,error", "",
    "0000-01-01", "9999-12-31T23:59:60Z", "2020-02-30", "2020-01-01T00:00:00", "2020-01-01T25:00:00Z",
    "2020-01-01T00:00:00+99:00", "10000-01-01", "-2020-01-01", "2020-01-01T00:00:00 01:00",
    "9999-12-31T23:59:59-12:00", "1970-01-01T00:00:00+14:00", "1969-12-31T23:59:59.999999Z",
    "\x00", "\n", "\r\nX-Injected: 1", "\u202e", "../..", "%00", "%27", "null", "[]", "{}",
    "AAAA", "====", "a" * 5000,
)


def tamper(token: str, how: int) -> str:
    """``token`` changed one way (``how`` picks it): a bit flipped in what it encodes, a
    character changed, truncated, extended, re-cased or doubled."""
    how %= 8
    if how == 0:
        flipped = _flip_decoded_bit(token)
        if flipped is not None:
            return flipped
    if how in (0, 1) and token:
        mid = len(token) // 2
        return token[:mid] + ("B" if token[mid] != "B" else "C") + token[mid + 1:]
    if how == 2:
        return token.rstrip("=")[:-1]  # one character of content, not just padding
    if how == 3:
        return token[: len(token) // 2]
    if how == 4:
        return token + "A"
    if how == 5 and token.swapcase() != token:
        return token.swapcase()
    if how == 6:
        return token + token
    return base64.urlsafe_b64encode(b"\x00" * max(1, len(token))).decode()


def _flip_decoded_bit(token: str) -> str | None:
    """The token with one bit of its base64 content flipped (re-encoded as it was), or None
    when it is not base64 that encodes back to itself."""
    for decode, encode in ((base64.urlsafe_b64decode, base64.urlsafe_b64encode),
                           (base64.b64decode, base64.b64encode)):
        stripped = token.rstrip("=")
        try:
            raw = decode(stripped + "=" * (-len(stripped) % 4))
        except (binascii.Error, ValueError):
            continue
        padded = token.endswith("=")
        again = encode(raw).decode()
        if (again if padded else again.rstrip("=")) != token or not raw:
            continue
        flipped = bytearray(raw)
        flipped[len(flipped) // 2] ^= 0x01
        out = encode(bytes(flipped)).decode()
        return out if padded else out.rstrip("=")
    return None


@dataclass
class Tokens:
    """Continuation tokens seen in responses, oldest first (at most ``cap``), with the
    operation that takes them back (a history token from GET /orders/{id} is the history's)."""

    cap: int = 200
    seen: list[tuple[str, str]] = field(default_factory=list)  # (path, token)

    def record(self, path: str, body: Any) -> None:
        if not isinstance(body, dict):
            return
        key, taker = (("historyContinuationToken", "/orders/{id}/history") if path == "/orders/{id}"
                      else ("continuationToken", path))
        token = body.get(key)
        if isinstance(token, str) and token and (taker, token) not in self.seen and len(self.seen) < self.cap:
            self.seen.append((taker, token))

    def pick(self, index: int, path: str | None = None) -> str | None:
        """A token seen (one ``path`` takes, if given and there is one)."""
        pool = [t for p, t in self.seen if path is None or p == path] or [t for _, t in self.seen]
        return pool[index % len(pool)] if pool else None


def parse_instant(value: Any) -> datetime | None:
    """A createdFrom/createdTo value as the contract reads it, or None if it is not one."""
    if not isinstance(value, str):
        return None
    try:
        if len(value) == 10:
            return datetime.combine(date.fromisoformat(value), time(0), tzinfo=UTC)
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def search_violations(query: dict[str, Any], body: Any) -> list[str]:
    """How a 200 page of ``GET /api/orders`` for ``query`` breaks its filters, if it does."""
    if not isinstance(body, dict) or not isinstance(body.get("orders"), list):
        return ["the body is not {orders: [...]}"]
    out: list[str] = []
    customer, state = query.get("customerId"), query.get("state")
    lo, hi = parse_instant(query.get("createdFrom")), parse_instant(query.get("createdTo"))
    previous: datetime | None = None
    for order in body["orders"]:
        oid = order.get("orderId")
        if isinstance(customer, str) and order.get("customerId") != customer:
            out.append(f"{oid}: customerId {order.get('customerId')!r}, asked {customer!r}")
        if isinstance(state, str) and order.get("category") != state:
            out.append(f"{oid}: category {order.get('category')!r}, asked {state!r}")
        for param in ("workflow", "failedStep"):
            asked = query.get(param)
            if isinstance(asked, str) and order.get(param) != asked:
                out.append(f"{oid}: {param} {order.get(param)!r}, asked {asked!r}")
        created = parse_instant(order.get("createdAt"))
        if created is None:
            out.append(f"{oid}: createdAt {order.get('createdAt')!r} is not an instant")
            continue
        if lo is not None and created < lo:
            out.append(f"{oid}: created {created.isoformat()} before createdFrom {lo.isoformat()}")
        if hi is not None and created >= hi:
            out.append(f"{oid}: created {created.isoformat()} not before createdTo {hi.isoformat()}")
        if previous is not None and created > previous:
            out.append(f"{oid}: created {created.isoformat()} after the order before it (newest first)")
        previous = created
    return out
