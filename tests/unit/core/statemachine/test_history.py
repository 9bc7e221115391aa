"""An order's history (issue 11): every state change appends its events in the SAME transaction
as the change, oldest first, seq contiguous; the forward path never reads them; a long history
pages, and a continuation token is checked on the way back in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from shared.api.operator import cancel_order, retry_order, terminate_order
from shared.api.orders import HISTORY_PAGE, get_history, get_order
from shared.api.search import search_orders
from shared.api.tokens import issue
from shared.core.messages import OutMessage
from shared.core.rows import HISTORY_PREFIX, STATE_ROW, Op, history_row_key
from shared.core.statemachine import EventKind, View, decide_expired
from shared.core.times import iso
from shared.scheduler import handle_reply
from shared.storage.memory import MemoryStore
from shared.supervisor import sweep
from tests.unit.core.statemachine.test_crash_points import SCENARIOS as FORWARD_SCENARIOS
from tests.unit.core.statemachine.test_operator import (
    HOLD,
    assert_history_whole,
    clock_of,
    events,
    failed_compensated,
    held_order,
    in_flight,
    kinds,
    mem,
    membus,
    pending_redriven,
)
from tests.unit.core.statemachine.test_operator_crash_points import SCENARIOS as OPERATOR_SCENARIOS
from tests.unit.core.statemachine.test_operator_crash_points import history_matches_state
from tests.unit.harness import WORKFLOW, AgentSim, Crash, CrashRuntime, drive, make_runtime, post, state

CONTRACT_EVENTS = {"accepted", "dispatched", "stepDone", "stepFailed", "redriven", "rescheduled", "alert",
                   "compensationDispatched", "compensationDone", "compensationFailed", "compensationRedriven",
                   "held", "processed", "failed", "compensated", "retried", "restarted", "cancelled", "terminated",
                   "stepWaiting", "resumed", "suspended", "unsuspended", "eventReceived", "waitTimedOut",
                   "waitingRoom", "admitted"}
R, C, S = "reserve-inventory", "charge-payment", "create-shipment"


def _steps(history: Sequence[dict[str, Any]]) -> list[tuple[str, str | None, int | None]]:
    return [(str(e["event"]), e.get("step"), e.get("attempt")) for e in history]


# ---------------------------------------------------------------------------------------------
# what each path records
def test_a_processed_order_tells_its_whole_story() -> None:
    rt = make_runtime()
    r = post(rt, headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    oid = r.body["orderId"]
    drive(rt, oid, AgentSim(rt))
    history = assert_history_whole(rt, oid)
    assert _steps(history) == [("accepted", None, None), ("dispatched", R, 1), ("stepDone", R, 1),
                               ("dispatched", C, 1), ("stepDone", C, 1), ("dispatched", S, 1), ("stepDone", S, 1),
                               ("processed", None, None)]
    assert history[0]["detail"] == {"total": "19.98", "currency": "EUR", "items": 1, "priority": "normal",
                                    "workflow": "order", "workflowVersion": 1}
    assert history[1]["detail"] == {"completeBy": "2026-11-22T08:00:30.000000+00:00"}
    for e in history:
        assert e["traceId"] == "0af7651916cd43dd8448eb211c80319c" and e["instance"] == "instance-a"
        assert set(e) <= {"seq", "at", "event", "step", "attempt", "detail", "instance", "traceId"}
        assert None not in e.values()  # absent keys are omitted
    body = get_order(rt, oid).body
    assert body["history"] == history and body["historyContinuationToken"] is None


def _error_reply() -> tuple[CrashRuntime, str]:
    rt, _agents, oid = failed_compensated()
    return rt, oid


def _first_step_rejected() -> tuple[CrashRuntime, str]:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    drive(rt, oid, AgentSim(rt, reject={R: "unknown sku"}))
    return rt, oid


def _threshold() -> tuple[CrashRuntime, str]:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    drive(rt, oid, AgentSim(rt, hang={C}))
    return rt, oid


def _compensation_failed_for_good() -> tuple[CrashRuntime, str]:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    drive(rt, oid, AgentSim(rt, reject={S: "no stock"}, hang={f"{C}:compensate"}))
    return rt, oid


def _held() -> tuple[CrashRuntime, str]:
    rt, _agents, oid = held_order()
    return rt, oid


def _retried_with_a_lost_notice() -> tuple[CrashRuntime, str]:
    rt, agents, oid = held_order()
    agents.reject.clear()
    membus(rt).fail.add("scheduler")
    assert retry_order(rt, oid).status == 202  # the notice is lost: the Supervisor re-sends it
    membus(rt).fail.clear()
    drive(rt, oid, agents)
    return rt, oid


def _waited_for_its_room() -> tuple[CrashRuntime, str]:
    """CustomerMaxInFlight 1: the customer's second order waits for the first to end, then runs."""
    rt = make_runtime(customer_max_in_flight=1)
    first = post(rt).body["orderId"]
    r = post(rt)
    assert r.status == 202 and r.body["waitingFor"] == "customer", r.body
    agents = AgentSim(rt)
    drive(rt, first, agents)
    drive(rt, r.body["orderId"], agents)
    return rt, r.body["orderId"]


def _restarted() -> tuple[CrashRuntime, str]:
    rt, agents, oid = failed_compensated()
    agents.reject.clear()
    assert retry_order(rt, oid).status == 202
    drive(rt, oid, agents)
    return rt, oid


def _compensation_retried() -> tuple[CrashRuntime, str]:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    agents = AgentSim(rt, reject={S: "no stock", f"{C}:compensate": "refund refused"})
    drive(rt, oid, agents)
    agents.reject.clear()
    assert retry_order(rt, oid).status == 202
    drive(rt, oid, agents)
    return rt, oid


def _cancelled_failed() -> tuple[CrashRuntime, str]:
    rt, _agents, oid = failed_compensated()
    assert cancel_order(rt, oid).status == 202
    return rt, oid


def _terminated() -> tuple[CrashRuntime, str]:
    rt, agents, oid = in_flight(C)
    assert terminate_order(rt, oid).status == 202
    drive(rt, oid, agents)
    return rt, oid


def _suspended_then_resumed() -> tuple[CrashRuntime, str]:
    """Suspended while charge-payment is at its agent: its reply is recorded, create-shipment is
    not dispatched until the operator resumes the order."""
    from shared.api.operator import resume_order, suspend_order

    rt, agents, oid = in_flight(C)
    assert suspend_order(rt, oid).status == 202
    drive(rt, oid, agents, until=lambda st: st.get("StepName") == S and not st.get("LeaseKey"))
    assert resume_order(rt, oid).status == 202
    drive(rt, oid, agents)
    return rt, oid


def _terminated_pending() -> tuple[CrashRuntime, str]:
    rt, agents, oid = pending_redriven()
    assert terminate_order(rt, oid).status == 202
    drive(rt, oid, agents)
    return rt, oid


def _terminated_pivot() -> tuple[CrashRuntime, str]:
    rt, _agents, oid = in_flight(S)
    assert terminate_order(rt, oid).status == 202
    return rt, oid


def _waited_on_a_breaker() -> tuple[CrashRuntime, str]:
    """The shipping remote's breaker is open for two requests: the step waits (no call, no
    failure), each scheduled wake-up sends its request again to carry the probe, and the second
    probe goes through: one wait, one resume, whatever the number of probes."""
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    agents = AgentSim(rt, breaker_open={S: 2})
    drive(rt, oid, agents)
    return rt, oid


def _approved() -> tuple[CrashRuntime, str]:
    """An order waits for its approval event, which comes: the wait ends and the order goes on."""
    from tests.unit.core.statemachine.test_events import send, waiting_order

    rt, agents, oid = waiting_order()
    assert send(rt, oid, {"approved": True}).status == 202
    drive(rt, oid, agents)
    return rt, oid


def _approval_timed_out() -> tuple[CrashRuntime, str]:
    """No approval within the wait's timeout: it is compensated (its onTimeout)."""
    from tests.unit.core.statemachine.test_events import waiting_order

    rt, agents, oid = waiting_order()
    rt.clock.advance(3601)
    drive(rt, oid, agents)
    return rt, oid


FORWARD = [("accepted", None, None), ("dispatched", R, 1), ("stepDone", R, 1), ("dispatched", C, 1),
           ("stepDone", C, 1)]
ERROR_REPLY = [*FORWARD, ("dispatched", S, 1), ("stepFailed", S, 1), ("alert", S, 1),
               ("compensationDispatched", C, 1), ("compensationDone", C, 1),
               ("compensationDispatched", R, 1), ("compensationDone", R, 1), ("compensated", None, None)]
REFUND_REFUSED = [*FORWARD, ("dispatched", S, 1), ("stepFailed", S, 1), ("alert", S, 1),
                  ("compensationDispatched", C, 1), ("compensationFailed", C, 1), ("alert", C, 1),
                  ("compensationDispatched", R, 1), ("compensationDone", R, 1), ("compensated", None, None)]
Path = tuple[Callable[[], tuple[CrashRuntime, str]], list[tuple[str, str | None, int | None]]]
PATHS: dict[str, Path] = {
    "error-reply-compensated": (_error_reply, ERROR_REPLY),
    "first-step-rejected": (_first_step_rejected, [
        ("accepted", None, None), ("dispatched", R, 1), ("stepFailed", R, 1), ("alert", R, 1),
        ("failed", R, None)]),
    "threshold": (_threshold, [
        *FORWARD[:4], ("redriven", C, 1), ("dispatched", C, 2), ("redriven", C, 2), ("dispatched", C, 3),
        ("stepFailed", C, 3), ("alert", C, 3), ("compensationDispatched", C, 1), ("compensationDone", C, 1),
        ("compensationDispatched", R, 1), ("compensationDone", R, 1), ("compensated", None, None)]),
    "compensation-failed-for-good": (_compensation_failed_for_good, [
        *FORWARD, ("dispatched", S, 1), ("stepFailed", S, 1), ("alert", S, 1),
        ("compensationDispatched", C, 1), ("compensationRedriven", C, 1), ("compensationDispatched", C, 2),
        ("compensationRedriven", C, 2), ("compensationDispatched", C, 3), ("compensationFailed", C, 3),
        ("alert", C, 3), ("compensationDispatched", R, 1), ("compensationDone", R, 1),
        ("compensated", None, None)]),
    "held": (_held, [*FORWARD[:4], ("stepFailed", C, 1), ("alert", C, 1), ("held", C, None)]),
    "retried-notice-lost": (_retried_with_a_lost_notice, [
        *FORWARD[:4], ("stepFailed", C, 1), ("alert", C, 1), ("held", C, None), ("retried", C, None),
        ("rescheduled", None, None), ("dispatched", C, 2), ("stepDone", C, 2), ("dispatched", S, 1),
        ("stepDone", S, 1), ("processed", None, None)]),
    "restarted": (_restarted, [
        *ERROR_REPLY, ("restarted", None, None), ("dispatched", R, 2), ("stepDone", R, 2),
        ("dispatched", C, 2), ("stepDone", C, 2), ("dispatched", S, 2), ("stepDone", S, 2),
        ("processed", None, None)]),
    "compensation-retried": (_compensation_retried, [
        *REFUND_REFUSED, ("retried", None, None), ("compensationDispatched", C, 2), ("compensationDone", C, 2),
        ("compensated", None, None)]),
    "waited-for-its-room": (_waited_for_its_room, [
        ("accepted", None, None), ("waitingRoom", R, None), ("admitted", None, None), *FORWARD[1:],
        ("dispatched", S, 1), ("stepDone", S, 1), ("processed", None, None)]),
    "waited-on-a-breaker": (_waited_on_a_breaker, [
        *FORWARD, ("dispatched", S, 1), ("stepWaiting", S, 1), ("resumed", S, 1), ("stepDone", S, 1),
        ("processed", None, None)]),
    "cancelled-failed": (_cancelled_failed, [*ERROR_REPLY, ("cancelled", None, None)]),
    "terminated": (_terminated, [
        *FORWARD[:4], ("terminated", C, 1), ("compensationDispatched", C, 1), ("compensationDone", C, 1),
        ("compensationDispatched", R, 1), ("compensationDone", R, 1), ("compensated", None, None)]),
    "suspended-then-resumed": (_suspended_then_resumed, [
        *FORWARD[:4], ("suspended", C, None), ("stepDone", C, 1), ("unsuspended", S, None), ("dispatched", S, 1),
        ("stepDone", S, 1), ("processed", None, None)]),
    "terminated-pending": (_terminated_pending, [
        ("accepted", None, None), ("dispatched", R, 1), ("redriven", R, 1), ("terminated", R, 1),
        ("compensationDispatched", R, 1), ("compensationDone", R, 1), ("compensated", None, None)]),
    "terminated-pivot": (_terminated_pivot, [*FORWARD, ("dispatched", S, 1), ("terminated", S, 1), ("held", S, None)]),
    "approved": (_approved, [
        *FORWARD[:3], ("dispatched", "approval", 1), ("eventReceived", "approval", 1), ("stepDone", "approval", 1),
        *FORWARD[3:], ("dispatched", S, 1), ("stepDone", S, 1), ("processed", None, None)]),
    "approval-timed-out": (_approval_timed_out, [
        *FORWARD[:3], ("dispatched", "approval", 1), ("waitTimedOut", "approval", 1),
        ("stepFailed", "approval", 1), ("alert", "approval", 1), ("compensationDispatched", R, 1),
        ("compensationDone", R, 1), ("compensated", None, None)]),
}


@pytest.mark.parametrize("name", sorted(PATHS))
def test_each_path_records_its_events_oldest_first(name: str) -> None:
    build, expected = PATHS[name]
    rt, oid = build()
    history = assert_history_whole(rt, oid)
    assert _steps(history) == expected
    # one alert event per alert sent (the queue's duplicate detection drops re-sends of one)
    alerts = {m.message_id for m in membus(rt).peek("alerts") if m.body["orderId"] == oid}
    assert len(alerts) == [e["event"] for e in history].count("alert")


def test_every_event_the_contract_names_is_recorded_by_some_path_and_no_other() -> None:
    seen: set[str] = set()
    for build, _expected in PATHS.values():
        rt, oid = build()
        seen |= set(kinds(rt, oid))
    assert seen == CONTRACT_EVENTS == {str(k) for k in EventKind}


def test_event_details() -> None:
    rt, oid = _threshold()
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for e in events(rt, oid):
        by_kind.setdefault(str(e["event"]), []).append(e.get("detail") or {})
    assert by_kind["redriven"] == [
        {"reason": "timed out (attempt 1)", "failureCount": 1, "backoffSeconds": 0.0},
        {"reason": "timed out (attempt 2)", "failureCount": 2, "backoffSeconds": 5.0}]
    [failed] = by_kind["stepFailed"]
    assert failed["outcomeUnknown"] is True and "failure count 3 reached 3" in failed["reason"]
    [alert] = by_kind["alert"]
    assert alert["failureCount"] == 3 and alert["reason"] == failed["reason"]
    assert by_kind["compensated"] == [{"outcome": "failed", "compensation": "completed"}]
    assert all("completeBy" in d for d in by_kind["dispatched"] + by_kind["compensationDispatched"])
    rt, oid = _restarted()
    assert [e.get("detail") for e in events(rt, oid) if e["event"] == "restarted"] == [{"generation": 1}]
    rt, oid = _compensation_retried()
    [retried] = [e for e in events(rt, oid) if e["event"] == "retried"]
    assert retried["detail"] == {"retry": "compensation", "steps": [C]}
    rt, oid = _cancelled_failed()
    assert events(rt, oid)[-1]["detail"] == {"compensations": 0}
    rt, oid = _terminated()
    assert [e["detail"] for e in events(rt, oid) if e["event"] == "terminated"] == [{"compensations": 2}]
    rt, oid = _terminated_pivot()
    held = events(rt, oid)[-1]
    assert held["event"] == "held" and "outcome is unknown" in held["detail"]["reason"]


# ---------------------------------------------------------------------------------------------
# in the same transaction as the change
class RecordingStore(MemoryStore):
    """Records every committed transaction of the state table, and the keys every
    ``read_partition`` returned."""

    def __init__(self) -> None:
        super().__init__()
        self.committed: list[tuple[str, tuple[Op, ...]]] = []
        self.live_reads: list[set[str]] = []

    def transact(self, order_id: str, ops: Sequence[Op]) -> None:
        super().transact(order_id, ops)
        if ops:
            self.committed.append((order_id, tuple(ops)))

    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        rows = super().read_partition(order_id)
        self.live_reads.append(set(rows))
        return rows


def _check_transactions(store: RecordingStore) -> int:
    """Every transaction that writes a state row appends events history-(old+1)..history-(new
    EventSeq), and no other transaction writes history; an event is only ever created."""
    last: dict[str, int] = {}
    for order_id, ops in store.committed:
        history = [op for op in ops if op.row_key.startswith(HISTORY_PREFIX)]
        writes_state = [op for op in ops if op.row_key == STATE_ROW and op.kind != "delete"]
        if not writes_state:
            assert all(op.kind == "delete" for op in ops), ops  # only the retention purge
            continue
        assert all(op.kind == "create" for op in history), "an event is never rewritten"
        new_seq = writes_state[0].row["EventSeq"]
        seqs = [op.row["Seq"] for op in history]
        assert seqs == list(range(last.get(order_id, 0) + 1, new_seq + 1)), (seqs, new_seq)
        assert [op.row_key for op in history] == [history_row_key(n) for n in seqs]
        assert len(ops) <= 100
        last[order_id] = new_seq
    return len(store.committed)


def test_every_state_write_carries_its_events_in_its_own_transaction() -> None:
    store = RecordingStore()
    rt = make_runtime(store=store, workflow=HOLD)
    agents = AgentSim(rt)
    # a bit of everything on one store: held and retried, failed and restarted, a compensation
    # refused and redriven, cancelled, a timeout, terminated
    agents.reject = {C: "declined"}
    held = post(rt).body["orderId"]
    drive(rt, held, agents)
    agents.reject = {}
    assert retry_order(rt, held).status == 202
    drive(rt, held, agents)
    for reject in ({S: "no stock"}, {S: "no stock", f"{R}:compensate": "refused"}):
        agents.reject = dict(reject)
        oid = post(rt).body["orderId"]
        drive(rt, oid, agents)
        agents.reject = {}
        assert retry_order(rt, oid).status == 202
        drive(rt, oid, agents)
    agents.reject = {S: "no stock"}
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents)
    assert cancel_order(rt, oid).status == 202
    agents.reject = {}
    agents.hang = {R}
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 1)
    assert terminate_order(rt, oid).status == 202
    agents.hang = set()
    drive(rt, oid, agents)
    assert _check_transactions(store) > 35
    for order_id in {o for o, _ops in store.committed}:
        assert_history_whole(rt, order_id)


def test_the_forward_path_never_reads_history() -> None:
    """Scheduler, replies, Supervisor, operator actions and search read the order's live rows
    only (``order``, ``state``, ``step-*``); only GET /api/orders/{id} and its history page
    read history, once each."""
    store = RecordingStore()
    rt = make_runtime(store=store, workflow=HOLD)
    agents = AgentSim(rt, reject={C: "declined"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents)
    for _ in range(30):  # a history of 150+ events: the forward path still reads none of it
        assert retry_order(rt, oid).status == 202
        drive(rt, oid, agents)
    agents.reject.clear()
    assert retry_order(rt, oid).status == 202
    drive(rt, oid, agents)
    sweep(rt)
    search_orders(rt, {"state": "processed"})
    assert state(rt, oid)["EventSeq"] > 150
    assert all(not key.startswith(HISTORY_PREFIX) for keys in store.live_reads for key in keys)
    assert [r for r in store.reads if r[0] == "history"] == []
    before = len(store.reads)
    assert get_order(rt, oid).status == 200
    assert get_history(rt, oid, {"limit": "5"}).status == 200
    assert [r for r in store.reads[before:] if r[0] == "history"] == [("history", oid)] * 2


def test_one_reply_is_one_transaction_with_history_on() -> None:
    store = RecordingStore()
    rt = make_runtime(store=store)
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    assert len(store.committed) == 1  # the submission: order, state, steps and its 2 events at once
    for n in range(1, 4):
        agents.work(rt.clock())
        agents.reply_all()
        assert len(store.committed) == 1 + n  # each reply: ONE transaction, its events in it
    assert state(rt, oid)["ProcessState"] == "Processed"
    _check_transactions(store)


def _racing_supervisors(rt: CrashRuntime, oid: str) -> None:
    clock_of(rt).advance(31)
    view = View.from_entities(rt.store.read_partition(oid))
    first, second = decide_expired(view, rt.ctx()), decide_expired(view, rt.ctx())
    assert not rt.run(first.effects).lost_race
    assert rt.run(second.effects).lost_race  # its whole transaction fails: no event of its own


def test_the_loser_of_a_race_writes_no_event() -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    _racing_supervisors(rt, oid)
    assert kinds(rt, oid) == ["accepted", "dispatched", "redriven"]
    assert_history_whole(rt, oid)


ALL_SCENARIOS: list[Any] = [*FORWARD_SCENARIOS, *OPERATOR_SCENARIOS]


@pytest.mark.parametrize("sc", ALL_SCENARIOS, ids=[f"{type(s).__module__.rsplit('.', 1)[-1]}:{s.name}"
                                                   for s in ALL_SCENARIOS])
def test_events_exist_if_and_only_if_their_change_committed(sc: Any) -> None:
    """Every handler (the forward path's and the operator's), crashed after each of its
    effects: the order's events are exactly history-1..EventSeq, and the state row changed if
    and only if new events exist, all stamped with the change's time; the same after the
    handler runs again."""
    k = 0
    while True:
        rt = make_runtime(workflow=getattr(sc, "workflow", WORKFLOW))
        agents = AgentSim(rt, reject=dict(getattr(sc, "reject", None) or {}),
                          hang=set(getattr(sc, "hang", None) or ()), lost=set(getattr(sc, "lost", None) or ()))
        oid, trigger = sc.setup(rt, agents)
        before = state(rt, oid)
        seq = history_matches_state(rt, oid)
        rt.crash_at = k
        with pytest.raises(Crash):
            trigger()
        after = state(rt, oid)
        new_seq = history_matches_state(rt, oid)
        assert (after["_etag"] != before["_etag"]) == (new_seq > seq), (k, before, after)
        at = rt.clock().isoformat(timespec="microseconds")
        assert all(iso(row.at) == at for row in rt.store.read_history(oid, seq, 100)), k
        trigger()  # redelivered (or called again): the same holds after it
        history_matches_state(rt, oid)
        if rt.crash_exhausted:
            break
        k += 1


# ---------------------------------------------------------------------------------------------
# a long history pages
def _long_history(cycles: int = 25) -> tuple[CrashRuntime, str]:
    """A held order retried ``cycles`` times, refused each time: 5 events a cycle."""
    rt, agents, oid = held_order()
    for _ in range(cycles):
        assert retry_order(rt, oid).status == 202
        drive(rt, oid, agents)
    return rt, oid


def test_a_long_history_pages_through_get_order_and_the_history_endpoint() -> None:
    rt, oid = _long_history()
    total = state(rt, oid)["EventSeq"]
    assert total > HISTORY_PAGE + 20
    body = get_order(rt, oid).body
    assert [e["seq"] for e in body["history"]] == list(range(1, HISTORY_PAGE + 1))
    token = body["historyContinuationToken"]
    assert isinstance(token, str)
    rest = get_history(rt, oid, {"continuationToken": token})
    assert rest.status == 200 and rest.body["orderId"] == oid
    assert [e["seq"] for e in rest.body["history"]] == list(range(HISTORY_PAGE + 1, total + 1))
    assert rest.body["continuationToken"] is None
    # small pages: every event once, in order
    seen: list[int] = []
    params: dict[str, str] = {"limit": "7"}
    pages = 0
    while True:
        page = get_history(rt, oid, params)
        assert page.status == 200 and len(page.body["history"]) <= 7
        seen += [e["seq"] for e in page.body["history"]]
        pages += 1
        if page.body["continuationToken"] is None:
            break
        params = {"limit": "7", "continuationToken": page.body["continuationToken"]}
    assert seen == list(range(1, total + 1)) and pages == -(-total // 7)
    # the limit may change between pages; the token is bound to the order, not to the limit
    first = get_history(rt, oid, {"limit": "10"}).body
    second = get_history(rt, oid, {"limit": "1000", "continuationToken": first["continuationToken"]}).body
    assert [e["seq"] for e in first["history"] + second["history"]] == list(range(1, total + 1))


def test_a_history_of_exactly_one_page_has_no_token() -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    drive(rt, oid, AgentSim(rt))
    n = state(rt, oid)["EventSeq"]
    assert get_order(rt, oid).body["historyContinuationToken"] is None
    assert get_history(rt, oid, {"limit": str(n)}).body["continuationToken"] is None
    page = get_history(rt, oid, {"limit": str(n - 1)}).body
    assert page["continuationToken"] is not None
    last = get_history(rt, oid, {"continuationToken": page["continuationToken"]}).body
    assert [e["seq"] for e in last["history"]] == [n] and last["continuationToken"] is None


def _tampered(token: str) -> list[str]:
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    middle = token[:10] + ("x" if token[10] != "x" else "y") + token[11:]
    return [flipped, middle, token[:-3], token + "AAAA", token[1:], "", " ", "%00", "é" * 10, token * 40]


def test_a_tampered_or_foreign_history_token_is_400() -> None:
    rt, oid = _long_history(cycles=22)
    other = post(rt).body["orderId"]
    token = get_order(rt, oid).body["historyContinuationToken"]
    assert token
    reads = len(mem(rt).reads)
    bad = [*_tampered(token),
           issue(rt.keys, f"history:{other}", {"after": 100}),  # another order's token
           issue(rt.keys, "orders", {"after": 100}),  # another query's token
           issue(rt.keys, f"history:{oid}", {"after": -1}), issue(rt.keys, f"history:{oid}", {"after": "100"}),
           issue(rt.keys, f"history:{oid}", {"after": True}), issue(rt.keys, f"history:{oid}", {"k": "x"})]
    for t in bad:
        r = get_history(rt, oid, {"continuationToken": t})
        assert r.status == 400, t
        assert r.content_type == "application/problem+json"
        assert r.body["type"] == "https://errors.orders.example/invalid-continuation-token"
    assert get_history(rt, other, {"continuationToken": token}).status == 400
    assert len(mem(rt).reads) == reads  # refused before any read


@pytest.mark.parametrize("limit", ["0", "-1", "1001", "abc", "", "1e3", "10.5", " 5", "99999999999", "５"])
def test_a_bad_history_limit_is_400(limit: str) -> None:
    rt = make_runtime()
    oid = post(rt).body["orderId"]
    r = get_history(rt, oid, {"limit": limit})
    assert r.status == 400 and r.body["type"].endswith("/invalid-query")
    assert r.body["errors"][0]["field"] == "limit"


def test_history_of_an_unknown_order_is_404_and_a_bad_id_400() -> None:
    rt = make_runtime()
    assert get_history(rt, "f" * 32, {}).status == 404
    unknown = issue(rt.keys, f"history:{'f' * 32}", {"after": 3})
    assert get_history(rt, "f" * 32, {"continuationToken": unknown}).status == 404
    assert get_history(rt, "nope", {}).status == 400
    assert get_order(rt, "f" * 32).status == 404


def test_events_are_never_rewritten() -> None:
    rt, oid = _long_history(cycles=3)
    before = {k: v for k, v in mem(rt).snapshot().items() if k[2].startswith(HISTORY_PREFIX)}
    rt2_agents = AgentSim(rt)
    assert retry_order(rt, oid).status == 202
    drive(rt, oid, rt2_agents)
    after = {k: v for k, v in mem(rt).snapshot().items() if k[2].startswith(HISTORY_PREFIX)}
    assert {k: after[k] for k in before} == before and len(after) > len(before)


def test_history_survives_messages_about_it_arriving_twice() -> None:
    """A duplicate or stale message changes nothing: no event either."""
    rt = make_runtime()
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    agents.work(rt.clock())
    replies: list[OutMessage] = list(agents.pending_replies)
    agents.reply_all()
    n = state(rt, oid)["EventSeq"]
    for msg in replies * 3:
        assert handle_reply(rt, json.dumps(msg.body).encode()) == "duplicate"
    assert state(rt, oid)["EventSeq"] == n
    assert_history_whole(rt, oid)
