"""A bulk operation: one operator action over the orders a search matched (``POST /api/operations``).

Its rows live in the StateTable, in the partition ``operation-{id}``, written in ONE transaction
when it starts: the header (RowKey ``operation``: action, filter, who, progress) and the matched
order ids in chunks (RowKey ``ids-NNN``, ``CHUNK`` ids each, space-separated). At most
``MAX_ORDERS`` orders: 20 chunks and the header fit in one transaction.

Progress is the header's ``Next`` (how many of the ids were acted on), its counts and its first
``MAX_ERRORS`` errors, moved forward by a conditional write (ETag) after each slice of orders. A
slice cut off by a crash is acted on again, and no order twice: the transaction that acts on an
order also keeps the operation's id on its state row (``Operations``, the last ``REMEMBERED``),
so a second pass finds it there and counts it as done.

What drives it is a *watch* in the deadline index (RowKey ``operation:{id}:{due}``), put before
the start's transaction, as a breaker's is (``shared.core.breaker.watch``): each Supervisor tick
that finds it due acts on the next slice and puts the next watch, until the header says done.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from shared.core.effects import bucket_of
from shared.core.jsonio import dumps, loads, present
from shared.core.rows import IndexRow
from shared.core.times import iso, parse_iso

MAX_ORDERS = 10_000
CHUNK = 500  # ids per row: 500 x 33 characters is 33 KB of a String property's 64 KiB
MAX_ERRORS = 20
REMEMBERED = 8
HEADER_ROW = "operation"
PARTITION_PREFIX = "operation-"
WATCH_PREFIX = "operation:"
# A watch whose operation has no header yet: its start may still be writing it. Deleted only this late.
STRAY_AFTER = timedelta(minutes=5)
_STAMP = "%Y%m%dT%H%M%S%f"
RUNNING, DONE = "running", "done"


def partition_of(operation_id: str) -> str:
    return f"{PARTITION_PREFIX}{operation_id}"


def chunk_row_key(index: int) -> str:
    return f"ids-{index:03d}"


def remember(operations: str | None, operation_id: str) -> str:
    """A state row's ``Operations`` with ``operation_id`` added (the last ``REMEMBERED``, newest last)."""
    kept = [o for o in (operations or "").split() if o != operation_id]
    return " ".join([*kept, operation_id][-REMEMBERED:])


def acted(operations: str | None, operation_id: str) -> bool:
    """Whether the operation already acted on the order whose state row keeps ``operations``."""
    return operation_id in (operations or "").split()


def chunks(order_ids: list[str]) -> list[dict[str, Any]]:
    """The id rows of an operation (entities without PartitionKey)."""
    return [{"RowKey": chunk_row_key(n // CHUNK), "Ids": " ".join(order_ids[n:n + CHUNK])}
            for n in range(0, len(order_ids), CHUNK)]


def ids_of(entity: dict[str, Any] | None) -> list[str]:
    return str((entity or {}).get("Ids") or "").split()


def _time(value: Any) -> datetime:
    parsed = parse_iso(value)
    if parsed is None:
        raise ValueError(f"not a time: {value!r}")
    return parsed


@dataclass(frozen=True)
class Operation:
    """An operation's header row: what it does, to what, for whom, and how far it got."""

    operation_id: str
    action: str
    filter: dict[str, str]
    by: str
    created_at: datetime
    matched: int
    updated_at: datetime | None = None
    next: int = 0  # ids acted on so far (in order)
    succeeded: int = 0
    failed: int = 0
    errors: tuple[dict[str, str], ...] = field(default_factory=tuple)
    key: str | None = None  # the Idempotency-Key it was started with
    etag: str | None = None

    @property
    def state(self) -> str:
        return DONE if self.next >= self.matched else RUNNING

    def advanced(self, acted_on: int, outcomes: list[tuple[str, str | None]], now: datetime) -> Operation:
        """The header after ``acted_on`` more ids: ``outcomes`` is (order id, None or the failure's reason)."""
        failures = [{"orderId": o, "reason": r} for o, r in outcomes if r is not None]
        return replace(self, next=self.next + acted_on, succeeded=self.succeeded + len(outcomes) - len(failures),
                       failed=self.failed + len(failures), errors=(*self.errors, *failures)[:MAX_ERRORS],
                       updated_at=now)

    def to_entity(self) -> dict[str, Any]:
        entity = {"RowKey": HEADER_ROW, "Action": self.action, "Filter": dumps(self.filter), "By": self.by,
                  "CreatedAt": iso(self.created_at), "Matched": self.matched, "Next": self.next,
                  "Succeeded": self.succeeded, "Failed": self.failed, "Errors": dumps(list(self.errors)),
                  "UpdatedAt": iso(self.updated_at or self.created_at), "IdempotencyKey": self.key}
        return present(entity)

    @classmethod
    def from_entity(cls, operation_id: str, e: dict[str, Any], etag: str | None = None) -> Operation:
        return cls(operation_id, str(e["Action"]), loads(e.get("Filter") or "{}"), str(e.get("By") or ""),
                   _time(e["CreatedAt"]), int(e.get("Matched") or 0),
                   parse_iso(e.get("UpdatedAt")), int(e.get("Next") or 0),
                   int(e.get("Succeeded") or 0), int(e.get("Failed") or 0),
                   tuple(loads(e.get("Errors") or "[]")), e.get("IdempotencyKey"), etag)

    def to_json(self) -> dict[str, Any]:
        """``GET /api/operations/{id}``'s body."""
        return {"operationId": self.operation_id, "action": self.action, "filter": self.filter, "by": self.by,
                "state": self.state, "matched": self.matched, "succeeded": self.succeeded, "failed": self.failed,
                "errors": list(self.errors), "createdAt": iso(self.created_at),
                "updatedAt": iso(self.updated_at or self.created_at)}


@dataclass(frozen=True)
class OperationWatch:
    """The Supervisor acts on the next slice of ``operation_id`` at ``due``."""

    operation_id: str
    due: datetime

    @property
    def row(self) -> IndexRow:
        key = f"{WATCH_PREFIX}{self.operation_id}:{self.due.strftime(_STAMP)}"
        return IndexRow(bucket_of(self.due), key, None, self.due)

    @classmethod
    def from_row(cls, row_key: str, due: datetime | None) -> OperationWatch | None:
        """The watch an index row is, or None (another kind of row, or a malformed one)."""
        if not row_key.startswith(WATCH_PREFIX) or due is None:
            return None
        parts = row_key[len(WATCH_PREFIX):].split(":")
        if len(parts) != 2 or not parts[0]:
            return None
        return cls(parts[0], due)
