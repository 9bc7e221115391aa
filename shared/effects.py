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
* A ``Send`` with a ``fence`` (an agent request): the executor fills in the ETags the last
  ``Transact`` of this run returned and puts the fencing token (``shared.fence``) in the body;
  when it cannot vouch for a row's ETag the request goes without one (the reply path reads).
* Non-critical ``Send`` (status, best-effort schedule notices that an index row backs up),
  ``Alert`` and ``DeleteIndex``: failures are logged and the flow continues.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from shared import console_stats, fence, metrics, telemetry
from shared.logs import log_event
from shared.messaging import Bus, OutMessage
from shared.store import ETAG, STATE_ROW, Conflict, Op, Store


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

    @property
    def props(self) -> dict[str, Any]:
        """The row's properties (what the sweep reads back)."""
        return {"OrderId": self.order_id, "Due": iso(self.due)}


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
    ``puts``, delete ``deletes``. After the state write it reflects, in the same invocation; a
    failure keeps the order's deadline row (the ``DeleteIndex`` after it is skipped), so the
    Supervisor re-indexes the order when that row falls due."""

    order_id: str
    puts: tuple[dict[str, Any], ...]
    deletes: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()  # rows that may not be there: deleted one by one, apart from the rest


@dataclass(frozen=True)
class Send:
    message: OutMessage
    critical: bool = True
    what: str = ""
    # An agent request's fencing token rows (RowKey -> entity, its ETag under ``ETAG``): the
    # order's live rows as they are after this decision's transaction. The executor replaces the
    # rows that transaction wrote with what it wrote and their new ETags (``shared.fence``).
    fence: Mapping[str, Mapping[str, Any]] | None = None


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


@dataclass
class _Written:
    """What the committed ``Transact`` effects of a run wrote on one order: RowKey -> entity with
    its new ETag (None: deleted, or no ETag came back). A write on another order starts over."""

    order_id: str | None = None
    rows: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def record(self, eff: Transact, etags: Mapping[str, str] | None) -> None:
        if eff.order_id != self.order_id:
            self.order_id, self.rows = eff.order_id, {}
        for op in eff.ops:
            etag = (etags or {}).get(op.row_key)
            if fence.live_row(op.row_key):
                self.rows[op.row_key] = None if op.kind == "delete" or not etag else {**op.row, ETAG: etag}


def fenced(message: OutMessage, rows: Mapping[str, Mapping[str, Any]], written: _Written) -> OutMessage:
    """``message`` with the fencing token of ``rows`` overlaid with what this run wrote; unchanged
    (no token) unless this run committed the order's state row with an ETag for every row it wrote."""
    order_id = message.body.get("orderId")
    if written.order_id != order_id or written.rows.get(STATE_ROW) is None:
        return message
    merged: dict[str, Mapping[str, Any]] = {}
    for key in {*rows, *written.rows}:
        if key in written.rows:
            row = written.rows[key]
            if row is None:  # written without an ETag back (or deleted): no token
                return message
            merged[key] = row
        else:
            merged[key] = rows[key]
    token = fence.encode(str(order_id), merged)
    if token is None:
        return message
    return replace(message, body={**message.body, "fence": token})


def execute(effects: Sequence[Effect], store: Store, bus: Bus, *, limit: int | None = None) -> Outcome:
    """Run ``effects`` in order (only the first ``limit`` of them: a simulated crash)."""
    out = Outcome()
    written = _Written()
    for n, eff in enumerate(effects):
        if limit is not None and n >= limit:
            break
        if isinstance(eff, PutIndex):
            store.put_index(eff.bucket, eff.row_key, eff.props)
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
                etags = store.transact(eff.order_id, eff.ops)
            except Conflict as exc:
                out.lost_race = True
                log_event(logging.INFO, "state.lost_race", order_id=eff.order_id, note=eff.note, detail=str(exc))
                out.applied = n
                return out
            written.record(eff, etags)
            console_stats.record_committed(store, metrics.record_committed(eff.ops))
        elif isinstance(eff, Reindex):
            try:
                store.write_index(eff.puts, eff.deletes, stale=eff.stale)
            except Exception as exc:
                out.index_failed = True
                log_event(logging.WARNING, "index.write_failed", order_id=eff.order_id, error=repr(exc))
        elif isinstance(eff, Send):
            message = eff.message if eff.fence is None else fenced(eff.message, eff.fence, written)
            try:
                telemetry.send(bus, message)
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
