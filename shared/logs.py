"""Structured JSON logs and W3C trace context.

Every log line the core writes about an order is one JSON object (``event``, ``orderId``,
``traceId``, ``traceparent`` and event fields) so it can be queried in Application Insights /
Log Analytics by order id or trace id. The Functions host forwards the Python ``logging``
records; the JSON is the record's message, so it survives any handler/formatter.

Trace context: the submission takes ``traceparent`` from the HTTP request (or starts a new
trace), stores it on the order row, and every message the app sends for the order carries a
child ``traceparent`` (same trace id, new parent id) as an application property.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

log = logging.getLogger("orders")

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def parse_traceparent(value: str | None) -> str | None:
    """A valid W3C traceparent (version 00, non-zero ids), normalised, or None."""
    if not value or not isinstance(value, str):
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if not m:
        return None
    version, trace_id, parent_id, _flags = m.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return m.group(0)


def new_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def child_traceparent(parent: str | None) -> str:
    """Same trace, new span id: what a message sent on behalf of ``parent`` carries."""
    tp = parse_traceparent(parent)
    if tp is None:
        return new_traceparent()
    version, trace_id, _parent, flags = tp.split("-")
    return f"{version}-{trace_id}-{secrets.token_hex(8)}-{flags}"


def trace_id(traceparent: str | None) -> str | None:
    tp = parse_traceparent(traceparent)
    return tp.split("-")[1] if tp else None


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def to_json(fields: Mapping[str, Any]) -> str:
    return json.dumps(fields, default=_default, separators=(",", ":"), sort_keys=False)


def log_event(level: int, event: str, *, order_id: str | None = None, traceparent: str | None = None,
              **fields: Any) -> dict[str, Any]:
    """Write one structured JSON log line; returns the record (tests assert on it)."""
    record: dict[str, Any] = {"event": event}
    if order_id is not None:
        record["orderId"] = order_id
    if traceparent:
        record["traceparent"] = traceparent
        record["traceId"] = trace_id(traceparent)
    record.update({k: v for k, v in fields.items() if v is not None})
    log.log(level, to_json(record))
    return record
