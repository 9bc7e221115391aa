"""Structured JSON logs.

Every log line the core writes about an order is one JSON object (``event``, ``orderId``,
``traceId``, ``spanId`` and event fields) so it can be queried in Application Insights / Log
Analytics by order id or trace id. The Functions host forwards the Python ``logging`` records;
the JSON is the record's message, so it survives any handler/formatter.

Trace ids come from the current OpenTelemetry span (``shared.observability.telemetry``); outside the
order's spans, from the ``traceparent`` a caller names (the order's stored one), in whose context
the line is then written: the exporter sends it with the order's telemetry, and only when the
order's is sampled (``shared.observability.sampling``; warnings and errors always).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from shared.core.jsonio import present
from shared.observability import telemetry

log = logging.getLogger("orders")


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# one encoder: json.dumps with any non-default argument builds a new JSONEncoder per call
_ENCODER = json.JSONEncoder(default=_default, separators=(",", ":"), sort_keys=False)


def to_json(fields: Mapping[str, Any]) -> str:
    return _ENCODER.encode(fields)


def log_event(level: int, event: str, *, order_id: str | None = None, traceparent: str | None = None,
              **fields: Any) -> dict[str, Any]:
    """Write one structured JSON log line; returns the record (tests assert on it)."""
    record: dict[str, Any] = {"event": event}
    if order_id is not None:
        record["orderId"] = order_id
    ids = telemetry.current_ids()
    order_trace = telemetry.trace_id(traceparent) if traceparent else None
    outside = False
    if ids is not None and order_trace in (None, ids[0]):
        record["traceId"], record["spanId"] = ids
    elif order_trace is not None:
        record["traceId"] = order_trace  # outside the order's flow (a sweep): the order's trace id
        outside = True
    record.update(present(fields))
    if log.isEnabledFor(level):  # the record is returned either way; its JSON only when written
        if outside:  # written in the order's stored context: exported, or not, with the order's telemetry
            with telemetry.in_order(traceparent):
                log.log(level, to_json(record))
        else:
            log.log(level, to_json(record))
    return record
