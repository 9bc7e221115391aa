"""Random interleavings (hypothesis): messages delivered late, twice or never, handlers crashing
between writes, time jumping, supervisors sweeping. After every action the rows must be
consistent; once the faults stop, every order must settle in a terminal state with its
compensations matching what the state recorded as done, in reverse order. Each run has an order
of three shipped workflows in flight at once (order v1, digital v1 with its own steps, timeouts,
pivot and MaxFailureCount, and express v1, whose first step is a parallel one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from shared.api.operator import resume_order, suspend_order
from shared.core.statemachine import Lease, LeaseKind
from shared.core.workflows import Registry, Workflow, load_registry
from shared.scheduler import handle_reply, handle_schedule
from shared.supervisor import sweep
from tests.unit.harness import BODY, WORKFLOW, AgentSim, Crash, drive, make_runtime, post, state

ACTIONS = st.lists(st.tuples(st.integers(0, 10), st.integers(0, 7)), min_size=5, max_size=60)
REJECT = st.sampled_from([{}, {}, {"create-shipment": "no"}, {"charge-payment": "declined"},
                          {"reserve-inventory": "out of stock"}, {"create-shipment": "no",
                                                                  "charge-payment:compensate": "refused"},
                          {"deliver": "undeliverable"}, {"reserve-licence": "none left"},
                          {"deliver": "no", "reserve-licence:compensate": "refused"}])

# lost: the step's effect is applied but its reply never comes (it times out to MaxFailureCount
# with its outcome unknown, and must be compensated all the same)
LOST = st.sampled_from([set(), set(), set(), {"charge-payment"}, {"reserve-inventory"}, {"reserve-licence"}])

COMP = {"charge-payment": "refund", "reserve-inventory": "release", "reserve-licence": "release-licence"}
FORWARD = ("reserve", "charge", "reserve-licence")  # the operations with an effect to undo
QUEUES = ["scheduler", "agent-inventory", "agent-payment", "agent-shipping", "agent-delivery"]
DIGITAL = load_registry().get("digital", 1)
EXPRESS = load_registry().get("express", 1)
# a parallel step's name -> its branches
GROUPS = {g: {s.name for s in EXPRESS.steps if s.group == g} for g in {s.group for s in EXPRESS.steps} if g}

# Uneven step timeouts and a short grace period: the deadline index's floor rule (one row per
# order covers every later deadline) must hold when a later step's timeout is the shorter one.
UNEVEN = tuple(replace(s, timeout_seconds=t) for s, t in zip(WORKFLOW, (60, 12, 24), strict=True))
SHAPES = st.sampled_from([{}, {"order": UNEVEN, "grace_seconds": 18.0}])


def runtime(shape: dict[str, Any]) -> Any:
    """Both workflows loaded (order v1 with the shape's steps), MaxFailureCount 4 by default."""
    order = Workflow("order", 1, shape.get("order", WORKFLOW))
    extra = {k: v for k, v in shape.items() if k != "order"}
    return make_runtime(max_failures=4, registry=Registry.of([order, DIGITAL, EXPRESS]), **extra)


def deliver(rt: Any, queue: str, crash_at: int | None, keep: bool, agent: Callable[[Any], None]) -> None:
    """The first message of ``queue``: a request to ``agent``, or a scheduler message handled with
    a crash after ``crash_at`` effects (then redelivered later, unless ``keep``: a duplicate)."""
    msgs = rt.bus.sent.get(queue) or []
    if not msgs:
        return
    msg = msgs[0] if keep else msgs.pop(0)
    if queue != "scheduler":
        agent(msg)
        return
    rt.crash_at = crash_at
    try:
        handle_schedule(rt, json.dumps(msg.body).encode())
    except Crash:
        if not keep:
            msgs.insert(0, msg)  # crashed: the message is redelivered later


def reply(rt: Any, agents: AgentSim, crash_at: int | None, keep: bool) -> None:
    """The first pending reply, handled with a crash after ``crash_at`` effects (as ``deliver``)."""
    if not agents.pending_replies:
        return
    msg = agents.pending_replies[0] if keep else agents.pending_replies.pop(0)
    rt.crash_at = crash_at
    try:
        handle_reply(rt, json.dumps(msg.body).encode())
    except Crash:
        if not keep:
            agents.pending_replies.insert(0, msg)


def check_rows(rt: Any, oid: str) -> None:
    rows = rt.store.read_partition(oid)
    state = rows["state"]
    steps = sorted((r for k, r in rows.items() if k.startswith("step-")), key=lambda r: r["Index"])
    running = {s["Name"] for s in steps if s["State"] == "Running"}
    assert len(running) <= 1 or any(running <= branches for branches in GROUPS.values()), running
    assert sum(1 for s in steps if s.get("Compensation") == "Running") <= 1
    lease = Lease.parse(state.get("LeaseKey"))
    if state.get("LockedBy") and lease is not None and lease.step in GROUPS:
        # a parallel step in flight: only its branches run, at most at the lease's attempt
        assert lease.kind is LeaseKind.STEP and running <= GROUPS[lease.step], (state, running)
        assert all(s["Attempt"] <= lease.attempt for s in steps if s["Name"] in running)
        assert state["ProcessState"] == "Processing"
    elif state.get("LockedBy"):
        assert lease is not None and not lease.is_unclaimed, state
        name, attempt = lease.step, lease.attempt
        row = next(s for s in steps if s["Name"] == name)
        if lease.kind is LeaseKind.STEP:
            assert (row["State"], row["Attempt"]) == ("Running", attempt)
            assert state["ProcessState"] == "Processing"
        else:
            assert (row["Compensation"], row["CompensationAttempt"]) == ("Running", attempt)
            assert state["ProcessState"] == "Error"
    else:
        assert not any(s["State"] == "Running" for s in steps), (state, steps)
    if state["ProcessState"] == "Processed":
        assert all(s["State"] == "Done" for s in steps) and not state.get("LockedBy")
    if state.get("WaitingRoom") and state["ProcessState"] == "Pending" and state["Mode"] == "forward":
        check_waiting_room(rt, oid, state)
        return
    # the index covers whatever is in flight: a row of the order due no later than its deadline
    if state.get("LeaseKey"):
        from shared.core.times import parse_iso

        dues = [parse_iso(r["Due"]) for r in rt.store.index_rows() if r.get("OrderId") == oid]  # (a watch: none)
        deadline = parse_iso(state["CompleteBy"])
        assert deadline is not None and any(d is not None and d <= deadline for d in dues), (state, dues)


def check_waiting_room(rt: Any, oid: str, state: dict[str, Any]) -> None:
    """An order waiting for its customer's room has nothing in flight and no deadline: it is covered
    by its own deadline row (until it has joined the waiters), or by its waiter row (or the slot it
    was given) and the room's watch row."""
    from shared.core.room import WATCH_PREFIX
    from shared.runtime.rooms import read_room

    rows = rt.store.index_rows()
    own = [r for r in rows if r.get("OrderId") == oid]
    room, waiters = read_room(rt.store, state["Room"], 100)
    joined = oid in room.holders or any(w.order_id == oid for w in waiters)
    watched = any(str(r["RowKey"]).startswith(f"{WATCH_PREFIX}{state['Room']}:") for r in rows)
    assert own or (joined and watched), (state, own, joined, watched)
    assert state["LeaseKey"] == "unclaimed" and not state.get("LockedBy") and not state.get("CompleteBy")


def _applied_order(step: dict[str, Any]) -> tuple[int, float, int]:
    """A step row's place in the order effects were applied (``groups.rank``): its index, or its
    group's first index and when it finished (not finished: last)."""
    from shared.core.times import parse_iso

    group = next((g for g, names in GROUPS.items() if step["Name"] in names), None)
    if group is None:
        return (step["Index"], 0.0, step["Index"])
    first = next(i for i, s in enumerate(EXPRESS.steps) if s.group == group)
    value = step.get("FinishedAt")
    finished = parse_iso(value) if isinstance(value, str) else value
    return (first, finished.timestamp() if finished is not None else float("inf"), step["Index"])


def check_suspended(rt: Any, oid: str) -> None:
    """A suspended order dispatches no new step: no ``dispatched`` since its last ``suspended``,
    unless an ``unsuspended`` (or a retry, which runs it unsuspended) came after it."""
    from tests.unit.core.statemachine.test_operator import kinds

    history = kinds(rt, oid)
    if "suspended" not in history:
        return
    since = history[len(history) - 1 - history[::-1].index("suspended"):]
    if not any(k in since for k in ("unsuspended", "retried", "restarted")):
        assert "dispatched" not in since, history


@pytest.mark.parametrize("echo_fence", [True, False], ids=["token", "no-token"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, reject=REJECT, lost=LOST, shape=SHAPES)
def test_random_faults_converge(actions: list[tuple[int, int]], reject: dict[str, str], lost: set[str],
                                shape: dict[str, Any], echo_fence: bool) -> None:
    """``echo_fence``: agents echo the requests' fencing tokens (replies decided without a read
    while nothing else wrote), or drop them (every reply decided on a read)."""
    rt = runtime(shape)
    agents = AgentSim(rt, reject=dict(reject), lost=set(lost), echo_fence=echo_fence)
    orders = [post(rt).body["orderId"], post(rt, {**BODY, "workflow": "digital"}).body["orderId"],
              post(rt, {**BODY, "workflow": "express"}).body["orderId"]]
    queues = QUEUES

    def deliver_one(queue: str, crash_at: int | None, keep: bool) -> None:
        # an agent's request: checked for its token (harness.check_token)
        deliver(rt, queue, crash_at, keep, lambda msg: agents._handle(msg, rt.clock()))

    def reply_one(crash_at: int | None, keep: bool) -> None:
        reply(rt, agents, crash_at, keep)

    for action, arg in actions:
        if action == 0:
            deliver_one(queues[arg % len(queues)], None, keep=False)
        elif action == 1:
            deliver_one(queues[arg % len(queues)], None, keep=True)  # duplicate delivery
        elif action == 2:
            reply_one(None, keep=False)
        elif action == 3:
            reply_one(None, keep=True)  # duplicate reply
        elif action == 4:
            q = queues[arg % len(queues)]
            if rt.bus.sent.get(q):
                rt.bus.sent[q].pop(0)  # lost message
            elif agents.pending_replies:
                agents.pending_replies.pop(0)
        elif action == 5:
            rt.clock.advance(arg * 6)
        elif action == 6:
            sweep(rt)
        elif action == 7:
            deliver_one("scheduler", arg, keep=False)  # crash after arg effects
        elif action == 8:
            reply_one(arg, keep=False)
        elif action == 9:
            suspend_order(rt, orders[arg % 3])  # an operator; 409 where it does not apply
        else:
            resume_order(rt, orders[arg % 3])
        rt.crash_at = None
        for oid in orders:
            check_rows(rt, oid)
            check_suspended(rt, oid)
    for oid in orders:  # the operator resumes what is still suspended
        if state(rt, oid).get("Suspended"):
            resume_order(rt, oid)

    for oid in orders:
        final = drive(rt, oid, agents, max_rounds=400)
        check_rows(rt, oid)
        rows = rt.store.read_partition(oid)
        steps = sorted((r for k, r in rows.items() if k.startswith("step-")), key=lambda r: r["Index"])
        mine = [c for c in agents.calls if c[0] == oid]
        assert len(mine) == len(set(mine))
        comps = [c[2] for c in mine if c[2] in COMP.values()]
        if final["ProcessState"] == "Processed":
            assert comps == []
        elif final["Mode"] == "held":
            # a step whose policy is hold (digital's deliver), or a timed-out step with nothing
            # to undo (the pivot): held for an operator, nothing compensated
            held = next(s for s in steps if s["Name"] == final["FailedStep"])
            assert held["Name"] in ("deliver", "create-shipment") and comps == [], (final, mine)
        else:
            assert final["ProcessState"] == "Error" and final["Mode"] == "finished"
            # Every effect the remotes applied is undone, in reverse order: the Done steps' and
            # that of a step which timed out after its effect was applied (reply lost).
            applied = {c[1] for c in mine if c[2] in FORWARD}
            done = [s["Name"] for s in reversed(steps) if s["State"] == "Done" and s["Name"] in COMP]
            assert set(done) <= applied
            # reverse order of application: a parallel step's branches by when each finished
            undo = [s["Name"] for s in sorted(steps, key=_applied_order, reverse=True) if s["Name"] in applied]
            expected = [COMP[n] for n in undo if not reject.get(f"{n}:compensate")]
            assert comps == expected, (mine, steps)
            assert all(s["Compensation"] in ("Done", "Failed") for s in steps if s["Name"] in undo)
            # a step that failed by an error reply is never compensated
            assert all(not s["Compensation"] for s in steps
                       if s["State"] == "Failed" and not s.get("OutcomeUnknown"))
        assert final["FailureCount"] <= 4
        workflow = rows["order"].get("Workflow", "order")
        event(f"{workflow}: final {final['ProcessState']}/{final.get('Outcome')}, "
              f"failures {min(final['FailureCount'], 1)}")


# ---- waits on an open breaker ---------------------------------------------------------------------
WAIT_ACTIONS = st.lists(st.tuples(st.integers(0, 10), st.integers(0, 7)), min_size=5, max_size=60)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=WAIT_ACTIONS)
def test_random_waits_on_a_breaker_hold_one_wait_and_settle(actions: list[tuple[int, int]]) -> None:
    """The shipping remote goes down and up at random while its agent registers each request
    as waiting and replies ``waiting`` (claiming the wake-up), probes and closers' resumes come
    late, twice or never, handlers crash, time jumps and the Supervisor sweeps. After every
    action: a waiting step keeps the attempt it started waiting on, the state row names the wait
    only while the step does, and no order has two waiting rows. Once the remote is back and the
    closer has run, every order settles, and its history holds no more waits than there were
    closes and redrives to start them: probes add nothing."""
    run_breaker_schedule(actions)


# Idempotency-Keys whose order ids sort in posting order: the closer lists the waiting rows by key,
# so the first resume is the first order's, as is the first waiting reply (the failing draws).
KEYS = ("shipment-1", "shipment-2")


def test_copies_of_a_waiting_reply_and_of_its_close_start_no_new_wait() -> None:
    """The schedule hypothesis found: the closer's resume overtakes the waiting reply, the
    breaker opens again, and the resume and the old waiting reply are each delivered three times.
    Before the replies said which opening they read, every copy of the old reply recorded a new
    wait and every copy of the resume ended one: 4 ``stepWaiting`` for 2 closes."""
    run_breaker_schedule([(9, 0), (10, 0), (9, 0), (1, 0), (3, 0), (0, 1), (1, 0), (3, 0), (0, 0), (2, 0)], KEYS)


def test_a_copy_of_a_waiting_reply_after_its_close_keeps_the_deadline_covered() -> None:
    """The other schedule hypothesis found: a copy of the waiting reply came after the close had
    ended its wait, 300 s after the first wait, and set CompleteBy back before the deadline index
    row the sweep had just put."""
    run_breaker_schedule([(9, 0), (10, 0), (3, 0), (5, 1), (5, 7), (5, 7), (0, 0), (6, 0), (2, 0)], KEYS)


def run_breaker_schedule(actions: list[tuple[int, int]], keys: tuple[str, str] | None = None) -> None:
    """One schedule of :func:`test_random_waits_on_a_breaker_hold_one_wait_and_settle`; ``keys``:
    the orders' Idempotency-Keys (None: random order ids)."""
    from datetime import timedelta

    from shared.core.breaker.waiting import WaitingStep, waiting_partition
    from shared.runtime.resume import resume_waiting
    from shared.storage.waiting import register_waiting
    from tests.unit.core.statemachine.test_operator import kinds

    s = "create-shipment"
    rt = runtime({})
    agents = AgentSim(rt)
    orders = [post(rt, headers={"Idempotency-Key": key} if key else None).body["orderId"]
              for key in keys or (None, None)]
    down, closes = True, 0
    waited_on: dict[str, int] = {}  # order -> the attempt its step started waiting on

    def agent(msg: Any) -> None:
        body = msg.body
        if down and body["step"] == s and body["kind"] == "step":
            register_waiting(rt.store, "shipping", WaitingStep(body["orderId"], body["attempt"], s), rt.clock())
            until = rt.clock() + timedelta(seconds=5)
            # the opening it reads: the one after the last close (a close ends an opening)
            agents._reply(msg, {"outcome": "waiting", "breaker": "shipping", "until": until.isoformat(),
                                "wake": True, "opening": closes + 1})
        else:
            agents._handle(msg, rt.clock())

    def handle(queue: str, crash_at: int | None, keep: bool) -> None:
        deliver(rt, queue, crash_at, keep, agent)

    def close() -> None:
        nonlocal closes
        closes += 1
        resume_waiting(rt.store, rt.bus, "scheduler", "shipping", closes)

    queues = ["scheduler", "agent-shipping", "agent-inventory", "agent-payment"]
    for _ in range(10):  # both orders up to their shipping request, left in its queue
        for q in queues[2:]:
            while rt.bus.sent.get(q):
                agent(rt.bus.sent[q].pop(0))
        agents.reply_all()
    assert all(state(rt, oid)["LeaseKey"] == f"{s}:1" for oid in orders)
    while rt.bus.sent.get("agent-shipping"):  # the remote is down: their waiting replies are pending
        agent(rt.bus.sent["agent-shipping"].pop(0))
    for action, arg in actions:
        if action in (0, 1):
            handle(queues[arg % len(queues)], None, keep=action == 1)
        elif action in (2, 3):
            reply(rt, agents, None, keep=action == 3)
        elif action == 4:
            q = queues[arg % len(queues)]
            if rt.bus.sent.get(q):
                rt.bus.sent[q].pop(0)  # lost
        elif action == 5:
            rt.clock.advance(arg * 20)
        elif action == 6:
            sweep(rt)
        elif action == 7:
            handle("scheduler", arg, keep=False)  # crash after arg effects
        elif action == 8:
            reply(rt, agents, arg, keep=False)
        elif action == 9:
            down = not down
        elif not down:
            close()
        rt.crash_at = None
        rows = [WaitingStep.from_row_key(k) for k, _ in rt.store.partition_keys(waiting_partition("shipping"), 100)]
        for oid in orders:
            check_rows(rt, oid)
            step, st_row = rt.store.read_row(oid, "step-02-create-shipment"), state(rt, oid)
            if step is not None and step.get("WaitingOn"):
                assert step["Attempt"] == waited_on.setdefault(oid, step["Attempt"]), "a wait moved the attempt"
            else:
                waited_on.pop(oid, None)
                assert not st_row.get("WaitingOn"), st_row
            assert sum(1 for r in rows if r.order_id == oid) <= 1, rows

    down = False
    close()
    for oid in orders:
        final = drive(rt, oid, agents, max_rounds=400)
        check_rows(rt, oid)
        history = kinds(rt, oid)
        redrives = sum(1 for e in history if e == "redriven")
        assert history.count("stepWaiting") <= 1 + closes + redrives, history
        assert final["Mode"] in ("finished", "held")
        waits = min(history.count("stepWaiting"), 2)
        if currently_in_test_context():  # not in the fixed schedules' own tests
            event(f"waits: final {final['ProcessState']}/{final.get('Outcome')}, waits {waits}")
    close()
    assert rt.store.partition_keys(waiting_partition("shipping"), 100) == []


# ---- waits for events, and delays -------------------------------------------------------------------
EVENT_ACTIONS = st.lists(st.tuples(st.integers(0, 11), st.integers(0, 7)), min_size=5, max_size=60)
EVENT_BODIES = ({"approved": True}, {"approved": False}, {"approved": True, "note": "again"})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=EVENT_ACTIONS, on_timeout=st.sampled_from(["compensate", "hold", "continue"]),
       reject=st.sampled_from([{}, {}, {"charge-payment": "declined"}, {"create-shipment": "no"}]))
def test_random_events_and_timers_settle_and_never_run_a_step_twice(
        actions: list[tuple[int, int]], on_timeout: str, reject: dict[str, str]) -> None:
    """Two orders of a workflow with a wait for ``approval`` (a decision field, a 2-minute
    timeout and a drawn onTimeout) and a 1-minute delay before the shipment. Events come early
    (before the wait starts), late, twice, with the same key or a different body, declining or
    approving; wake-ups and every other message are delivered late, twice or never, handlers
    crash, time jumps, the Supervisor sweeps, an operator suspends and resumes. After every
    action the rows are consistent; once the faults stop, every order settles, each remote effect
    applied at most once, the wait ended by at most one event (the first one accepted), and the
    order's end is the one that event (or the timeout's policy) leads to."""
    from datetime import timedelta

    from shared.api.operator import send_event
    from shared.core.workflows import Step
    from tests.unit.core.statemachine.test_operator import kinds
    from tests.unit.harness import JSON_HEADERS

    wait = Step("approval", "", "", 120, kind="wait", event="approval", decision="approved",
                on_timeout=on_timeout)  # type: ignore[arg-type]
    cool = Step("cool", "", "", 0, kind="delay", delay=timedelta(minutes=1))
    flow = Workflow("order", 1, (WORKFLOW[0], wait, WORKFLOW[1], cool, WORKFLOW[2]))
    rt = make_runtime(max_failures=4, registry=Registry.of([flow]))
    agents = AgentSim(rt, reject=dict(reject))
    orders = [post(rt).body["orderId"] for _ in range(2)]
    accepted: dict[str, dict[str, Any]] = {}  # order -> the body of the event that was taken first
    queues = ["scheduler", "agent-inventory", "agent-payment", "agent-shipping"]

    def send(oid: str, body: dict[str, Any], key: str | None) -> None:
        r = send_event(rt, oid, "approval", json.dumps(body).encode(),
                       {**JSON_HEADERS, **({"Idempotency-Key": key} if key else {})})
        assert r.status in (202, 409), r.body
        if r.status == 202 and r.body["result"] != "event-duplicate":
            assert oid not in accepted, ("a second event was taken", accepted[oid], body)
            accepted[oid] = body

    for action, arg in actions:
        oid = orders[arg % 2]
        if action in (0, 1):
            deliver(rt, queues[arg % len(queues)], None, action == 1, lambda m: agents._handle(m, rt.clock()))
        elif action in (2, 3):
            reply(rt, agents, None, keep=action == 3)
        elif action == 4:
            q = queues[arg % len(queues)]
            if rt.bus.sent.get(q):
                rt.bus.sent[q].pop(0)  # lost (a wake-up too)
        elif action == 5:
            rt.clock.advance(arg * 9)
        elif action == 6:
            sweep(rt)
        elif action == 7:
            deliver(rt, "scheduler", arg, False, lambda m: agents._handle(m, rt.clock()))  # crash after arg
        elif action == 8:
            send(oid, EVENT_BODIES[arg % 3], None)
        elif action == 9:
            send(oid, EVENT_BODIES[arg % 3], f"key-{arg % 2}")
        elif action == 10:
            suspend_order(rt, oid)
        else:
            resume_order(rt, oid)
        rt.crash_at = None
        for o in orders:
            check_rows(rt, o)
            check_suspended(rt, o)
    for oid in orders:
        if state(rt, oid).get("Suspended"):
            resume_order(rt, oid)

    for oid in orders:
        final = drive(rt, oid, agents, max_rounds=400)
        check_rows(rt, oid)
        rows = rt.store.read_partition(oid)
        approval = next(r for k, r in rows.items() if k.startswith("step-") and r["Name"] == "approval")
        history = kinds(rt, oid)
        assert history.count("eventReceived") == (1 if oid in accepted else 0), history
        assert history.count("waitTimedOut") <= 1 and not ("waitTimedOut" in history and oid in accepted
                                                           and approval["State"] == "Done"
                                                           and "timedOut" not in approval["Result"])
        mine = [c for c in agents.calls if c[0] == oid]
        assert len(mine) == len(set(mine)), mine  # each remote effect at most once
        ops = [c[2] for c in mine]
        body = accepted.get(oid)
        if approval["State"] == "Done":
            result = json.loads(approval["Result"])
            assert result == (body if body is not None else {"timedOut": True}), (result, body)
            assert body is None or body["approved"] is True
        if body is not None and body["approved"] is False:
            assert "charge" not in ops and (final["ProcessState"], final["Outcome"]) == ("Error", "failed"), ops
        if final["ProcessState"] == "Processed":
            assert ops == ["reserve", "charge", "ship"], ops
            assert body is not None or on_timeout == "continue"
        elif final["Mode"] == "held":
            assert "release" not in ops and "refund" not in ops
        else:
            applied = [op for op in ("reserve", "charge") if op in ops]
            assert [op for op in ops if op in ("refund", "release")] == [
                {"reserve": "release", "charge": "refund"}[op] for op in reversed(applied)], ops
        event(f"events ({on_timeout}): final {final['ProcessState']}/{final.get('Outcome')}, "
              f"event {'none' if body is None else body['approved']}")


# ---- a customer over its CustomerMaxInFlight ------------------------------------------------------
ROOM_ACTIONS = st.lists(st.tuples(st.integers(0, 10), st.integers(0, 7)), min_size=5, max_size=80)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ROOM_ACTIONS, reject=st.sampled_from([{}, {}, {"charge-payment": "declined"}]))
def test_random_faults_never_pass_a_customers_cap_and_every_waiter_runs(actions: list[tuple[int, int]],
                                                                         reject: dict[str, str]) -> None:
    """``CustomerMaxInFlight`` 2 and six orders of one customer (four wait), one of another: messages
    (admissions among them) delivered late, twice or never, handlers crashing between writes (the
    slot given, not yet told; the order ended, its slot not yet given back), time jumping, the
    Supervisor sweeping, an operator cancelling a waiting order, the scheduler queue refusing the
    admissions' sends for a while. After every action no more than 2
    of the customer's orders are past submission and not ended; once the faults stop, every order
    settles, each remote effect was applied once, and the room is empty (no slot leaked, no waiter
    left)."""
    from shared.api.operator import cancel_order
    from shared.core.room import room_partition
    from shared.runtime.rooms import read_room

    rt = make_runtime(max_failures=4, customer_max_in_flight=2)
    agents = AgentSim(rt, reject=dict(reject))
    mine = []
    for _ in range(6):
        rt.clock.advance(0.001)
        mine.append(post(rt, {**BODY, "customerId": "burst"}).body["orderId"])
    other = post(rt, {**BODY, "customerId": "other"}).body["orderId"]
    queues = ["scheduler", "agent-inventory", "agent-payment", "agent-shipping"]

    def in_flight() -> int:
        n = 0
        for oid in mine:
            st_ = state(rt, oid)
            waits = st_.get("WaitingRoom") and st_["ProcessState"] == "Pending" and st_["Mode"] == "forward"
            n += st_["Mode"] in ("forward", "compensate") and not waits
        return n

    for action, arg in actions:
        if action in (0, 1):
            deliver(rt, queues[arg % len(queues)], None, action == 1, lambda msg: agents._handle(msg, rt.clock()))
        elif action in (2, 3):
            reply(rt, agents, None, keep=action == 3)
        elif action == 4:
            q = queues[arg % len(queues)]
            if rt.bus.sent.get(q):
                rt.bus.sent[q].pop(0)  # lost (dead-lettered)
        elif action == 5:
            rt.clock.advance(arg * 8)
        elif action == 6:
            sweep(rt)
        elif action == 7:
            deliver(rt, "scheduler", arg, False, lambda msg: None)  # crash after arg effects
        elif action == 8:
            reply(rt, agents, arg, keep=False)
        elif action == 9:
            cancel_order(rt, mine[arg % len(mine)])  # 409 unless it waits (or is otherwise cancellable)
        else:  # the scheduler queue refusing sends meanwhile: admissions given (slots taken) but not sent
            rt.bus.fail.add("scheduler")
            try:
                sweep(rt) if arg % 2 else reply(rt, agents, None, keep=False)
            finally:
                rt.bus.fail.discard("scheduler")
        rt.crash_at = None
        assert in_flight() <= 2
        for oid in [*mine, other]:
            check_rows(rt, oid)
    for oid in [*mine, other]:
        drive(rt, oid, agents, max_rounds=600)
        assert in_flight() <= 2
    calls = [c for c in agents.calls]
    assert len(calls) == len(set(calls))
    room, waiters = read_room(rt.store, room_partition("burst"), 100)
    assert (dict(room.holders), waiters) == ({}, [])
    finals = [state(rt, oid) for oid in mine]
    event("waited and ran: " + str(sum(1 for f in finals if f["ProcessState"] == "Processed")))
