"""Typed rows of the state store, converted at the store boundary.

The store speaks entities (dicts of Table Storage properties, ``PascalCase``, times as
ISO-8601 text, JSON as text, the ETag under ``shared.core.rows.ETAG``). The core speaks these
frozen dataclasses: each row reads itself with ``from_entity`` and writes itself with
``to_entity`` (no ``None`` written: absent means null). A change is ``dataclasses.replace``.
The layout of the table is described in ``shared.storage.store``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, ClassVar, Literal, TypeVar

from shared.core.jsonio import dumps, loads, present
from shared.core.lease import Lease
from shared.core.states import (
    Category,
    CompensationState,
    Mode,
    OrderCompensation,
    Outcome,
    ProcessState,
    StepState,
)
from shared.core.times import iso, parse_iso
from shared.core.workflows import DEFAULT_WORKFLOW, LEGACY_VERSION

# An entity as the store has it (PascalCase properties, keys, ETag under ETAG); each row below reads and writes one.
Entity = dict[str, Any]
R = TypeVar("R", bound="Row")

# The keys of an order's partition (StateTable, PartitionKey = the order id)
ORDER_ROW = "order"
STATE_ROW = "state"
HISTORY_PREFIX = "history-"
HISTORY_END = "history."  # the first key after every history row ('.' follows '-')
# The forward path reads an order's partition from here on: ``order``, ``state``, ``step-*``;
# its history rows (``history-*``) sort before it and are read only to show them.
LIVE_ROWS_FROM = ORDER_ROW


def step_row_key(index: int, name: str) -> str:
    return f"step-{index:02d}-{name}"


def history_row_key(seq: int) -> str:
    return f"{HISTORY_PREFIX}{seq:08d}"


@dataclass(frozen=True)
class Codec:
    """How one property is read from and written to an entity."""

    load: Callable[[Any], Any]
    dump: Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _enum(kind: Callable[[Any], Any], absent: Any = None) -> Codec:
    return Codec(lambda v: kind(v) if v is not None else absent, str)


TEXT = Codec(_same, _same)
INT = Codec(lambda v: int(v) if v is not None else 0, int)
OPTIONAL_INT = Codec(lambda v: None if v is None else int(v), int)
FLAG = Codec(bool, bool)
TIME = Codec(parse_iso, iso)
JSON = Codec(lambda v: loads(v) if v else None, dumps)
LEASE = Codec(Lease.parse, str)
# An order written before workflows were recorded has neither property: it ran order v1.
WORKFLOW_NAME = Codec(lambda v: v or DEFAULT_WORKFLOW, str)
WORKFLOW_VERSION = Codec(lambda v: LEGACY_VERSION if v is None else int(v), int)


ETAG = "_etag"  # where an entity read from the store carries its ETag


@dataclass(frozen=True)
class Op:
    """One write of a transaction. ``row`` holds RowKey and properties (no PartitionKey)."""

    kind: Literal["create", "replace", "delete"]
    row: Entity
    etag: str | None = None  # required for replace/delete: the ETag the decision was made on

    @property
    def row_key(self) -> str:
        return str(self.row["RowKey"])


class Row:
    """A typed row: ``PROPS`` maps each field to its property name and codec."""

    __slots__ = ()
    PROPS: ClassVar[tuple[tuple[str, str, Codec], ...]]
    etag: str | None

    @property
    def row_key(self) -> str:
        raise NotImplementedError

    @classmethod
    def from_entity(cls: type[R], entity: Mapping[str, Any]) -> R:
        values = {attr: codec.load(entity.get(prop)) for attr, prop, codec in cls.PROPS}
        return cls(**values, etag=entity.get(ETAG))  # type: ignore[call-arg]

    def to_entity(self) -> Entity:
        out: Entity = {"RowKey": self.row_key}
        for attr, prop, codec in self.PROPS:
            value = getattr(self, attr)
            if value is not None:
                out[prop] = codec.dump(value)
        return out

    def create(self) -> Op:
        """Write this row as new (409 if it exists)."""
        return Op("create", self.to_entity())

    def replacing(self, old: Row) -> Op:
        """Write this row over ``old``, only if ``old`` is what the store still has (ETag)."""
        return Op("replace", self.to_entity(), etag=old.etag)


def _props(cls: type, names: Mapping[str, tuple[str, Codec]]) -> tuple[tuple[str, str, Codec], ...]:
    declared = {f.name for f in fields(cls)} - {"etag", "legacy"}  # legacy: where a SearchRow was read, not a property
    assert declared == set(names), f"{cls.__name__}: {declared ^ set(names)}"
    return tuple((attr, prop, codec) for attr, (prop, codec) in names.items())


@dataclass(frozen=True, slots=True)
class OrderRow(Row):
    """The accepted order (RowKey ``order``). Written once, never updated."""

    customer_id: str
    currency: str
    items: list[dict[str, Any]]
    total: str  # a decimal string
    priority: str
    created_at: datetime
    status_queue: str | None = None
    body_hash: str | None = None
    idempotency_key: str | None = None
    traceparent: str | None = None
    workflow: str = DEFAULT_WORKFLOW  # the workflow the order runs to the end, and its version
    workflow_version: int = LEGACY_VERSION
    etag: str | None = None

    @property
    def row_key(self) -> str:
        return ORDER_ROW

    def payload(self) -> dict[str, Any]:
        """The order as agents receive it."""
        return {"customerId": self.customer_id, "currency": self.currency, "total": self.total,
                "items": self.items}


OrderRow.PROPS = _props(OrderRow, {
    "customer_id": ("CustomerId", TEXT), "currency": ("Currency", TEXT), "items": ("Items", JSON),
    "total": ("Total", TEXT), "priority": ("Priority", TEXT), "created_at": ("CreatedAt", TIME),
    "status_queue": ("StatusQueue", TEXT), "body_hash": ("BodyHash", TEXT),
    "idempotency_key": ("IdempotencyKey", TEXT), "traceparent": ("Traceparent", TEXT),
    "workflow": ("Workflow", WORKFLOW_NAME), "workflow_version": ("WorkflowVersion", WORKFLOW_VERSION),
})


@dataclass(frozen=True, slots=True)
class StateRow(Row):
    """The order-level state (RowKey ``state``): what the Scheduler and Supervisor move."""

    order_id: str
    process_state: ProcessState
    mode: Mode
    lease: Lease | None = None  # what is in flight (None: nothing)
    locked_by: str | None = None  # the claim: the instance that dispatched what is in flight
    claim_token: str | None = None
    complete_by: datetime | None = None  # the deadline of what is in flight
    outcome: Outcome | None = None
    failure_count: int = 0
    step_index: int = 0
    step_name: str | None = None
    attempt: int = 0
    comp_index: int = -1
    comp_failure_count: int = 0
    schedule_seq: int = 0  # the last schedule message sent
    claimed_seq: int = 0  # the schedule message the claim was made on
    failed_step: str | None = None
    reason: str | None = None
    compensation_state: OrderCompensation | None = None
    index_due: datetime | None = None  # the deadline index row the order's own writes put
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    retried_at: datetime | None = None
    cancelled_at: datetime | None = None
    terminated_at: datetime | None = None
    event_seq: int = 0  # the last history event written (``history-{seq}``)
    generation: int = 0  # a retry of a failed, compensated order runs again as the next generation
    # What is in flight waits on this remote's open breaker (as its step row says): for the search,
    # which reads only state rows. Set by the decision that records a wait, cleared by every other.
    waiting_on: str | None = None
    # An operator suspended the order: while it runs its steps, it dispatches no new one
    # (``shared.core.statemachine.suspend``); a retry or restart runs it unsuspended.
    suspended: bool = False
    operations: str | None = None  # the bulk operations that acted on it, newest last (``shared.core.operations``)
    etag: str | None = None

    @property
    def row_key(self) -> str:
        return STATE_ROW

    @property
    def claimed(self) -> bool:
        return bool(self.locked_by)

    @property
    def waiting_for_claim(self) -> bool:
        return self.lease is not None and self.lease.is_unclaimed and not self.locked_by


StateRow.PROPS = _props(StateRow, {
    "order_id": ("OrderID", TEXT), "process_state": ("ProcessState", _enum(ProcessState)),
    "mode": ("Mode", _enum(Mode)), "lease": ("LeaseKey", LEASE), "locked_by": ("LockedBy", TEXT),
    "claim_token": ("ClaimToken", TEXT), "complete_by": ("CompleteBy", TIME), "outcome": ("Outcome", _enum(Outcome)),
    "failure_count": ("FailureCount", INT), "step_index": ("StepIndex", INT), "step_name": ("StepName", TEXT),
    "attempt": ("Attempt", INT), "comp_index": ("CompIndex", Codec(lambda v: -1 if v is None else int(v), int)),
    "comp_failure_count": ("CompFailureCount", INT), "schedule_seq": ("ScheduleSeq", INT),
    "claimed_seq": ("ClaimedSeq", INT), "failed_step": ("FailedStep", TEXT), "reason": ("Reason", TEXT),
    "compensation_state": ("CompensationState", _enum(OrderCompensation)), "index_due": ("IndexDue", TIME),
    "created_at": ("CreatedAt", TIME), "updated_at": ("UpdatedAt", TIME), "finished_at": ("FinishedAt", TIME),
    "retried_at": ("RetriedAt", TIME), "cancelled_at": ("CancelledAt", TIME),
    "terminated_at": ("TerminatedAt", TIME), "event_seq": ("EventSeq", INT), "generation": ("Generation", INT),
    "waiting_on": ("WaitingOn", TEXT), "suspended": ("Suspended", FLAG), "operations": ("Operations", TEXT),
})


@dataclass(frozen=True, slots=True)
class StepRow(Row):
    """One workflow step of the order (RowKey ``step-NN-NAME``), with its compensation."""

    name: str
    index: int
    state: StepState = StepState.PENDING
    attempt: int = 0
    complete_by: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: Any = None
    failure_reason: str | None = None
    # The last attempt ended with no answer (timed out): the remote may have applied it.
    outcome_unknown: bool = False
    compensation: CompensationState = CompensationState.NONE
    compensation_attempt: int = 0
    compensation_complete_by: datetime | None = None
    compensation_started_at: datetime | None = None
    compensation_finished_at: datetime | None = None
    compensation_result: Any = None
    compensation_reason: str | None = None
    # The attempt in flight waits on this remote's open breaker (a ``waiting`` reply) since ``waiting_since``
    # (its first wait, kept until the next attempt: the longest wait counts from it), on its opening
    # ``waiting_opening`` (kept too: after a close ends the wait, a waiting reply of it is stale).
    waiting_on: str | None = None
    waiting_since: datetime | None = None
    waiting_opening: int | None = None
    # A wait step's event (``shared.core.statemachine.events``): its body, when it arrived (kept
    # if it came before the step started) and what makes a copy of it a copy (its Idempotency-Key,
    # else the body's hash).
    event_body: Any = None
    event_at: datetime | None = None
    event_key: str | None = None
    etag: str | None = None

    @property
    def row_key(self) -> str:
        return step_row_key(self.index, self.name)


StepRow.PROPS = _props(StepRow, {
    "name": ("Name", TEXT), "index": ("Index", INT), "state": ("State", _enum(StepState, StepState.PENDING)),
    "attempt": ("Attempt", INT), "complete_by": ("CompleteBy", TIME), "started_at": ("StartedAt", TIME),
    "finished_at": ("FinishedAt", TIME), "result": ("Result", JSON), "failure_reason": ("FailureReason", TEXT),
    "outcome_unknown": ("OutcomeUnknown", FLAG),
    "compensation": ("Compensation", _enum(CompensationState, CompensationState.NONE)),
    "compensation_attempt": ("CompensationAttempt", INT),
    "compensation_complete_by": ("CompensationCompleteBy", TIME),
    "compensation_started_at": ("CompensationStartedAt", TIME),
    "compensation_finished_at": ("CompensationFinishedAt", TIME),
    "compensation_result": ("CompensationResult", JSON), "compensation_reason": ("CompensationReason", TEXT),
    "waiting_on": ("WaitingOn", TEXT), "waiting_since": ("WaitingSince", TIME),
    "waiting_opening": ("WaitingOpening", OPTIONAL_INT),
    "event_body": ("EventBody", JSON), "event_at": ("EventAt", TIME), "event_key": ("EventKey", TEXT),
})


@dataclass(frozen=True, slots=True)
class EventRow(Row):
    """One immutable history event of the order (RowKey ``history-NNNNNNNN``), written in the
    same transaction as the state change it records."""

    seq: int
    at: datetime
    event: str
    step: str | None = None
    attempt: int | None = None
    detail: dict[str, Any] | None = None
    instance: str | None = None
    trace_id: str | None = None
    etag: str | None = None

    @property
    def row_key(self) -> str:
        return history_row_key(self.seq)

    def to_json(self) -> dict[str, Any]:
        """The event as ``GET /api/orders/{id}`` shows it (absent fields omitted)."""
        out: dict[str, Any] = {"seq": self.seq, "at": iso(self.at), "event": self.event, "step": self.step,
                               "attempt": self.attempt, "detail": self.detail, "instance": self.instance,
                               "traceId": self.trace_id}
        return present(out)


EventRow.PROPS = _props(EventRow, {
    "seq": ("Seq", INT), "at": ("At", TIME), "event": ("Event", TEXT), "step": ("Step", TEXT),
    "attempt": ("Attempt", OPTIONAL_INT), "detail": ("Detail", JSON),
    "instance": ("Instance", TEXT), "trace_id": ("TraceId", TEXT),
})


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


SearchRow.PROPS = _props(SearchRow, {
    "key": ("RowKey", TEXT), "order_id": ("OrderId", TEXT),
    "category": ("Category", _enum(Category, Category.IN_FLIGHT)), "customer_id": ("CustomerId", TEXT),
    "created_at": ("CreatedAt", TIME), "process_state": ("ProcessState", _enum(ProcessState)),
    "failure_count": ("FailureCount", OPTIONAL_INT), "priority": ("Priority", TEXT), "updated_at": ("UpdatedAt", TIME),
    "outcome": ("Outcome", _enum(Outcome)), "rev": ("Rev", TEXT), "customer_key": ("CustomerKey", TEXT),
    "workflow": ("Workflow", TEXT), "failed_step": ("FailedStep", TEXT), "total": ("Total", TEXT),
    "currency": ("Currency", TEXT),
})
