"""Effects the pure core asks for, and the executor that performs them in order.

The core (``shared.statemachine``) never touches a store or a bus: it returns a list of
effects. The executor runs them one by one, in order, and stops at the first lost race.
Running only the first ``k`` effects is exactly what a crash after effect ``k`` leaves
behind; the unit tests do that for every ``k`` and then replay the message / run the
Supervisor to show the state converges.

Telemetry (at this boundary, never in the core): every message is sent in a PRODUCER span that
it carries (``shared.telemetry.send``); a committed transaction's history events feed the metrics
(``shared.metrics.record_committed``) and the console's figures (``shared.console_stats``); alerts
are counted.

Failure handling per effect:

* ``PutIndex`` / ``Transact`` / critical ``Send``: an exception propagates (the trigger's
  message is abandoned and redelivered; the handler is idempotent and resumes from the store).
* ``Transact`` losing its ETag condition (``Conflict``): a lost race. Nothing after it runs;
  the outcome says so.
* ``Reindex`` (the search index, after the state write): failures are logged, and the
  ``DeleteIndex`` effects after it are skipped (the Supervisor re-indexes from the kept row).
* Non-critical ``Send`` (status, best-effort schedule notices that an index row backs up),
  ``Alert`` and ``DeleteIndex``: failures are logged and the flow continues.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import console_stats, metrics, telemetry
from shared.logs import log_event
from shared.messaging import Bus, OutMessage
from shared.store import Conflict, Op, Store


def bucket_of(due: datetime) -> str:
    """Deadline index partition: the due minute, UTC, ``yyyyMMddHHmm``."""
    return due.strftime("%Y%m%d%H%M")


def index_row_key(order_id: str, due: datetime) -> str:
    """``orderId:due``. The due instant is part of the key, so that a new row of the same order
    (a later deadline, moved or put by another writer) never shares a key with an older one:
    deleting the old row can never delete the new one."""
    return f"{order_id}:{due.strftime('%Y%m%dT%H%M%S%f')}"


@dataclass(frozen=True)
class PutIndex:
    """Upsert a deadline index row (one per order, see ``shared.statemachine``: "The deadline
    index"). Always written BEFORE the state write whose deadline it must cover."""

    order_id: str
    due: datetime
    note: str = ""

    @property
    def bucket(self) -> str:
        return bucket_of(self.due)

    @property
    def row_key(self) -> str:
        return index_row_key(self.order_id, self.due)


@dataclass(frozen=True)
class DeleteIndex:
    """Best-effort delete of an index row the order no longer needs (the sweep also deletes lazily)."""

    bucket: str
    row_key: str


@dataclass(frozen=True)
class Transact:
    """An ETag-conditioned entity-group transaction on one order's partition."""

    order_id: str
    ops: tuple[Op, ...]
    note: str = ""  # the crash point this write is safe against (for humans and logs)


@dataclass(frozen=True)
class Reindex:
    """Write the order's search index rows (``shared.statemachine.search_index``): upsert
    ``puts``, delete ``deletes``. After the state write it reflects; best effort. The Table
    store queues it (``shared.write_behind``) and sends the order's deadline-row delete only
    after it; a failure here (or there) keeps the deadline row, so the Supervisor re-indexes."""

    order_id: str
    puts: tuple[dict[str, Any], ...]
    deletes: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()  # rows that may not be there: deleted one by one, apart from the rest


@dataclass(frozen=True)
class Send:
    message: OutMessage
    critical: bool = True
    what: str = ""


@dataclass(frozen=True)
class Alert:
    """Operator alert: a message to the alerts queue AND an error-level JSON log line."""

    message: OutMessage
    order_id: str
    step: str | None
    reason: str
    failure_count: int
    traceparent: str | None = None


@dataclass(frozen=True)
class Log:
    level: int
    event: str
    order_id: str | None = None
    traceparent: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


Effect = PutIndex | DeleteIndex | Transact | Reindex | Send | Alert | Log


@dataclass
class Outcome:
    applied: int = 0
    lost_race: bool = False
    failed_sends: list[str] = field(default_factory=list)
    index_failed: bool = False  # a Reindex failed: the deadline row is kept for the Supervisor


def execute(effects: Sequence[Effect], store: Store, bus: Bus, *, limit: int | None = None) -> Outcome:
    """Run ``effects`` in order (only the first ``limit`` of them: a simulated crash)."""
    out = Outcome()
    for n, eff in enumerate(effects):
        if limit is not None and n >= limit:
            break
        if isinstance(eff, PutIndex):
            store.put_index(eff.bucket, eff.row_key, {"OrderId": eff.order_id, "Due": iso(eff.due)})
        elif isinstance(eff, DeleteIndex):
            if out.index_failed:  # kept: the sweep re-indexes the order when it deletes the row
                out.applied = n + 1
                continue
            try:
                store.delete_index(eff.bucket, eff.row_key)
            except Exception as exc:  # lazily deleted by the sweep anyway
                log_event(logging.WARNING, "index.delete_failed", row=eff.row_key, error=repr(exc))
        elif isinstance(eff, Transact):
            try:
                store.transact(eff.order_id, eff.ops)
            except Conflict as exc:
                out.lost_race = True
                log_event(logging.INFO, "state.lost_race", order_id=eff.order_id, note=eff.note, detail=str(exc))
                out.applied = n
                return out
            console_stats.record_committed(store, metrics.record_committed(eff.ops))
        elif isinstance(eff, Reindex):
            try:
                store.write_index(eff.puts, eff.deletes, stale=eff.stale)
            except Exception as exc:
                out.index_failed = True
                log_event(logging.WARNING, "index.write_failed", order_id=eff.order_id, error=repr(exc))
        elif isinstance(eff, Send):
            try:
                telemetry.send(bus, eff.message)
            except Exception as exc:
                if eff.critical:
                    raise
                out.failed_sends.append(eff.message.message_id)
                log_event(logging.WARNING, "send.failed", order_id=eff.message.body.get("orderId"),
                          queue=eff.message.queue, messageId=eff.message.message_id, what=eff.what,
                          error=repr(exc))
        elif isinstance(eff, Alert):
            log_event(logging.ERROR, "alert", order_id=eff.order_id, traceparent=eff.traceparent,
                      step=eff.step, reason=eff.reason, failureCount=eff.failure_count)
            metrics.alerts.add(1, {"step": eff.step or ""})
            try:
                telemetry.send(bus, eff.message)
            except Exception as exc:
                out.failed_sends.append(eff.message.message_id)
                log_event(logging.ERROR, "alert.send_failed", order_id=eff.order_id, error=repr(exc))
        elif isinstance(eff, Log):
            log_event(eff.level, eff.event, order_id=eff.order_id, traceparent=eff.traceparent, **eff.fields)
        else:  # pragma: no cover
            raise TypeError(f"unknown effect {eff!r}")
        out.applied = n + 1
    return out


def iso(dt: datetime) -> str:
    return dt.isoformat(timespec="microseconds")


def parse_iso(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value)
