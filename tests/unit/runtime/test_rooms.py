"""A customer's room (``CustomerMaxInFlight``, ``shared.core.room``, ``shared.runtime.rooms``): an
order over its customer's cap is accepted and waits, starts in submission order when a slot frees,
and no crash between the moves loses or starves one (issue 45, item 2)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from shared.api.operator import cancel_order, suspend_order, terminate_order
from shared.api.orders import get_order
from shared.api.search import search_orders
from shared.core.effects import LeaveRoom
from shared.core.messages import OutMessage
from shared.core.room import (
    ORPHAN_HOLDER_AGE,
    WATCH_PERIOD,
    Room,
    Waiter,
    admit,
    customer_cap,
    enter,
    room_partition,
)
from shared.core.rows import ORDER_ROW, STATE_ROW, IndexRow
from shared.runtime import rooms
from shared.scheduler import handle_reply, handle_schedule
from shared.settings import InvalidSettingError, Settings
from shared.storage.memory import MemoryStore
from shared.storage.store import Conflict
from shared.supervisor import sweep
from tests.unit.core.statemachine.test_operator import HOLD, kinds
from tests.unit.harness import (
    BODY,
    REQUIRED_VALUES,
    T0,
    AgentSim,
    Crash,
    DedupBus,
    deliver_schedules,
    drive,
    make_runtime,
    post,
    settled,
    state,
)

A, B = "customer-a", "customer-b"


class RecordingBus(DedupBus):
    """Records the order ids of the admissions (schedule messages of sequence 1) in the order sent."""

    def __init__(self) -> None:
        super().__init__()
        self.admissions: list[str] = []

    def send(self, message: OutMessage) -> None:
        if message.subject == "schedule" and message.body.get("seq") == 1:
            self.admissions.append(str(message.body["orderId"]))
        super().send(message)


def order_of(rt: Any, customer: str, key: str | None = None) -> dict[str, Any]:
    rt.clock.advance(0.001)  # submission order is by submission time (ties: by order id)
    r = post(rt, {**BODY, "customerId": customer}, headers={"Idempotency-Key": key} if key else None)
    assert r.status in (200, 202), r.body
    return dict(r.body)


@contextmanager
def room_refused(rt: Any, customer: str = A) -> Iterator[None]:
    """Every write to ``customer``'s room refused (a lost race each time) while inside."""
    real = rt.store.transact

    def refuse(partition: str, ops: Any) -> dict[str, str]:
        if partition == room_partition(customer):
            raise Conflict("the room is busy")
        return real(partition, ops)

    rt.store.transact = refuse
    try:
        yield
    finally:
        rt.store.transact = real


def room(rt: Any, customer: str = A) -> tuple[Room, list[Waiter]]:
    return rooms.read_room(rt.store, room_partition(customer), 100)


def in_flight(rt: Any, oids: list[str]) -> list[str]:
    """The orders past submission and not yet ended: started, and not Processed/Error/held."""
    out = []
    for oid in oids:
        st = state(rt, oid)
        if st["Mode"] in ("forward", "compensate") and not (st.get("WaitingRoom") and st["ProcessState"] == "Pending"):
            out.append(oid)
    return out


def pump(rt: Any, agents: AgentSim, oids: list[str], cap: int, *, rounds: int = 400) -> None:
    """Every message handled, the clock moved and the Supervisor run when idle, until all of
    ``oids`` settle; after each move, no more than ``cap`` of them in flight."""
    for _ in range(rounds):
        if all(settled(state(rt, o)) for o in oids):
            return
        busy = bool(deliver_schedules(rt))
        assert len(in_flight(rt, oids)) <= cap
        busy |= bool(agents.work(rt.clock()))
        busy |= bool(agents.reply_all())
        assert len(in_flight(rt, oids)) <= cap
        if not busy:
            rt.clock.advance(10)
            sweep(rt)
    raise AssertionError({o: state(rt, o)["ProcessState"] for o in oids})


def assert_room_empty(rt: Any, customer: str = A) -> None:
    r, waiters = room(rt, customer)
    assert (dict(r.holders), waiters) == ({}, [])


# ---------------------------------------------------------------------------------------------
# the pure decisions
def test_a_new_order_never_overtakes_a_waiter_and_the_oldest_waiters_take_the_free_slots() -> None:
    full = Room("room-x", 2, {"o1": T0, "o2": T0}, "etag")
    w = [Waiter(f"w-{n}", f"o{n}", "scheduler") for n in (3, 4, 5)]
    assert enter(full, [], "o6", 2, T0).admitted is False
    assert enter(full, [], "o1", 2, T0).admitted is True and enter(full, [], "o1", 2, T0).write is None
    one_free = Room("room-x", 2, {"o1": T0}, "etag")
    assert enter(one_free, w[:1], "o6", 2, T0).admitted is False  # o3 waits: it goes first
    entry = enter(one_free, [], "o6", 2, T0)
    assert entry.admitted and entry.write is not None and set(entry.write.holders) == {"o1", "o6"}
    moved = admit(full, w, T0, leaving=["o1"])
    assert moved.room is not None and set(moved.room.holders) == {"o2", "o3"}
    assert [x.order_id for x in moved.admitted] == ["o3"] and [x.order_id for x in moved.deletes] == ["o3"]
    # a waiter whose order ended is dropped without a slot; a cap raised admits more
    moved = admit(full, w, T0, leaving=["o1", "o2"], gone=["o3"], cap=3)
    assert moved.room is not None and set(moved.room.holders) == {"o4", "o5"}
    assert [x.order_id for x in moved.deletes] == ["o3", "o4", "o5"]
    assert admit(full, w, T0).room is None  # nothing leaves: nothing moves


@pytest.mark.parametrize(("raw", "cap"), [("", 0), ("0", 0), (" 10 ", 10), ("400", 400)])
def test_the_setting_is_a_whole_number_up_to_400_or_none(raw: str, cap: int) -> None:
    assert customer_cap(raw) == cap
    assert Settings.from_env({**REQUIRED_VALUES, "CustomerMaxInFlight": raw})["CustomerMaxInFlight"] == raw


@pytest.mark.parametrize("raw", ["-1", "ten", "2.5", "401"])
def test_a_setting_that_is_no_cap_stops_the_start_naming_it(raw: str) -> None:
    with pytest.raises(InvalidSettingError, match="CustomerMaxInFlight"):
        Settings.from_env({**REQUIRED_VALUES, "CustomerMaxInFlight": raw})


# ---------------------------------------------------------------------------------------------
# the flow
def test_orders_over_the_cap_wait_visibly_and_start_in_submission_order() -> None:
    bus = RecordingBus()
    rt = make_runtime(bus=bus, customer_max_in_flight=2)
    a = [order_of(rt, A) for _ in range(6)]
    assert [x["processState"] for x in a] == ["Processing"] * 2 + ["Pending"] * 4
    assert [x.get("waitingFor") for x in a] == [None, None] + ["customer"] * 4
    b = order_of(rt, B)  # another customer's order is not held up behind A's
    assert b["processState"] == "Processing"
    waiting = get_order(rt, a[2]["orderId"]).body
    assert waiting["waitingFor"] == {"kind": "customer", "customerId": A, "since": waiting["createdAt"]}
    found = {o["orderId"]: o for o in search_orders(rt, {"customerId": A}).body["orders"]}
    assert {o: found[o]["waitingFor"] for o in found} == {  # the search says so too, from the state row it reads
        x["orderId"]: {"kind": "customer", "customerId": A, "since": found[x["orderId"]]["createdAt"]}
        if x.get("waitingFor") else None for x in a}
    assert (waiting["processState"], waiting["currentStep"], waiting["lockedBy"]) == ("Pending", "reserve-inventory",
                                                                                       None)
    assert kinds(rt, a[2]["orderId"]) == ["accepted", "waitingRoom"]
    r, waiters = room(rt)
    assert set(r.holders) == {a[0]["orderId"], a[1]["orderId"]}
    assert [w.order_id for w in waiters] == [x["orderId"] for x in a[2:]]
    oids = [x["orderId"] for x in a]
    pump(rt, AgentSim(rt), [*oids, b["orderId"]], cap=3)  # 2 of A's and B's at most
    pump(rt, AgentSim(rt), oids, cap=2)
    assert all(state(rt, o)["ProcessState"] == "Processed" for o in oids)
    assert bus.admissions == oids[2:]  # in submission order
    assert get_order(rt, oids[5]).body["waitingFor"] is None
    assert all(o["waitingFor"] is None for o in search_orders(rt, {"customerId": A}).body["orders"])
    assert_room_empty(rt)


def test_under_the_cap_an_order_costs_two_reads_and_two_writes_more_and_no_message() -> None:
    """The price of the cap not reached: the room read and written at the door, and again when
    the order ends. No bus operation, no execution."""
    counts = []
    for cap in (0, 10):
        store = MemoryStore()
        bus = DedupBus()
        rt = make_runtime(store=store, bus=bus, customer_max_in_flight=cap)
        oid = order_of(rt, A)["orderId"]
        drive(rt, oid, AgentSim(rt))
        assert state(rt, oid)["ProcessState"] == "Processed"
        counts.append((len(store.reads), store.writes, bus.sent_count))
    (reads0, writes0, sent0), (reads1, writes1, sent1) = counts
    assert (reads1 - reads0, writes1 - writes0, sent1 - sent0) == (2, 2, 0)


def test_a_held_order_gives_its_slot_back() -> None:
    rt = make_runtime(workflow=HOLD, customer_max_in_flight=1)
    agents = AgentSim(rt, reject={"charge-payment": "card declined"})  # its policy: hold for an operator
    first, second = order_of(rt, A)["orderId"], order_of(rt, A)["orderId"]
    drive(rt, first, agents)
    assert state(rt, first)["Mode"] == "held"
    agents.reject.clear()
    drive(rt, second, agents)
    assert state(rt, second)["ProcessState"] == "Processed"


@pytest.mark.parametrize("action", ["cancel", "terminate"])
def test_a_waiting_order_an_operator_ends_leaves_its_place_and_never_runs(action: str) -> None:
    rt = make_runtime(customer_max_in_flight=1)
    first, second, third = (order_of(rt, A)["orderId"] for _ in range(3))
    end = cancel_order if action == "cancel" else terminate_order
    assert end(rt, second).status == 202
    assert state(rt, second)["Mode"] == "finished" and not state(rt, second).get("WaitingRoom")
    assert [w.order_id for w in room(rt)[1]] == [third]
    assert suspend_order(rt, third).status == 409  # nothing in flight to suspend: cancel it instead
    agents = AgentSim(rt)
    drive(rt, first, agents)
    drive(rt, third, agents)
    assert state(rt, third)["ProcessState"] == "Processed"
    assert "dispatched" not in kinds(rt, second) and not [c for c in agents.calls if c[0] == second]
    assert_room_empty(rt)


def test_a_copy_of_an_admission_claims_once() -> None:
    rt = make_runtime(customer_max_in_flight=1)
    first, second = order_of(rt, A)["orderId"], order_of(rt, A)["orderId"]
    agents = AgentSim(rt)
    drive(rt, first, agents, until=lambda st: st["ProcessState"] == "Processed")
    [admission] = rt.bus.peek("scheduler")
    for _ in range(3):
        handle_schedule(rt, json.dumps(admission.body).encode(), message_id=admission.message_id)
    assert kinds(rt, second).count("admitted") == 1 and kinds(rt, second).count("dispatched") == 1
    drive(rt, second, agents)
    assert state(rt, second)["ProcessState"] == "Processed"


def test_a_lost_race_at_the_door_reads_again_and_never_passes_the_cap() -> None:
    """Another instance takes the last slot between this one's read and its write: the write is
    refused, the read again finds the room full, and the order waits."""
    rt = make_runtime(customer_max_in_flight=2)
    first = order_of(rt, A)["orderId"]
    store = rt.store
    real = store.transact
    rival = {"done": False}

    def transact(partition: str, ops: Any) -> dict[str, str]:
        if partition == room_partition(A) and not rival["done"]:
            rival["done"] = True
            assert rooms.enter(store, partition, "f" * 32, 2, rt.clock())  # the rival's submission
        return real(partition, ops)

    store.transact = transact  # type: ignore[method-assign]
    body = order_of(rt, A)
    assert body["processState"] == "Pending" and set(room(rt)[0].holders) == {first, "f" * 32}


# ---------------------------------------------------------------------------------------------
# crash points
def _effects_of_waiting_submission() -> int:
    rt = make_runtime(customer_max_in_flight=1)
    order_of(rt, A)
    for k in range(20):
        rt2 = make_runtime(customer_max_in_flight=1)
        order_of(rt2, A)
        rt2.crash_at = k
        try:
            order_of(rt2, A, key="k")
        except Crash:
            if rt2.crash_exhausted:
                return k
    raise AssertionError("the waiting submission never ran out of effects")


WAITING_SUBMISSION = range(_effects_of_waiting_submission() + 1)


@pytest.mark.parametrize("retried", [True, False], ids=["client-retries", "no-retry"])
@pytest.mark.parametrize("k", WAITING_SUBMISSION)
def test_a_crash_in_a_waiting_submission_loses_no_order(k: int, retried: bool) -> None:
    """The submission of an order over the cap dies after each of its effects (the deadline row,
    the order's transaction, the index, the join, the log, the row's delete). The client retries
    with its Idempotency-Key (a replay joins it again), or does not: the Supervisor finds the
    order's deadline row and joins it. Either way it runs once its turn comes, and only once."""
    bus = RecordingBus()
    rt = make_runtime(bus=bus, customer_max_in_flight=1)
    first = order_of(rt, A)["orderId"]
    rt.crash_at = k
    with pytest.raises(Crash):
        order_of(rt, A, key="the-waiter")
    later = order_of(rt, A)["orderId"]  # a later order: it must not pass the waiter
    if retried:
        again = order_of(rt, A, key="the-waiter")
        assert again["processState"] == "Pending"
        waiter = str(again["orderId"])
    else:
        rt.clock.advance(ORPHAN_HOLDER_AGE.total_seconds())  # the deadline row falls due (and an orphan's)
        sweep(rt)
        orders = {pk for (table, pk, rk) in rt.store.snapshot() if table == "state" and rk == STATE_ROW}
        waiter = next(iter(orders - {first, later}), None)
    agents = AgentSim(rt)
    if waiter is None:  # crashed before the order's transaction, and no retry: no order was accepted
        pump(rt, agents, [first, later], cap=1)
        assert_room_empty(rt)
        return
    pump(rt, agents, [first, waiter, later], cap=1)
    for oid in (first, waiter, later):
        assert state(rt, oid)["ProcessState"] == "Processed"
    started = {oid: kinds(rt, oid).index("admitted") if "admitted" in kinds(rt, oid) else -1
               for oid in (waiter, later)}
    assert started[waiter] >= 0 and started[later] >= 0
    # in submission order: the later order did not pass the waiter (unless the waiter's first
    # submission died before its order was written: then its retry is the later submission)
    accepted = sorted((waiter, later), key=lambda o: rt.store.read_row(o, ORDER_ROW)["CreatedAt"])
    assert sorted(accepted, key=bus.admissions.index) == accepted
    assert_room_empty(rt)


def test_a_crash_at_the_door_after_taking_a_slot_frees_it_after_the_orphan_age() -> None:
    """The submission took a slot, then died before its order was written (and its client never
    retried): a slot held by no order. The room's watch (the room has a waiter) frees it once it is
    ORPHAN_HOLDER_AGE old, and the waiter runs."""
    rt = make_runtime(customer_max_in_flight=1)
    assert rooms.enter(rt.store, room_partition(A), "d" * 32, 1, rt.clock())
    waiter = order_of(rt, A)
    assert waiter["processState"] == "Pending"
    pump(rt, AgentSim(rt), [waiter["orderId"]], cap=1, rounds=200)
    assert state(rt, waiter["orderId"])["ProcessState"] == "Processed"
    assert_room_empty(rt)


def crash_once(rt: Any, k: int, handle: Callable[..., Any], message: OutMessage, redelivered: bool) -> None:
    """``message`` handled with a crash after ``k`` effects, then (``redelivered``) handled again,
    as the queue delivers it again; not again, as if it was lost."""
    rt.crash_at = k
    try:
        handle(rt, json.dumps(message.body).encode(), message_id=message.message_id)
    except Crash:
        if redelivered:
            handle(rt, json.dumps(message.body).encode(), message_id=message.message_id)
    rt.crash_at = None


def _last_reply(rt: Any, agents: AgentSim, oid: str) -> OutMessage:
    """The order driven to its last reply, which is returned unhandled."""
    for _ in range(20):
        deliver_schedules(rt)
        agents.work(rt.clock())
        msgs = [m for m in agents.pending_replies if m.body["orderId"] == oid]
        if msgs and msgs[0].body["step"] == "create-shipment":
            agents.pending_replies.remove(msgs[0])
            return msgs[0]
        agents.reply_all()
    raise AssertionError("no last reply")


@pytest.mark.parametrize("redelivered", [True, False], ids=["redelivered", "lost"])
@pytest.mark.parametrize("k", range(8))
def test_a_crash_as_a_holder_ends_still_admits_the_next(k: int, redelivered: bool) -> None:
    """The holder's last reply (Processed: the transaction, the index, the room left, the row's
    delete) dies after each effect; the reply is redelivered (a duplicate) or not. The slot is given
    back all the same: by the reply's own leave, or by the Supervisor when the order's deadline row
    falls due (an ended order's row: re-indexed and left). The waiter runs."""
    rt = make_runtime(customer_max_in_flight=1)
    agents = AgentSim(rt)
    first, second = order_of(rt, A)["orderId"], order_of(rt, A)["orderId"]
    last = _last_reply(rt, agents, first)
    crash_once(rt, k, handle_reply, last, redelivered)
    assert state(rt, first)["ProcessState"] == ("Processed" if k or redelivered else "Processing")
    pump(rt, agents, [first, second], cap=1)
    assert state(rt, second)["ProcessState"] == "Processed"
    assert_room_empty(rt)


@pytest.mark.parametrize("redelivered", [True, False], ids=["redelivered", "lost"])
@pytest.mark.parametrize("k", range(6))
def test_a_crash_in_an_admission_still_starts_the_order_once(k: int, redelivered: bool) -> None:
    """The admission's claim (its deadline row, the claim's transaction, the request) dies after
    each effect; the admission is redelivered, or lost: the room's watch sends it again a watch
    period after the slot was given (under its own id), or the Supervisor redrives the claimed
    order at its deadline."""
    rt = make_runtime(customer_max_in_flight=1)
    agents = AgentSim(rt)
    first, second = order_of(rt, A)["orderId"], order_of(rt, A)["orderId"]
    drive(rt, first, agents, until=lambda st: st["ProcessState"] == "Processed")
    [admission] = rt.bus.take("scheduler")
    crash_once(rt, k, handle_schedule, admission, redelivered)
    pump(rt, agents, [second], cap=1)
    assert state(rt, second)["ProcessState"] == "Processed"
    assert [c for c in agents.calls if c[0] == second] == [(second, "reserve-inventory", "reserve"),
                                                           (second, "charge-payment", "charge"),
                                                           (second, "create-shipment", "ship")]
    assert_room_empty(rt)


def test_an_admission_lost_between_the_rooms_write_and_its_send_is_sent_by_the_watch() -> None:
    """The slot is given (the room's transaction) but the admission's send fails (the process
    dying there is the same): the waiter holds a slot and waits. The room's watch, a watch period
    later, sends it again."""
    rt = make_runtime(customer_max_in_flight=1)
    agents = AgentSim(rt)
    first, second, third = (order_of(rt, A)["orderId"] for _ in range(3))
    rt.bus.fail.add("scheduler")
    drive(rt, first, agents)
    rt.bus.fail.clear()
    assert second in room(rt)[0].holders and state(rt, second).get("WaitingRoom")
    assert not rt.bus.peek("scheduler")
    rt.clock.advance(WATCH_PERIOD.total_seconds() * 2 + 1)
    report = sweep(rt)
    assert report.acted.get("room.resent") == 1
    pump(rt, agents, [second, third], cap=1)
    assert_room_empty(rt)


def test_a_slot_whose_leave_failed_is_freed_by_the_watch() -> None:
    """The room cannot be written when the holder ends (the leave fails: the order's deadline row
    is kept), and that row is then lost too: the room's watch finds the holder ended and frees it."""
    rt = make_runtime(customer_max_in_flight=1)
    agents = AgentSim(rt)
    first, second = order_of(rt, A)["orderId"], order_of(rt, A)["orderId"]
    with room_refused(rt):
        drive(rt, first, agents)
    for row in list(rt.store.index_rows()):  # the kept deadline row, lost as well
        if row.get("OrderId") == first:
            rt.store.delete_index(row["PartitionKey"], row["RowKey"])
    assert first in room(rt)[0].holders
    pump(rt, agents, [second], cap=1)
    assert state(rt, second)["ProcessState"] == "Processed"
    assert_room_empty(rt)


def test_turning_the_cap_off_lets_the_waiters_go() -> None:
    rt = make_runtime(customer_max_in_flight=1)
    oids = [order_of(rt, A)["orderId"] for _ in range(4)]
    # the setting turned off (a new runtime on the same store): the room's watch admits every waiter
    rt2 = make_runtime(store=rt.store, bus=rt.bus, clock=rt.clock, customer_max_in_flight=0)
    rt2.clock.advance(WATCH_PERIOD.total_seconds() * 2 + 1)
    sweep(rt2)
    assert set(room(rt2)[0].holders) == set(oids) and room(rt2)[1] == []
    pump(rt2, AgentSim(rt2), oids, cap=4)


def test_the_watch_due_is_a_window_every_waiter_of_it_shares() -> None:
    from shared.core.room import watch_due, watch_of, watch_row_key

    due = watch_due(T0 + timedelta(seconds=5))
    assert due == watch_due(T0 + timedelta(seconds=29)) == T0 + 2 * WATCH_PERIOD
    assert watch_of(watch_row_key("room-abc", due)) == "room-abc" and watch_of("breaker:x:1:2") is None


def test_a_replay_that_took_a_slot_for_an_order_that_needs_none_gives_it_back() -> None:
    """The client sends an order again with its Idempotency-Key after it ended (or from before the
    cap): the door gives the replay a slot before the create finds the order there; the replay gives
    it back. A replay of an order that holds its slot keeps it (one holder, not two)."""
    rt = make_runtime(customer_max_in_flight=2)
    ended = order_of(rt, A, key="ended")["orderId"]
    drive(rt, ended, AgentSim(rt))
    running = order_of(rt, A, key="running")["orderId"]
    before = make_runtime(store=rt.store, bus=rt.bus, clock=rt.clock, customer_max_in_flight=0)
    uncapped = order_of(before, A, key="uncapped")["orderId"]
    for key, oid in (("running", running), ("ended", ended), ("uncapped", uncapped)):
        again = order_of(rt, A, key=key)
        assert again["orderId"] == oid
    assert set(room(rt)[0].holders) == {running}


def test_an_admission_the_watch_itself_gives_and_fails_to_send_is_sent_by_the_next_watch() -> None:
    """The watch frees an orphan slot and admits the waiter, but the admission's send fails (the
    bus down for a moment): the admitted order holds a slot and waits, with no waiter left. The
    watch puts its next row all the same (an admitted order not started is watched until it
    starts), and that one sends the admission again."""
    rt = make_runtime(customer_max_in_flight=1)
    assert rooms.enter(rt.store, room_partition(A), "d" * 32, 1, rt.clock())  # a door's orphan slot
    waiter = order_of(rt, A)["orderId"]
    rt.clock.advance(ORPHAN_HOLDER_AGE.total_seconds() + WATCH_PERIOD.total_seconds() * 2)
    rt.bus.fail.add("scheduler")
    report = sweep(rt)
    rt.bus.fail.clear()
    assert report.acted.get("room.freed") == 1 and set(room(rt)[0].holders) == {waiter}
    pump(rt, AgentSim(rt), [waiter], cap=1)
    assert state(rt, waiter)["ProcessState"] == "Processed"
    assert_room_empty(rt)


def test_a_watch_that_frees_a_slot_still_watches_an_admitted_order_not_started_yet() -> None:
    """Two holders ended: the first's leave was lost (its deadline row too); the second's leave
    admits the waiter, whose admission's send fails. The watch, a second later, frees the first; the
    waiter, admitted less than a watch period ago, is not told again yet: the watch must come back
    for it (one slot freed does not cover one holder not started)."""
    rt = make_runtime(customer_max_in_flight=2)
    agents = AgentSim(rt)
    first, second, third = (order_of(rt, A)["orderId"] for _ in range(3))
    with room_refused(rt):
        drive(rt, first, agents)
        drive(rt, second, agents)  # both ended; their leaves failed
    for row in list(rt.store.index_rows()):  # their kept deadline rows, lost as well
        if row.get("OrderId") in (first, second):
            rt.store.delete_index(row["PartitionKey"], row["RowKey"])
    [watch] = [IndexRow.from_entity(r) for r in rt.store.index_rows() if str(r["RowKey"]).startswith("room:")]
    assert watch.due is not None and rt.clock() < watch.due - timedelta(seconds=1)
    rt.clock.now = watch.due - timedelta(seconds=1)
    rt.bus.fail.add("scheduler")
    rooms.leave(rt.store, rt.bus, LeaveRoom(room_partition(A), second, None, rt.clock()))  # the second's leave
    rt.bus.fail.clear()
    assert set(room(rt)[0].holders) == {first, third} and not room(rt)[1]
    rt.clock.advance(1)
    assert sweep(rt).acted.get("room.freed") == 1  # the first's slot; the third admitted a second ago
    assert set(room(rt)[0].holders) == {third}
    pump(rt, agents, [third], cap=2)
    assert state(rt, third)["ProcessState"] == "Processed"
    assert_room_empty(rt)


def test_a_key_reused_for_another_customer_gives_back_the_slot_it_took_at_that_customers_door() -> None:
    """A's order waits under its Idempotency-Key; the key is sent again with a body of customer B
    (409). The door gave the request a slot in B's room first: it is given back, not kept for an
    order that waits in A's room (B's room has no waiter, hence no watch to free it)."""
    rt = make_runtime(customer_max_in_flight=1)
    order_of(rt, A)
    waiting = order_of(rt, A, key="shared-key")
    assert waiting["processState"] == "Pending"
    r = post(rt, {**BODY, "customerId": B}, headers={"Idempotency-Key": "shared-key"})
    assert r.status == 409
    assert_room_empty(rt, B)
    assert order_of(rt, B)["processState"] == "Processing"


def test_a_waiting_order_whose_workflow_is_gone_is_still_joined_then_held_once_admitted() -> None:
    """A waiting order's submission died before it joined, and its workflow version was then
    dropped (unsafe, but survivable: docs/workflows.md). Joining needs no workflow: the Supervisor
    joins it (not an error on every sweep, the order never joined); once admitted it is held with
    the reason, and gives its slot back."""
    from shared.core.workflows import Registry, load_registry

    rt = make_runtime(registry=load_registry(), customer_max_in_flight=1)
    first = order_of(rt, A)["orderId"]
    rt.crash_at = 2  # its deadline row and the order's transaction: accepted, not joined
    rt.clock.advance(0.001)
    with pytest.raises(Crash):
        post(rt, {**BODY, "customerId": A, "workflow": "digital"}, headers={"Idempotency-Key": "d"})
    waiter = next(pk for (table, pk, rk) in rt.store.snapshot()
                  if table == "state" and rk == STATE_ROW and pk != first)
    gone = make_runtime(store=rt.store, bus=rt.bus, clock=rt.clock, customer_max_in_flight=1,
                        registry=Registry.of([wf for wf in load_registry().all() if wf.name != "digital"]))
    gone.clock.advance(gone.config.index_floor().total_seconds() + 1)
    report = sweep(gone)
    assert not report.errors and report.acted.get("joinedRoom") == 1
    assert [w.order_id for w in room(gone)[1]] == [waiter]
    pump(gone, AgentSim(gone), [first, waiter], cap=1)
    assert state(gone, first)["ProcessState"] == "Processed" and state(gone, waiter)["Mode"] == "held"
    assert_room_empty(gone)
