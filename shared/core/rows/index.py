"""The index rows: the deadline index's (the Supervisor's) and the search index's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core.rows.base import OPTIONAL_INT, TEXT, TIME, Entity, Row, _enum, props_of
from shared.core.states import Category, Outcome, ProcessState
from shared.core.times import iso, parse_iso


@dataclass(frozen=True, slots=True)
class IndexRow:
    """A deadline index row (DeadlineTable, PartitionKey = the due minute): the Supervisor looks
    at the order at ``due``. A breaker's watch is one too, with no order id."""

    bucket: str
    row_key: str
    order_id: str | None
    due: datetime | None

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any]) -> IndexRow:
        return cls(str(entity["PartitionKey"]), str(entity["RowKey"]), entity.get("OrderId"),
                   parse_iso(entity.get("Due")))

    def props(self) -> Entity:
        """The row's properties (what the sweep reads back)."""
        out: Entity = {}
        if self.order_id is not None:
            out["OrderId"] = self.order_id
        if self.due is not None:
            out["Due"] = iso(self.due)
        return out


@dataclass(frozen=True, slots=True)
class SearchRow(Row):
    """A row of the search index (OrderIndexTable, partition ``orders``; the keys are
    ``shared.core.statemachine.search_index``'s). The ``all-``, ``cust-`` and ``cat-`` rows carry
    a summary of the order, as its state was when the row was written; a ``fin-`` row (a finished
    order, by finish day, for retention) carries what is needed to find those rows again."""

    key: str
    order_id: str
    category: Category = Category.IN_FLIGHT
    customer_id: str | None = None
    created_at: datetime | None = None
    process_state: ProcessState | None = None
    failure_count: int | None = None
    priority: str | None = None
    updated_at: datetime | None = None
    outcome: Outcome | None = None
    rev: str | None = None  # fin- rows: the order's inverted creation time
    customer_key: str | None = None  # fin- rows: the order's customer, as a key
    # all-/cust-/cat- rows from this version on (None in a row written before: read the order)
    workflow: str | None = None
    failed_step: str | None = None
    total: str | None = None  # a decimal string (the console's landing page lists it)
    currency: str | None = None
    etag: str | None = None
    legacy: bool = False  # read from the partition before the shards (not stored: see shared.storage.store)

    @property
    def row_key(self) -> str:
        return self.key


SearchRow.PROPS = props_of(SearchRow, {
    "key": ("RowKey", TEXT), "order_id": ("OrderId", TEXT),
    "category": ("Category", _enum(Category, Category.IN_FLIGHT)), "customer_id": ("CustomerId", TEXT),
    "created_at": ("CreatedAt", TIME), "process_state": ("ProcessState", _enum(ProcessState)),
    "failure_count": ("FailureCount", OPTIONAL_INT), "priority": ("Priority", TEXT), "updated_at": ("UpdatedAt", TIME),
    "outcome": ("Outcome", _enum(Outcome)), "rev": ("Rev", TEXT), "customer_key": ("CustomerKey", TEXT),
    "workflow": ("Workflow", TEXT), "failed_step": ("FailedStep", TEXT), "total": ("Total", TEXT),
    "currency": ("Currency", TEXT),
})
