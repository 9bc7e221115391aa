"""The order state machine, as pure functions: (rows of one order, event, now) -> effects.

Nothing here does I/O. Each ``decide_*`` function reads the order's rows (a ``View`` of its
partition, ETags included) and returns a :class:`Decision`: a verdict (for logs and tests)
and the ordered effects to run (``shared.effects``). Every state write is an ETag-conditioned
transaction; every index row is written before the state write that creates the deadline it
guards. Next to each effect, a comment names the crash point it is safe against: what a crash
right AFTER that effect leaves, and who completes it.

States (state row):

=============  =========  ==========  =====================================================
ProcessState   Mode       LeaseKey    meaning
=============  =========  ==========  =====================================================
Pending        forward    unclaimed   redriven or retried; waits for a scheduler claim
Processing     forward    STEP:N      step dispatched (attempt N), claim held (LockedBy); a new
                                      order starts here (the submission's transaction claims it)
Processed      finished   ''          all steps done
Error          held       ''          a step failed for good, ``hold`` policy: operator
Error          compensate unclaimed   compensation to dispatch (after supervisor/cancel)
Error          compensate STEP:compensate:N   compensation in flight, claim held
Error          finished   ''          failed or cancelled; compensations done (or failed)
=============  =========  ==========  =====================================================

Transitions: submission (created claimed, first request sent), claim (schedule message), step
reply (success -> next step or Processed; error -> on-failure policy), compensation reply,
supervisor expiry (redrive with FailureCount+1, or Error at MaxFailureCount), unclaimed
re-schedule (lost send), operator retry/cancel.

The deadline index (the Supervisor's way to find overdue steps without reading history):
about one row per order in flight, ``Due`` never later than the order's ``CompleteBy``. Two
rules make one row enough, with no index write on the forward path:

* every write that sets a ``CompleteBy`` at time t sets it at least ``floor`` later, where
  ``floor = min(every step timeout, UnclaimedGraceSeconds)`` (``Config.index_floor``);
* every index row put at time t is due at most ``floor`` later (``_cover``).

So a row that exists covers every deadline the order will ever get: a claim, a next step, a
compensation or a redrive sets ``CompleteBy >= now + floor >= Due``. The submission puts the
order's row before its transaction; the last transition (Processed, held, finished) deletes
it, best effort (the state row's ``IndexDue`` names it). When a row falls due and the order
is merely slower than that (``CompleteBy`` still ahead), the sweep moves it: a new row at
``min(CompleteBy, now + floor)``, then the old one deleted. When the deadline has passed, the
Supervisor acts and covers the new deadline the same way. An order whose rows were all
deleted (held, finished) and that an operator retries or cancels gets a new row first.

Fencing: a reply is applied only if the state row's LeaseKey is exactly its step and
attempt, the claim is held (LockedBy) and the step row agrees. The ETag condition on the
transaction serialises it against a concurrent supervisor/scheduler: whichever writes first
wins and the other loses its race. A reply for a step already recorded Done/Failed with the
same attempt is a duplicate: it changes nothing, but re-emits the request currently in
flight (same message_id, so duplicate detection drops it if the first send got through).
That is how a crash between a state write and the following send is resumed.

Unknown outcomes: a step that failed by timeout (no answer; the Supervisor redrove it or gave
up at MaxFailureCount) may have had its effect applied: the reply was lost or the agent hung
after the call. Its step row says ``OutcomeUnknown``. Under ``compensate`` it is compensated
first (it is the latest effect), then the Done steps in reverse order; an operator cancel
does the same. Its compensation request carries no result in ``context``: it names the effect
by the step's idempotency key (``compensates``), and a remote that applied nothing under that
key tombstones it, so a late original request is refused. An error reply is definitive (the
remote applied nothing under the key): the failed step is not compensated.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shared.effects import (
    Alert,
    DeleteIndex,
    Effect,
    Log,
    PutIndex,
    Send,
    Transact,
    bucket_of,
    index_row_key,
    iso,
    parse_iso,
)
from shared.logs import child_traceparent
from shared.messaging import OutMessage
from shared.models import ReplyMessage, dumps, loads
from shared.store import ETAG, ORDER_ROW, STATE_ROW, Op, step_row_key
from shared.workflow import AGENTS_BY_NAME, WORKFLOW, Step

UNCLAIMED = "unclaimed"
# A state row whose index row points nowhere (state row missing) is kept this long: the
# submission writes its index row just before its transaction.
ORPHAN_INDEX_AGE = timedelta(minutes=5)


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    queues: Mapping[str, str]  # queue setting name -> queue name
    workflow: tuple[Step, ...] = WORKFLOW
    max_failures: int = 3
    backoff_threshold: int = 1
    backoff_base_seconds: float = 5.0
    backoff_cap_seconds: float = 900.0
    grace_seconds: float = 30.0
    step_timeout_override: float | None = None

    @classmethod
    def from_settings(cls, settings: Any, workflow: tuple[Step, ...] = WORKFLOW) -> Config:
        from shared.settings import QUEUE_SETTINGS

        override = settings["StepTimeoutSeconds"].strip()
        return cls(
            queues={s.name: settings[s.name] for s in QUEUE_SETTINGS},
            workflow=workflow,
            max_failures=max(1, settings.int("MaxFailureCount")),
            backoff_threshold=settings.int("BackoffThreshold"),
            backoff_base_seconds=float(settings.decimal("BackoffBaseSeconds")),
            grace_seconds=float(settings.decimal("UnclaimedGraceSeconds")),
            step_timeout_override=float(override) if override else None,
        )

    def spec(self, name: str) -> Step:
        for s in self.workflow:
            if s.name == name:
                return s
        raise KeyError(f"step {name} is not in the workflow")

    def timeout(self, step: Step) -> timedelta:
        return timedelta(seconds=self.step_timeout_override or step.timeout_seconds)

    def index_floor(self) -> timedelta:
        """The shortest time from any write to the deadline it sets (module docstring)."""
        return min([self.timeout(s) for s in self.workflow] + [timedelta(seconds=self.grace_seconds)])

    def agent_queue(self, step: Step) -> str:
        return self.queues[AGENTS_BY_NAME[step.agent].queue_setting]

    def backoff(self, failure_count: int) -> timedelta:
        """Delay of the redrive notice: none up to the threshold, then base * 2^k, capped."""
        if failure_count <= self.backoff_threshold:
            return timedelta(0)
        k = failure_count - self.backoff_threshold - 1
        return timedelta(seconds=min(self.backoff_cap_seconds, self.backoff_base_seconds * (2 ** k)))


@dataclass(frozen=True)
class Ctx:
    now: datetime
    config: Config
    instance_id: str = "local"
    token: str = "0"  # a fresh claim token per event


@dataclass
class Decision:
    verdict: str
    effects: list[Effect] = field(default_factory=list)

    @property
    def writes(self) -> list[Effect]:
        return [e for e in self.effects if isinstance(e, (Transact, PutIndex))]


class Rejected(Exception):
    """An operator action on an order in the wrong state (HTTP 409)."""


# ---------------------------------------------------------------------------------------------
class View:
    """One order's partition, read in one query."""

    def __init__(self, rows: Mapping[str, dict[str, Any]]) -> None:
        self.rows = dict(rows)
        self.order = self.rows.get(ORDER_ROW)
        self.state = self.rows.get(STATE_ROW)
        self.steps = sorted((r for k, r in self.rows.items() if k.startswith("step-")), key=lambda r: r["Index"])

    @property
    def order_id(self) -> str:
        assert self.state is not None
        return str(self.state["OrderID"])

    @property
    def traceparent(self) -> str | None:
        return (self.order or {}).get("Traceparent")

    def step(self, name: str) -> dict[str, Any] | None:
        for s in self.steps:
            if s["Name"] == name:
                return s
        return None

    def step_at(self, index: int) -> dict[str, Any] | None:
        for s in self.steps:
            if s["Index"] == index:
                return s
        return None

    def after(self, index: int) -> dict[str, Any] | None:
        later = [s for s in self.steps if s["Index"] > index]
        return later[0] if later else None

    def with_rows(self, *rows: dict[str, Any]) -> View:
        merged = dict(self.rows)
        for r in rows:
            merged[r["RowKey"]] = r
        return View(merged)


def _upd(row: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in (ETAG, "PartitionKey", "Timestamp")}
    out.update(changes)
    return out


def _replace(old: dict[str, Any], new: dict[str, Any]) -> Op:
    return Op("replace", new, etag=old[ETAG])


def forward_lease(step: str, attempt: int) -> str:
    return f"{step}:{attempt}"


def compensation_lease(step: str, attempt: int) -> str:
    return f"{step}:compensate:{attempt}"


def parse_lease(lease: str) -> tuple[str, str, int] | None:
    """'STEP:N' -> ('step', STEP, N); 'STEP:compensate:N' -> ('compensation', STEP, N)."""
    parts = lease.split(":")
    try:
        if len(parts) == 3 and parts[1] == "compensate":
            return "compensation", parts[0], int(parts[2])
        if len(parts) == 2:
            return "step", parts[0], int(parts[1])
    except ValueError:
        return None
    return None


def _cover(order_id: str, complete_by: datetime, ctx: Ctx, note: str) -> PutIndex:
    """The index row that covers ``complete_by`` and every later deadline of the order."""
    return PutIndex(order_id, min(complete_by, ctx.now + ctx.config.index_floor()), note=note)


def _drop_index(st: dict[str, Any]) -> list[Effect]:
    """Best-effort delete of the order's index row (the one named by ``IndexDue``), when the
    order has no deadline left. A row the sweep moved meanwhile is deleted by the sweep."""
    due = parse_iso(st.get("IndexDue"))
    if due is None:
        return []
    return [DeleteIndex(bucket_of(due), index_row_key(str(st["OrderID"]), due))]


# ---------------------------------------------------------------------------------------------
# Messages


def _order_payload(order: dict[str, Any]) -> dict[str, Any]:
    return {"customerId": order["CustomerId"], "currency": order["Currency"], "total": order["Total"],
            "items": loads(order["Items"])}


def _result(row: dict[str, Any], key: str = "Result") -> Any:
    raw = row.get(key)
    return loads(raw) if raw else None


def request_message(v: View, step_row: dict[str, Any], kind: str, attempt: int, complete_by: datetime,
                    ctx: Ctx) -> OutMessage:
    cfg = ctx.config
    spec = cfg.spec(step_row["Name"])
    oid, name = v.order_id, spec.name
    if kind == "step":
        operation = spec.operation
        idem = f"{oid}:{name}"
        message_id = f"{oid}:{name}:{attempt}"
        context = {s["Name"]: _result(s) for s in v.steps if s["Index"] < step_row["Index"] and s["State"] == "Done"}
    else:
        assert spec.compensation is not None
        operation = spec.compensation
        idem = f"{oid}:{name}:compensate"
        message_id = f"{oid}:{name}:compensate:{attempt}"
        result = _result(step_row)
        # The step's result when it has one (a Done step); a step whose outcome is unknown
        # (timed out) has none: the remote finds the effect by the step's idempotency key.
        context = {name: result} if result is not None else {}
    assert v.order is not None
    body = {"kind": kind, "orderId": oid, "step": name, "operation": operation, "attempt": attempt,
            "idempotencyKey": idem, "completeBy": iso(complete_by), "order": _order_payload(v.order),
            "context": context}
    if kind != "step":
        # The effect to undo, addressed by the stable idempotency key every attempt of the step
        # was sent with. A remote with nothing applied under it answers "nothing to undo" and
        # tombstones the key, so a late original call with it is refused (docs/contracts.md).
        body["compensates"] = {"step": name, "idempotencyKey": f"{oid}:{name}"}
    ttl = max(complete_by - ctx.now, timedelta(seconds=1))
    return OutMessage(queue=cfg.agent_queue(spec), body=body, message_id=message_id, correlation_id=message_id,
                      reply_to=cfg.queues["RepliesQueue"], subject=kind, time_to_live=ttl,
                      application_properties={"traceparent": child_traceparent(v.traceparent), "kind": kind})


def schedule_message(order_id: str, seq: int, ctx: Ctx, traceparent: str | None,
                     not_before: datetime | None = None) -> OutMessage:
    mid = f"{order_id}:schedule:{seq}"
    return OutMessage(queue=ctx.config.queues["SchedulerQueue"],
                      body={"kind": "schedule", "orderId": order_id, "seq": seq},
                      message_id=mid, correlation_id=order_id, subject="schedule",
                      scheduled_enqueue_time=not_before if not_before and not_before > ctx.now else None,
                      application_properties={"traceparent": child_traceparent(traceparent), "kind": "schedule"})


def status_sends(v: View, event: str, ctx: Ctx, *, step: str | None = None, **extra: Any) -> list[Effect]:
    """Status messages go to the order's statusQueue, else the StatusQueue setting (if set).
    Never critical: a missing or failing status queue must not break processing."""
    queue = (v.order or {}).get("StatusQueue") or ctx.config.queues.get("StatusQueue")
    if not queue or v.state is None:
        return []
    oid = v.order_id
    body: dict[str, Any] = {"kind": "status", "orderId": oid, "event": event, "at": iso(ctx.now)}
    if step:
        body["step"] = step
    body.update({k: val for k, val in extra.items() if val is not None})
    mid = f"{oid}:status:{event}" + (f":{step}" if step else "")
    msg = OutMessage(queue=queue, body=body, message_id=mid, correlation_id=oid, subject="status",
                     application_properties={"traceparent": child_traceparent(v.traceparent), "kind": "status"})
    return [Send(msg, critical=False, what=f"status {event}")]


def alert_effect(v: View, step: str | None, reason: str, failure_count: int, key: str, ctx: Ctx) -> Alert:
    oid = v.order_id
    body = {"kind": "alert", "orderId": oid, "step": step, "reason": reason, "failureCount": failure_count,
            "at": iso(ctx.now)}
    msg = OutMessage(queue=ctx.config.queues["AlertsQueue"], body=body, message_id=f"{oid}:alert:{key}",
                     correlation_id=oid, subject="alert",
                     application_properties={"traceparent": child_traceparent(v.traceparent), "kind": "alert"})
    return Alert(msg, oid, step, reason, failure_count, v.traceparent)


def _log(level: int, event: str, v: View | None, **fields: Any) -> Log:
    oid = v.order_id if v is not None and v.state is not None else fields.pop("order_id", None)
    return Log(level, event, oid, v.traceparent if v is not None else None, fields)


# ---------------------------------------------------------------------------------------------
# Dispatch helpers (they return the rows to write, the index effect and the send)


def _dispatch_step(step_row: dict[str, Any], ctx: Ctx) -> tuple[dict[str, Any], dict[str, Any], datetime, str]:
    """Rows for 'step_row becomes Running with the next attempt'; state changes are returned too."""
    attempt = int(step_row.get("Attempt") or 0) + 1
    cb = ctx.now + ctx.config.timeout(ctx.config.spec(step_row["Name"]))
    lease = forward_lease(step_row["Name"], attempt)
    row = _upd(step_row, State="Running", Attempt=attempt, CompleteBy=iso(cb), StartedAt=iso(ctx.now),
               FinishedAt=None)
    state_changes = {"StepIndex": step_row["Index"], "StepName": step_row["Name"], "Attempt": attempt,
                     "CompleteBy": iso(cb), "LeaseKey": lease, "UpdatedAt": iso(ctx.now)}
    return row, state_changes, cb, lease


def _dispatch_compensation(step_row: dict[str, Any], ctx: Ctx) -> tuple[dict[str, Any], dict[str, Any], datetime, str]:
    attempt = int(step_row.get("CompensationAttempt") or 0) + 1
    cb = ctx.now + ctx.config.timeout(ctx.config.spec(step_row["Name"]))
    lease = compensation_lease(step_row["Name"], attempt)
    row = _upd(step_row, Compensation="Running", CompensationAttempt=attempt, CompensationCompleteBy=iso(cb),
               CompensationStartedAt=iso(ctx.now), CompensationFinishedAt=None)
    state_changes = {"CompIndex": step_row["Index"], "CompleteBy": iso(cb), "LeaseKey": lease,
                     "UpdatedAt": iso(ctx.now)}
    return row, state_changes, cb, lease


def _outcome_unknown(row: dict[str, Any], ctx: Ctx) -> bool:
    """A step not Done whose last attempt ended without an answer (timed out): the remote may
    have applied its effect. It is compensated too (by its idempotency key), if it has a
    compensation. An error reply settles it (``OutcomeUnknown`` false): the remote rejected
    the key and applied nothing under it."""
    return (row["State"] != "Done" and bool(row.get("OutcomeUnknown"))
            and bool(ctx.config.spec(row["Name"]).compensation))


def _to_compensate(v: View, ctx: Ctx) -> list[dict[str, Any]]:
    """Every step to compensate, in reverse (compensation) order: the Done steps with a
    compensation, and a step whose outcome is unknown (the latest one: it comes first)."""
    out = [s for s in v.steps if (s["State"] == "Done" and ctx.config.spec(s["Name"]).compensation)
           or _outcome_unknown(s, ctx)]
    return sorted(out, key=lambda s: s["Index"], reverse=True)


def inflight_request(v: View, ctx: Ctx) -> Send | None:
    """The request the state row says is in flight (to re-send after a crash), if still live."""
    st = v.state
    if st is None or not st.get("LockedBy"):
        return None
    parsed = parse_lease(st.get("LeaseKey") or "")
    cb = parse_iso(st.get("CompleteBy"))
    if parsed is None or cb is None or cb <= ctx.now:
        return None
    kind, name, attempt = parsed
    row = v.step(name)
    if row is None:
        return None
    if kind == "step" and row["State"] == "Running" and row.get("Attempt") == attempt:
        return Send(request_message(v, row, "step", attempt, cb, ctx), what="request (resume)")
    if kind == "compensation" and row.get("Compensation") == "Running" and row.get("CompensationAttempt") == attempt:
        return Send(request_message(v, row, "compensation", attempt, cb, ctx), what="compensation (resume)")
    return None


# ---------------------------------------------------------------------------------------------
# Submission


def plan_submission(order_id: str, canonical: dict[str, Any], *, total: str, body_hash: str,
                    idempotency_key: str | None, traceparent: str, ctx: Ctx) -> list[Effect]:
    """The submission: the order, its state and step rows in ONE transaction, and the
    Scheduler told in-process: that transaction is also the Scheduler's first claim (the
    state row is written claimed, the first step Running, attempt 1), and the first request
    is sent right after it. The scheduler queue carries what needs a claim later (redrives,
    compensations, operator actions); the order's start needs no message of its own."""
    now = ctx.now
    order_row = {"RowKey": ORDER_ROW, "CustomerId": canonical["customerId"], "Currency": canonical["currency"],
                 "Items": dumps(canonical["items"]), "Total": total, "Priority": canonical["priority"],
                 "StatusQueue": canonical["statusQueue"], "BodyHash": body_hash, "IdempotencyKey": idempotency_key,
                 "Traceparent": traceparent, "CreatedAt": iso(now)}
    pending = [{"RowKey": step_row_key(i, s.name), "Name": s.name, "Index": i, "State": "Pending", "Attempt": 0,
                "Compensation": ""} for i, s in enumerate(ctx.config.workflow)]
    first, changes, cb, lease = _dispatch_step(pending[0], ctx)
    step_rows = [first, *pending[1:]]
    index = _cover(order_id, cb, ctx, note="order deadline")
    state_row = {"RowKey": STATE_ROW, "OrderID": order_id, "ProcessState": "Processing", "Mode": "forward",
                 "LockedBy": ctx.instance_id, "ClaimToken": ctx.token, "FailureCount": 0, "CompIndex": -1,
                 "CompFailureCount": 0, "ScheduleSeq": 0, "ClaimedSeq": 0, "IndexDue": iso(index.due),
                 "CreatedAt": iso(now), **changes}
    view = View({r["RowKey"]: r for r in (order_row, state_row, *step_rows)})
    return [
        # Crash after this: no order row exists; the sweep finds no state row and deletes
        # the index row once it is ORPHAN_INDEX_AGE old. The client saw no 202 and retries.
        index,
        # The ONE write of the submission (order + state + step rows, one transaction), the
        # first step claimed. A second submission with the same id conflicts here (replay).
        # Crash after this (request not sent): the client's retry replays and re-sends it
        # (same message id: deduplicated); without a retry the Supervisor finds the step
        # overdue at CompleteBy and redrives it (FailureCount+1), like any lost request.
        Transact(order_id, tuple(Op("create", r) for r in (order_row, state_row, *step_rows)),
                 note="submission + first claim"),
        Send(request_message(view, first, "step", 1, cb, ctx), critical=False, what="request"),
        *status_sends(view, "received", ctx, processState="Processing"),
        _log(logging.INFO, "order.claimed", view, step=first["Name"], lease=lease, completeBy=iso(cb)),
    ]


# ---------------------------------------------------------------------------------------------
# Scheduler: claim on a schedule message


def decide_schedule(v: View, seq: int, ctx: Ctx) -> Decision:
    st = v.state
    if st is None or v.order is None:
        return Decision("unknown-order", [Log(logging.ERROR, "schedule.unknown_order", None, None, {})])
    if st.get("LeaseKey") == UNCLAIMED and not st.get("LockedBy"):
        return _claim(v, seq, ctx)
    if st.get("LockedBy") and st.get("ClaimedSeq") == seq:
        # The same schedule message again (redelivered after a crash between the claim and
        # the request send): re-send the in-flight request. Same message_id: deduplicated.
        resend = inflight_request(v, ctx)
        if resend is not None:
            return Decision("resumed", [resend, _log(logging.INFO, "schedule.resumed", v, seq=seq)])
    return Decision("ignored", [_log(logging.INFO, "schedule.ignored", v, seq=seq,
                                     processState=st.get("ProcessState"), lease=st.get("LeaseKey"))])


def _claim(v: View, seq: int, ctx: Ctx) -> Decision:
    st = v.state
    assert st is not None
    mode = st.get("Mode")
    claim = {"LockedBy": ctx.instance_id, "ClaimToken": ctx.token, "ClaimedSeq": seq}
    if mode == "forward":
        row = v.step_at(int(st["StepIndex"]))
        if row is None or row["State"] == "Done":
            return Decision("inconsistent", [_log(logging.ERROR, "schedule.inconsistent", v, seq=seq)])
        new_row, changes, cb, lease = _dispatch_step(row, ctx)
        new_state = _upd(st, ProcessState="Processing", **claim, **changes)
        send = Send(request_message(v.with_rows(new_row), new_row, "step", new_row["Attempt"], cb, ctx),
                    what="request")
    elif mode == "compensate":
        row = v.step_at(int(st.get("CompIndex", -1)))
        if row is None or row.get("Compensation") not in ("Pending", "Running"):
            return Decision("inconsistent", [_log(logging.ERROR, "schedule.inconsistent", v, seq=seq)])
        new_row, changes, cb, lease = _dispatch_compensation(row, ctx)
        new_state = _upd(st, **claim, **changes)  # ProcessState stays Error while compensating
        send = Send(request_message(v, new_row, "compensation", new_row["CompensationAttempt"], cb, ctx),
                    what="compensation")
    else:
        return Decision("ignored", [_log(logging.INFO, "schedule.ignored", v, seq=seq, mode=mode)])
    return Decision("claimed", [
        # No index write: the order's row covers this deadline (>= now + floor).
        # The claim: LockedBy/CompleteBy/Processing + step Running (attempt n) in ONE transaction.
        # Lost ETag race -> another instance owns the order: nothing after this runs.
        # Crash after this (request not sent): a redelivered schedule message (seq == ClaimedSeq)
        # re-sends it; otherwise the Supervisor expires the lease at CompleteBy and redrives.
        Transact(v.order_id, (_replace(st, new_state), _replace(row, new_row)), note="claim"),
        send,
        _log(logging.INFO, "order.claimed", v, step=new_row["Name"], lease=lease, completeBy=iso(cb)),
    ])


# ---------------------------------------------------------------------------------------------
# Scheduler: replies


def decide_reply(v: View, reply: ReplyMessage, ctx: Ctx) -> Decision:
    st = v.state
    if st is None or v.order is None:
        return Decision("poison", [Log(logging.ERROR, "reply.unknown_order", reply.orderId, None,
                                       {"step": reply.step, "attempt": reply.attempt})])
    row = v.step(reply.step)
    if row is None:
        return Decision("poison", [_log(logging.ERROR, "reply.unknown_step", v, step=reply.step)])
    if reply.kind == "step":
        return _forward_reply(v, row, reply, ctx)
    return _compensation_reply(v, row, reply, ctx)


def _forward_reply(v: View, row: dict[str, Any], reply: ReplyMessage, ctx: Ctx) -> Decision:
    st = v.state
    assert st is not None
    live = (st.get("Mode") == "forward" and bool(st.get("LockedBy"))
            and st.get("LeaseKey") == forward_lease(reply.step, reply.attempt)
            and row["State"] == "Running" and row.get("Attempt") == reply.attempt)
    if live:
        if reply.outcome == "success":
            return _step_done(v, row, reply.result or {}, ctx)
        reason = reply.reason or "rejected"
        # An error reply: the remote rejected the key and applied nothing under it.
        return _fail_step(v, row, reason, ctx, state_changes={}, direct=True, unknown=False)
    if row.get("Attempt") == reply.attempt and row["State"] in ("Done", "Failed"):
        effects: list[Effect] = [_log(logging.INFO, "reply.duplicate", v, step=reply.step, attempt=reply.attempt)]
        if row["State"] == "Failed":
            # the alert may have been lost in a crash: re-send it (same id: deduplicated)
            effects.append(alert_effect(v, row["Name"], row.get("FailureReason") or "failed",
                                        int(st.get("FailureCount") or 0), f"{row['Name']}:{reply.attempt}", ctx))
        resend = inflight_request(v, ctx)
        if resend is not None:
            effects.append(resend)
        return Decision("duplicate", effects)
    return Decision("stale", [_log(logging.WARNING, "reply.stale", v, step=reply.step, attempt=reply.attempt,
                                   currentAttempt=row.get("Attempt"), stepState=row["State"],
                                   lease=st.get("LeaseKey"))])


def _step_done(v: View, row: dict[str, Any], result: dict[str, Any], ctx: Ctx) -> Decision:
    st = v.state
    assert st is not None
    now = ctx.now
    done = _upd(row, State="Done", Result=dumps(result), FinishedAt=iso(now), CompleteBy=None)
    nxt = v.after(row["Index"])
    if nxt is not None:
        new_next, changes, cb, lease = _dispatch_step(nxt, ctx)
        new_state = _upd(st, **changes)  # the claim (LockedBy) carries on to the next step
        after = v.with_rows(done, new_next, new_state)
        return Decision("step-done", [
            # No index write: the order's row covers the next deadline (>= now + floor).
            # Step Done (+result) and next step Running and state, ONE transaction.
            # Crash after this: the redelivered reply is a duplicate of a Done step and
            # re-sends the next request (inflight_request); if the reply is not redelivered,
            # the Supervisor expires the next lease at CompleteBy and redrives.
            Transact(v.order_id, (_replace(st, new_state), _replace(row, done), _replace(nxt, new_next)),
                     note="step done + next dispatched"),
            Send(request_message(after, new_next, "step", new_next["Attempt"], cb, ctx), what="request"),
            *status_sends(v, "step-done", ctx, step=row["Name"]),
            _log(logging.INFO, "step.done", v, step=row["Name"], attempt=row.get("Attempt"), next=nxt["Name"]),
        ])
    new_state = _upd(st, ProcessState="Processed", Mode="finished", Outcome="processed", LockedBy=None,
                     ClaimToken=None, CompleteBy=None, LeaseKey="", UpdatedAt=iso(now), FinishedAt=iso(now))
    return Decision("processed", [
        # Crash after this: the order is Processed; status messages may be missing (best-effort);
        # its index row is deleted next (best effort), else lazily by the sweep.
        Transact(v.order_id, (_replace(st, new_state), _replace(row, done)), note="last step done"),
        *status_sends(v, "step-done", ctx, step=row["Name"]),
        *status_sends(v, "processed", ctx, processState="Processed"),
        _log(logging.INFO, "order.processed", v, step=row["Name"]),
        *_drop_index(st),
    ])


def _fail_step(v: View, row: dict[str, Any], reason: str, ctx: Ctx, *, state_changes: dict[str, Any],
               direct: bool, unknown: bool, outcome: str = "failed") -> Decision:
    """A step failed for good (error reply, or MaxFailureCount timeouts): apply its policy.

    ``direct``: the caller holds the claim (a reply) and dispatches the first compensation
    itself; otherwise (Supervisor) the compensation goes through the scheduler.
    ``unknown``: the step failed without an answer (timed out), so the remote may have applied
    its effect: under ``compensate`` it is compensated first (by its idempotency key), then
    the Done steps; under ``hold`` an operator cancel compensates it (``OutcomeUnknown``).
    An error reply is a definitive "nothing applied": the failed step is not compensated.
    An unknown outcome on a step that has NO compensation (the pivot: a shipment) cannot be
    undone, and compensating the steps before it could refund goods that left: such an order
    is held for an operator whatever the policy (retry replays the step's idempotency key and
    learns the outcome; cancel compensates the rest).
    """
    st = v.state
    assert st is not None
    cfg, now = ctx.config, ctx.now
    spec = cfg.spec(row["Name"])
    failed = _upd(row, State="Failed", FailureReason=reason, FinishedAt=iso(now), CompleteBy=None,
                  OutcomeUnknown=unknown)
    failure_count = int(state_changes.get("FailureCount", st.get("FailureCount") or 0))
    # Alert first, with a deterministic id: a crash or lost race after it leads to the same
    # alert again, which the alerts queue's duplicate detection drops.
    alert = alert_effect(v, row["Name"], reason, failure_count, f"{row['Name']}:{row.get('Attempt')}", ctx)
    base = _upd(st, **state_changes, ProcessState="Error", FailedStep=row["Name"], Reason=reason,
                UpdatedAt=iso(now))
    released = {"LockedBy": None, "ClaimToken": None}
    policy = "hold" if unknown and spec.compensation is None else spec.on_failure
    comps = _to_compensate(v.with_rows(failed), ctx) if policy == "compensate" else []
    tail: list[Effect] = [*status_sends(v, "failed", ctx, step=row["Name"], reason=reason, processState="Error")]
    if policy == "hold":
        new_state = _upd(base, Mode="held", Outcome="held", CompleteBy=None, LeaseKey="", **released)
        return Decision("held", [
            alert,
            # Crash after this: held in Error for an operator; nothing in flight.
            Transact(v.order_id, (_replace(st, new_state), _replace(row, failed)), note="step failed, held"),
            *tail,
            *_drop_index(st),
        ])
    if not comps:
        new_state = _upd(base, Mode="finished", Outcome=outcome, CompleteBy=None, LeaseKey="",
                         CompensationState="none", FinishedAt=iso(now), **released)
        return Decision("failed", [
            alert,
            # Crash after this: final state; only best-effort messages are missing.
            Transact(v.order_id, (_replace(st, new_state), _replace(row, failed)), note="step failed, final"),
            *tail,
            *_drop_index(st),
        ])
    # The rows to write: the failed step, and every step to compensate marked Pending (the
    # failed step itself among them when its outcome is unknown). One op per row.
    marks = {row["RowKey"]: failed, **{c["RowKey"]: _upd(c, Compensation="Pending") for c in comps}}
    first = comps[0]
    if direct:
        new_first, changes, cb, lease = _dispatch_compensation(marks[first["RowKey"]], ctx)
        marks[first["RowKey"]] = new_first
        new_state = _upd(base, Mode="compensate", Outcome=outcome, CompFailureCount=0,
                         CompensationState="running", **changes)
        ops = (_replace(st, new_state), *(_replace(v.rows[k], m) for k, m in marks.items()))
        return Decision("compensating", [
            alert,
            # No index write: the order's row covers the compensation's deadline.
            # Step Failed + compensations Pending + first compensation Running, ONE transaction.
            # Crash after this: the redelivered error reply is a duplicate and re-sends the
            # compensation request; else the Supervisor expires the compensation lease.
            Transact(v.order_id, ops, note="step failed, compensating"),
            Send(request_message(v.with_rows(new_first), new_first, "compensation",
                                 new_first["CompensationAttempt"], cb, ctx), what="compensation"),
            *tail,
        ])
    # The Supervisor (not direct): the index row it is handling ends; cover the new deadline.
    due = now + timedelta(seconds=cfg.grace_seconds)
    seq = int(st.get("ScheduleSeq") or 0) + 1
    cover = _cover(v.order_id, due, ctx, note="compensation unclaimed guard")
    new_state = _upd(base, Mode="compensate", Outcome=outcome, CompIndex=first["Index"], CompFailureCount=0,
                     CompensationState="running", CompleteBy=iso(due), LeaseKey=UNCLAIMED, ScheduleSeq=seq,
                     IndexDue=iso(cover.due), **released)
    ops = (_replace(st, new_state), *(_replace(v.rows[k], m) for k, m in marks.items()))
    return Decision("compensating", [
        alert,
        # Crash after this: state unchanged; the overdue row is still due: next sweep redoes it.
        cover,
        # Crash after this: compensation pending but no schedule message; the new row fires
        # by the grace period and the Supervisor sends it.
        Transact(v.order_id, ops, note="step failed, compensation scheduled"),
        Send(schedule_message(v.order_id, seq, ctx, v.traceparent), critical=False, what="schedule compensation"),
        *tail,
    ])


def _compensation_reply(v: View, row: dict[str, Any], reply: ReplyMessage, ctx: Ctx) -> Decision:
    st = v.state
    assert st is not None
    live = (st.get("Mode") == "compensate" and bool(st.get("LockedBy"))
            and st.get("LeaseKey") == compensation_lease(reply.step, reply.attempt)
            and row.get("Compensation") == "Running" and row.get("CompensationAttempt") == reply.attempt)
    if live:
        if reply.outcome == "success":
            done = _upd(row, Compensation="Done", CompensationResult=dumps(reply.result or {}),
                        CompensationFinishedAt=iso(ctx.now), CompensationCompleteBy=None)
            return _next_compensation(v, row, done, ctx, alert=None)
        reason = reply.reason or "rejected"
        failed = _upd(row, Compensation="Failed", CompensationReason=reason, CompensationFinishedAt=iso(ctx.now),
                      CompensationCompleteBy=None)
        alert = alert_effect(v, row["Name"], f"compensation failed: {reason}", int(st.get("FailureCount") or 0),
                             f"{row['Name']}:compensate:{reply.attempt}", ctx)
        return _next_compensation(v, row, failed, ctx, alert=alert)
    if row.get("CompensationAttempt") == reply.attempt and row.get("Compensation") in ("Done", "Failed"):
        effects: list[Effect] = [_log(logging.INFO, "reply.duplicate", v, step=reply.step, attempt=reply.attempt,
                                      kind="compensation")]
        resend = inflight_request(v, ctx)
        if resend is not None:
            effects.append(resend)
        return Decision("duplicate", effects)
    return Decision("stale", [_log(logging.WARNING, "reply.stale", v, step=reply.step, attempt=reply.attempt,
                                   kind="compensation", lease=st.get("LeaseKey"))])


def _next_compensation(v: View, row: dict[str, Any], updated: dict[str, Any], ctx: Ctx, *, alert: Alert | None,
                       direct: bool = True, state_changes: dict[str, Any] | None = None) -> Decision:
    """After a compensation ends (done/failed): dispatch the next one, or finish."""
    st = v.state
    assert st is not None
    now = ctx.now
    after = v.with_rows(updated)
    pending = sorted((s for s in after.steps if s.get("Compensation") == "Pending" and s["Index"] < row["Index"]),
                     key=lambda s: s["Index"], reverse=True)
    head: list[Effect] = [alert] if alert else []
    changes0 = dict(state_changes or {})
    if pending:
        nxt = pending[0]
        if direct:
            new_next, changes, cb, lease = _dispatch_compensation(nxt, ctx)
            new_state = _upd(st, **{**changes0, "CompFailureCount": 0, **changes})
            return Decision("compensation-next", head + [
                # No index write: the order's row covers the next deadline.
                # Crash after this: the redelivered reply is a duplicate and re-sends the next
                # compensation request; else the Supervisor expires its lease.
                Transact(v.order_id, (_replace(st, new_state), _replace(row, updated), _replace(nxt, new_next)),
                         note="compensation ended, next dispatched"),
                Send(request_message(after.with_rows(new_next), new_next, "compensation",
                                     new_next["CompensationAttempt"], cb, ctx), what="compensation"),
                _log(logging.INFO, "compensation.ended", v, step=row["Name"], compensation=updated["Compensation"],
                     next=nxt["Name"]),
            ])
        # The Supervisor (not direct): the index row it is handling ends; cover the new deadline.
        due = now + timedelta(seconds=ctx.config.grace_seconds)
        seq = int(st.get("ScheduleSeq") or 0) + 1
        cover = _cover(v.order_id, due, ctx, note="compensation unclaimed guard")
        new_state = _upd(st, **{**changes0, "CompIndex": nxt["Index"], "CompFailureCount": 0, "LockedBy": None,
                                "ClaimToken": None, "CompleteBy": iso(due), "LeaseKey": UNCLAIMED,
                                "ScheduleSeq": seq, "IndexDue": iso(cover.due), "UpdatedAt": iso(now)})
        return Decision("compensation-next", head + [
            cover,
            # Crash after this: the new row fires and the Supervisor schedules the next one.
            Transact(v.order_id, (_replace(st, new_state), _replace(row, updated)),
                     note="compensation ended, next scheduled"),
            Send(schedule_message(v.order_id, seq, ctx, v.traceparent), critical=False, what="schedule compensation"),
        ])
    any_failed = any(s.get("Compensation") == "Failed" for s in after.steps)
    new_state = _upd(st, **changes0, Mode="finished", LockedBy=None, ClaimToken=None, CompleteBy=None, LeaseKey="",
                     CompensationState="failed" if any_failed else "completed", UpdatedAt=iso(now),
                     FinishedAt=iso(now))
    return Decision("compensated", head + [
        # Crash after this: final; only best-effort status is missing.
        Transact(v.order_id, (_replace(st, new_state), _replace(row, updated)), note="last compensation ended"),
        *status_sends(v, "compensated", ctx, outcome=st.get("Outcome"),
                      compensation="failed" if any_failed else "completed"),
        _log(logging.INFO, "order.compensated", v, outcome=st.get("Outcome"), anyFailed=any_failed),
        *_drop_index(st),
    ])


# ---------------------------------------------------------------------------------------------
# Supervisor


def index_verdict(state: dict[str, Any] | None, due: datetime, now: datetime) -> str:
    """What a due index row means, from a point read of the state row alone: 'keep' (not due
    yet, or an orphan too young to tell), 'delete' (the order has no deadline: it is finished
    or held, or it never came to exist), 'move' (the order is slower than the row: cover its
    deadline with a later row) or 'act' (the deadline has passed)."""
    if due > now:
        return "keep"
    if state is None:
        return "delete" if due < now - ORPHAN_INDEX_AGE else "keep"
    cb = parse_iso(state.get("CompleteBy"))
    if cb is None or not state.get("LeaseKey"):
        return "delete"
    return "move" if cb > now else "act"


def _redrive(v: View, failures: int, ctx: Ctx, note: str) -> tuple[timedelta, int, PutIndex, dict[str, Any]]:
    """What a step redrive and a compensation redrive share: the notice's delay (backoff), the
    schedule message's sequence number, the index row covering the unclaimed deadline (delay +
    grace), and the state changes that release the claim and set that deadline."""
    st = v.state
    assert st is not None
    delay = ctx.config.backoff(failures)
    due = ctx.now + delay + timedelta(seconds=ctx.config.grace_seconds)
    seq = int(st.get("ScheduleSeq") or 0) + 1
    cover = _cover(v.order_id, due, ctx, note=note)
    changes = {"LockedBy": None, "ClaimToken": None, "CompleteBy": iso(due), "LeaseKey": UNCLAIMED,
               "ScheduleSeq": seq, "IndexDue": iso(cover.due), "UpdatedAt": iso(ctx.now)}
    return delay, seq, cover, changes


def decide_expired(v: View, ctx: Ctx) -> Decision:
    """The Supervisor on an order whose index row fell due. Every outcome with a deadline
    left puts the row that covers it first (the row being handled is deleted after)."""
    st = v.state
    if st is None:
        return Decision("obsolete")
    cb = parse_iso(st.get("CompleteBy"))
    lease = str(st.get("LeaseKey") or "")
    if not lease or cb is None:
        return Decision("obsolete")
    if cb > ctx.now:
        return Decision("not-due", [_cover(v.order_id, cb, ctx, note="moved")])
    cfg, now = ctx.config, ctx.now
    if lease == UNCLAIMED:
        # Lost send (redrive, retry/cancel): the order waited unclaimed past the grace
        # period. Re-send the schedule message; push the deadline (ETag: once per race).
        due = now + timedelta(seconds=cfg.grace_seconds)
        seq = int(st.get("ScheduleSeq") or 0) + 1
        cover = _cover(v.order_id, due, ctx, note="unclaimed guard")
        new_state = _upd(st, CompleteBy=iso(due), ScheduleSeq=seq, IndexDue=iso(cover.due), UpdatedAt=iso(now))
        return Decision("rescheduled", [
            # Crash after this: the overdue row is still there; the next sweep redoes this.
            cover,
            # Crash after this (schedule not sent): the new row fires by the grace period.
            Transact(v.order_id, (_replace(st, new_state),), note="unclaimed rescheduled"),
            Send(schedule_message(v.order_id, seq, ctx, v.traceparent), critical=False, what="schedule (lost send)"),
            _log(logging.WARNING, "supervisor.unclaimed_rescheduled", v, seq=seq, mode=st.get("Mode")),
        ])
    parsed = parse_lease(lease)
    if parsed is None:
        return Decision("obsolete", [_log(logging.ERROR, "supervisor.bad_lease", v, lease=lease)])
    kind, name, attempt = parsed
    row = v.step(name)
    if row is None:
        return Decision("obsolete", [_log(logging.ERROR, "supervisor.unknown_step", v, lease=lease)])
    if kind == "step":
        if row["State"] != "Running" or row.get("Attempt") != attempt:
            return Decision("obsolete", [_log(logging.ERROR, "supervisor.inconsistent", v, lease=lease)])
        failures = int(st.get("FailureCount") or 0) + 1
        reason = f"timed out (attempt {attempt})"
        if failures < cfg.max_failures:
            delay, seq, cover, released = _redrive(v, failures, ctx, note="redrive unclaimed guard")
            new_state = _upd(st, ProcessState="Pending", FailureCount=failures, **released)
            # OutcomeUnknown: the attempt may have applied the effect; a cancel of the Pending
            # order compensates it (an error reply or Done of a later attempt settles it).
            new_row = _upd(row, State="Pending", CompleteBy=None, FailureReason=reason, OutcomeUnknown=True)
            return Decision("redriven", [
                # Crash after this: state unchanged; the row is still overdue: next sweep.
                cover,
                # FailureCount+1, claim released, Pending: ETag-conditional, so two supervisors
                # never count one failure twice. Crash after this (notice not sent): the
                # new row fires by delay+grace and the schedule message is re-sent.
                Transact(v.order_id, (_replace(st, new_state), _replace(row, new_row)), note="redrive"),
                Send(schedule_message(v.order_id, seq, ctx, v.traceparent, not_before=now + delay),
                     critical=False, what="schedule (redrive)"),
                _log(logging.WARNING, "supervisor.redrive", v, step=name, attempt=attempt, failureCount=failures,
                     delaySeconds=delay.total_seconds()),
            ])
        # Timed out: no answer, so the effect may have been applied (reply lost, agent hung
        # after the call). Its outcome is unknown: compensated by its idempotency key.
        return _fail_step(v, row, f"{reason}; failure count {failures} reached {cfg.max_failures}", ctx,
                          state_changes={"FailureCount": failures}, direct=False, unknown=True)
    # an expired compensation
    if row.get("Compensation") != "Running" or row.get("CompensationAttempt") != attempt:
        return Decision("obsolete", [_log(logging.ERROR, "supervisor.inconsistent", v, lease=lease)])
    failures = int(st.get("CompFailureCount") or 0) + 1
    reason = f"compensation timed out (attempt {attempt})"
    if failures < cfg.max_failures:
        delay, seq, cover, released = _redrive(v, failures, ctx, note="compensation redrive guard")
        new_state = _upd(st, CompFailureCount=failures, **released)
        new_row = _upd(row, Compensation="Pending", CompensationCompleteBy=None, CompensationReason=reason)
        return Decision("compensation-redriven", [
            cover,
            # Same as a step redrive: ETag-conditional, the new row backs up the notice.
            Transact(v.order_id, (_replace(st, new_state), _replace(row, new_row)), note="compensation redrive"),
            Send(schedule_message(v.order_id, seq, ctx, v.traceparent, not_before=now + delay),
                 critical=False, what="schedule (compensation redrive)"),
            _log(logging.WARNING, "supervisor.compensation_redrive", v, step=name, attempt=attempt,
                 compFailureCount=failures),
        ])
    failed = _upd(row, Compensation="Failed", CompensationReason=f"{reason}; gave up after {failures}",
                  CompensationFinishedAt=iso(now), CompensationCompleteBy=None)
    alert = alert_effect(v, name, f"compensation failed: {reason}", failures, f"{name}:compensate:{attempt}", ctx)
    return _next_compensation(v, row, failed, ctx, alert=alert, direct=False,
                              state_changes={"CompFailureCount": failures})


# ---------------------------------------------------------------------------------------------
# Operator


def decide_retry(v: View, ctx: Ctx) -> Decision:
    st = v.state
    assert st is not None
    if not (st.get("ProcessState") == "Error" and st.get("Mode") == "held" and not st.get("LockedBy")):
        raise Rejected(_why_not(st, "retry", "only an order held in Error (on-failure policy 'hold') can be retried"))
    failed = next((s for s in v.steps if s["State"] == "Failed"), None)
    if failed is None:
        raise Rejected("the order has no failed step to retry")
    now = ctx.now
    due = now + timedelta(seconds=ctx.config.grace_seconds)
    seq = int(st.get("ScheduleSeq") or 0) + 1
    cover = _cover(v.order_id, due, ctx, note="retry unclaimed guard")
    new_state = _upd(st, ProcessState="Pending", Mode="forward", Outcome=None, FailureCount=0, LockedBy=None,
                     ClaimToken=None, CompleteBy=iso(due), LeaseKey=UNCLAIMED, ScheduleSeq=seq, IndexDue=iso(cover.due),
                     StepIndex=failed["Index"], StepName=failed["Name"], FailedStep=None, Reason=None,
                     UpdatedAt=iso(now), RetriedAt=iso(now))
    new_row = _upd(failed, State="Pending", FinishedAt=None)
    return Decision("retried", [
        # Crash after this: state unchanged (still held); the operator's call failed: retry it.
        # (A held order has no index row: its deadline needs a new one.)
        cover,
        # Crash after this: Pending, unclaimed; the new row fires and schedules it.
        Transact(v.order_id, (_replace(st, new_state), _replace(failed, new_row)), note="operator retry"),
        Send(schedule_message(v.order_id, seq, ctx, v.traceparent), critical=False, what="schedule (retry)"),
        _log(logging.WARNING, "operator.retry", v, step=failed["Name"]),
    ])


def decide_cancel(v: View, ctx: Ctx) -> Decision:
    st = v.state
    assert st is not None
    pending = st.get("ProcessState") == "Pending" and st.get("LeaseKey") == UNCLAIMED and not st.get("LockedBy")
    held = st.get("ProcessState") == "Error" and st.get("Mode") == "held" and not st.get("LockedBy")
    if not (pending or held):
        raise Rejected(_why_not(st, "cancel", "only a Pending order that is not being processed, or an order "
                                              "held in Error, can be cancelled"))
    now = ctx.now
    # The Done steps, and a step whose outcome is unknown (it timed out: failed by timeout and
    # held, or redriven and Pending): the remote may have applied it.
    comps = _to_compensate(v, ctx)
    base = _upd(st, ProcessState="Error", Outcome="cancelled", Reason="cancelled by operator", LockedBy=None,
                ClaimToken=None, UpdatedAt=iso(now), CancelledAt=iso(now))
    if not comps:
        new_state = _upd(base, Mode="finished", CompleteBy=None, LeaseKey="", CompensationState="none",
                         FinishedAt=iso(now))
        return Decision("cancelled", [
            # Crash after this: final. A schedule message still in flight finds nothing to claim.
            Transact(v.order_id, (_replace(st, new_state),), note="operator cancel"),
            *status_sends(v, "cancelled", ctx, processState="Error"),
            _log(logging.WARNING, "operator.cancel", v, compensations=0),
            *_drop_index(st),
        ])
    due = now + timedelta(seconds=ctx.config.grace_seconds)
    seq = int(st.get("ScheduleSeq") or 0) + 1
    # A held order has no index row: its new deadline needs one. A Pending order has its row.
    covers = [] if pending else [_cover(v.order_id, due, ctx, note="cancel unclaimed guard")]
    marks = [(c, _upd(c, Compensation="Pending")) for c in comps]
    new_state = _upd(base, Mode="compensate", CompIndex=comps[0]["Index"], CompFailureCount=0,
                     CompensationState="running", CompleteBy=iso(due), LeaseKey=UNCLAIMED, ScheduleSeq=seq,
                     **({"IndexDue": iso(covers[0].due)} if covers else {}))
    return Decision("cancelling", [
        # Crash after this: state unchanged; the operator's call failed: retry it.
        *covers,
        # Crash after this: compensation pending, unclaimed; the new row schedules it.
        Transact(v.order_id, (_replace(st, new_state), *(_replace(c, m) for c, m in marks)), note="operator cancel"),
        Send(schedule_message(v.order_id, seq, ctx, v.traceparent), critical=False, what="schedule (cancel)"),
        *status_sends(v, "cancelled", ctx, processState="Error"),
        _log(logging.WARNING, "operator.cancel", v, compensations=len(comps)),
    ])


def _why_not(st: dict[str, Any], action: str, rule: str) -> str:
    desc = f"order is {st.get('ProcessState')}"
    mode = st.get("Mode")
    if mode == "compensate":
        desc += " and compensating"
    elif mode == "finished" and st.get("Outcome"):
        desc += f" ({st.get('Outcome')})"
    elif st.get("LockedBy"):
        desc += f", step {st.get('StepName')} in flight"
    return f"cannot {action}: {desc}; {rule}"
