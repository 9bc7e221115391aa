"""The rows of an order's partition (StateTable, PartitionKey = the order id): the order, its
state, its steps and its history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core.jsonio import present
from shared.core.lease import Lease
from shared.core.rows.base import (
    FLAG,
    INT,
    JSON,
    LEASE,
    OPTIONAL_INT,
    ORDER_ROW,
    STATE_ROW,
    TEXT,
    TIME,
    WORKFLOW_NAME,
    WORKFLOW_VERSION,
    Codec,
    Row,
    _enum,
    history_row_key,
    props_of,
    step_row_key,
)
from shared.core.states import CompensationState, Mode, OrderCompensation, Outcome, ProcessState, StepState
from shared.core.times import iso
from shared.core.workflows import DEFAULT_WORKFLOW, LEGACY_VERSION


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


OrderRow.PROPS = props_of(OrderRow, {
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
    # The customer's room it entered (``shared.core.room``; None: submitted with no cap), and whether
    # it waits there for a slot (Pending, unclaimed, no deadline) rather than holding one.
    room: str | None = None
    waiting_room: bool = False
    etag: str | None = None

    @property
    def row_key(self) -> str:
        return STATE_ROW

    @property
    def waits_for_room(self) -> bool:
        """Accepted, waiting for a slot in its customer's room (no step dispatched yet)."""
        return self.waiting_room and self.mode is Mode.FORWARD and self.process_state is ProcessState.PENDING

    @property
    def claimed(self) -> bool:
        return bool(self.locked_by)

    @property
    def waiting_for_claim(self) -> bool:
        return self.lease is not None and self.lease.is_unclaimed and not self.locked_by


StateRow.PROPS = props_of(StateRow, {
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
    "room": ("Room", TEXT), "waiting_room": ("WaitingRoom", FLAG),
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
    # A rate limit's wait (``shared.core.ratelimit``): the wake-up the scheduler owes the waiting attempt
    # (its reply's ``until``), which the Supervisor sends again once overdue; cleared when the wait ends.
    wake_at: datetime | None = None
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


StepRow.PROPS = props_of(StepRow, {
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
    "waiting_opening": ("WaitingOpening", OPTIONAL_INT), "wake_at": ("WakeAt", TIME),
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


EventRow.PROPS = props_of(EventRow, {
    "seq": ("Seq", INT), "at": ("At", TIME), "event": ("Event", TEXT), "step": ("Step", TEXT),
    "attempt": ("Attempt", OPTIONAL_INT), "detail": ("Detail", JSON),
    "instance": ("Instance", TEXT), "trace_id": ("TraceId", TEXT),
})
