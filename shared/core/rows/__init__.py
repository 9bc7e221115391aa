"""Typed rows of the state store, converted at the store boundary.

The store speaks entities (dicts of Table Storage properties, ``PascalCase``, times as
ISO-8601 text, JSON as text, the ETag under ``shared.core.rows.ETAG``). The core speaks these
frozen dataclasses: each row reads itself with ``from_entity`` and writes itself with
``to_entity`` (no ``None`` written: absent means null). A change is ``dataclasses.replace``.
The layout of the table is described in ``shared.storage.store``. By concern: ``base`` (keys,
codecs, ``Op``, ``Row``), ``order`` (an order's partition) and ``index`` (the deadline and search
indexes). Import from this package.
"""

from shared.core.rows.base import (
    ETAG,
    HISTORY_END,
    HISTORY_PREFIX,
    LIVE_ROWS_FROM,
    ORDER_ROW,
    STATE_ROW,
    Entity,
    Op,
    Row,
    history_row_key,
    step_row_key,
)
from shared.core.rows.index import IndexRow, SearchRow
from shared.core.rows.order import EventRow, OrderRow, StateRow, StepRow

__all__ = [
    "ETAG", "HISTORY_END", "HISTORY_PREFIX", "LIVE_ROWS_FROM", "ORDER_ROW", "STATE_ROW", "Entity", "EventRow",
    "IndexRow", "Op", "OrderRow", "Row", "SearchRow", "StateRow", "StepRow", "history_row_key", "step_row_key",
]
