"""Webhooks when an order ends, end to end on the in-memory store and bus: every ending is told,
at least once, with the same webhook-id on every try; a crash at any point between the writes
loses nothing (the delivery's watch, the Supervisor's cover, sends it again); a delivery that gives
up is listed and can be sent again; with no WebhookUrl nothing is written or sent."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.api.operator import terminate_order
from shared.api.webhooks import list_deliveries, resend_delivery
from shared.core import webhooks
from shared.core.rows import STATE_ROW, Op, StateRow
from shared.core.statemachine.webhook import event_type
from shared.core.webhooks import HOOK_PREFIX, HookRow, HookWatch
from shared.runtime.webhooks import handle_delivery
from shared.settings import WebhookTarget
from shared.storage.memory import MemoryStore
from shared.supervisor import sweep
from tests.unit.core.statemachine.test_crash_points import SCENARIOS as CRASH_SCENARIOS
from tests.unit.core.statemachine.test_crash_points import crash_then_recover
from tests.unit.core.statemachine.test_operator_crash_points import SCENARIOS as OPERATOR_SCENARIOS
from tests.unit.core.statemachine.test_random_schedules import LOST as RANDOM_LOST
from tests.unit.core.statemachine.test_random_schedules import REJECT as RANDOM_REJECT
from tests.unit.harness import AgentSim, Crash, CrashRuntime, drive, make_runtime, post, state

KEY = b"tests: webhook signing key 32 b!"
TARGET = WebhookTarget("https://hooks.example/orders", KEY)
SCHEDULE = (5.0, 60.0, 600.0)  # 4 tries


def _rt(**overrides: Any) -> CrashRuntime:
    rt = make_runtime(webhooks=True, webhook_schedule=SCHEDULE, **overrides)
    rt.webhook = TARGET
    return rt


class Receiver:
    """The webhook receiver: ``fail_first`` fails each webhook-id's first try; ``down`` fails all."""

    def __init__(self, *, fail_first: bool = False, down: bool = False) -> None:
        self.fail_first, self.down = fail_first, down
        self.tries: list[tuple[str, str, int]] = []  # (webhook-id, body, timestamp)
        self.told: dict[str, dict[str, Any]] = {}  # webhook-id -> the event, once a try succeeded

    def __call__(self, target: WebhookTarget, msg_id: str, body: str, now: datetime) -> str | None:
        assert target is TARGET
        seen = any(t[0] == msg_id for t in self.tries)
        self.tries.append((msg_id, body, int(now.timestamp())))
        if self.down or (self.fail_first and not seen):
            return "HTTP 503"
        self.told[msg_id] = json.loads(body)
        return None


def deliver(rt: CrashRuntime, receiver: Receiver) -> list[str]:
    """Handle the webhooks queue's due messages (a scheduled one waits for its time)."""
    now = rt.clock()
    out = []
    for m in rt.bus.take("webhooks"):  # type: ignore[attr-defined]
        if m.scheduled_enqueue_time and m.scheduled_enqueue_time > now:
            rt.bus.sent["webhooks"].append(m)  # type: ignore[attr-defined]
            continue
        out.append(handle_delivery(rt, json.loads(json.dumps(m.body)), send=receiver))
    return out


def settle_webhooks(rt: CrashRuntime, receiver: Receiver, *, rounds: int = 400, tick: float = 15.0) -> None:
    """Deliver, sweep and let time pass until nothing is pending and no watch is left."""
    for _ in range(rounds):
        deliver(rt, receiver)
        if not _pending(rt) and not _watches(rt):
            return
        rt.clock.advance(tick)  # type: ignore[attr-defined]
        sweep(rt)
    raise AssertionError(f"webhooks did not settle: {_pending(rt)} {_watches(rt)}")


def hooks(rt: CrashRuntime, order_id: str) -> list[HookRow]:
    rows = rt.store.read_rows(order_id, 1000)
    return [HookRow.from_entity(e) for k, e in rows.items() if k.startswith(HOOK_PREFIX)]


def _pending(rt: CrashRuntime) -> list[str]:
    snap = rt.store.snapshot()  # type: ignore[attr-defined]
    return [rk for (t, _pk, rk), e in snap.items() if t == "state" and rk.startswith(HOOK_PREFIX)
            and e.get("Status") == webhooks.PENDING]


def _watches(rt: CrashRuntime) -> list[str]:
    return [e["RowKey"] for e in rt.store.index_rows() if str(e["RowKey"]).startswith("webhook:")]  # type: ignore[attr-defined]


def processed(rt: CrashRuntime) -> str:
    oid = post(rt).body["orderId"]
    drive(rt, oid, AgentSim(rt))
    return str(oid)


def test_no_webhook_url_writes_and_sends_nothing() -> None:
    rt = make_runtime()
    oid = processed(rt)
    assert hooks(rt, oid) == [] and _watches(rt) == [] and rt.bus.peek("webhooks") == []  # type: ignore[attr-defined]


def test_a_processed_order_is_told_once_signed_after_a_failed_first_try() -> None:
    rt = _rt()
    receiver = Receiver(fail_first=True)
    oid = processed(rt)
    [hook] = hooks(rt, oid)
    assert (hook.type, hook.status, hook.attempt) == ("order.processed", "pending", 1)
    assert _watches(rt) == [HookWatch(oid, hook.key, hook.cover_at).row.row_key]  # type: ignore[arg-type]
    assert deliver(rt, receiver) == ["retry"]
    rt.clock.advance(5)
    assert deliver(rt, receiver) == ["delivered"]
    [event] = receiver.told.values()
    assert event["type"] == "order.processed" and event["data"]["orderId"] == oid
    assert event["data"]["processState"] == "Processed" and event["data"]["customerId"] == "c-1"
    # the same webhook-id and body on both tries; the watches are gone
    assert len({(t[0], t[1]) for t in receiver.tries}) == 1 and len(receiver.tries) == 2
    assert _watches(rt) == []
    [hook] = hooks(rt, oid)
    assert (hook.status, hook.tries) == ("delivered", 2)


def test_a_copy_of_a_try_is_stale() -> None:
    rt = _rt()
    receiver = Receiver()
    oid = processed(rt)
    [msg] = rt.bus.peek("webhooks")  # type: ignore[attr-defined]
    assert deliver(rt, receiver) == ["delivered"]
    assert handle_delivery(rt, msg.body, send=receiver) == "stale"
    assert len(receiver.tries) == 1
    assert hooks(rt, oid)[0].status == "delivered"


def test_failed_held_and_terminated_orders_are_told() -> None:
    rt = _rt()
    receiver = Receiver()
    failed = post(rt).body["orderId"]
    drive(rt, failed, AgentSim(rt, reject={"charge-payment": "declined"}))
    held_rt = _rt(workflow=tuple(replace(s, on_failure="hold") if s.name == "charge-payment" else s
                                 for s in rt.config.workflow))
    held = post(held_rt).body["orderId"]
    drive(held_rt, held, AgentSim(held_rt, reject={"charge-payment": "declined"}))
    stopped = post(rt).body["orderId"]
    agents = AgentSim(rt, hang={"charge-payment"})
    drive(rt, stopped, agents, until=lambda st: st.get("StepName") == "charge-payment")
    assert terminate_order(rt, stopped).status == 202
    drive(rt, stopped, agents)
    settle_webhooks(rt, receiver)
    settle_webhooks(held_rt, receiver)
    kinds = {e["data"]["orderId"]: e["type"] for e in receiver.told.values()}
    assert kinds == {failed: "order.failed", held: "order.held", stopped: "order.terminated"}
    assert state(rt, failed)["Outcome"] == "failed"


def test_a_delivery_that_gives_up_is_listed_and_sent_again_with_the_same_id() -> None:
    rt = _rt()
    receiver = Receiver(down=True)
    oid = processed(rt)
    settle_webhooks(rt, receiver)
    [hook] = hooks(rt, oid)
    assert (hook.status, hook.tries) == ("failed", len(SCHEDULE) + 1)
    listed = list_deliveries(rt, {})
    assert listed.status == 200
    [shown] = listed.body["deliveries"]
    assert (shown["orderId"], shown["webhookId"], shown["lastError"]) == (oid, hook.webhook_id, "HTTP 503")
    receiver.down = False
    again = resend_delivery(rt, oid, shown["delivery"])
    assert again.status == 202 and again.body["round"] == 2
    settle_webhooks(rt, receiver)
    assert list(receiver.told) == [hook.webhook_id]
    assert hooks(rt, oid)[0].status == "delivered"
    assert list_deliveries(rt, {}).body["deliveries"] == []
    # one order's deliveries, whatever their status (its failed ones with state=failed)
    [mine] = list_deliveries(rt, {"orderId": oid}).body["deliveries"]
    assert (mine["webhookId"], mine["status"], mine["round"], mine["tries"]) == (hook.webhook_id, "delivered", 2,
                                                                                 len(SCHEDULE) + 2)
    assert list_deliveries(rt, {"orderId": oid, "state": "failed"}).body["deliveries"] == []
    assert list_deliveries(rt, {"orderId": "nope"}).status == 400
    assert list_deliveries(rt, {"limit": "0"}).status == 400 and list_deliveries(rt, {"limit": "x"}).status == 400
    assert resend_delivery(rt, oid, "hook-99999999").status == 404
    assert resend_delivery(rt, oid, "nope").status == 400
    assert list_deliveries(rt, {"state": "pending"}).status == 400


# ---- crash points ---------------------------------------------------------------------------------

def _last_reply(rt: CrashRuntime) -> tuple[str, Callable[[], Any]]:
    """An order whose last step's reply is next: its handling is the ending decision."""
    from tests.unit.core.statemachine.test_crash_points import _reply_trigger

    oid = post(rt).body["orderId"]
    agents = AgentSim(rt)
    return str(oid), _reply_trigger(rt, agents, rt.config.workflow[-1].name)


@pytest.mark.parametrize("redeliver", [True, False], ids=["redelivered", "lost"])
def test_a_crash_anywhere_in_the_ending_loses_no_webhook(redeliver: bool) -> None:
    """The ending decision (the last reply) dies after each of its effects; its reply is then
    redelivered, or lost for good. The order ends, and its webhook is told, once per ending."""
    k = 0
    while True:
        rt = _rt()
        receiver = Receiver()
        oid, trigger = _last_reply(rt)
        rt.crash_at = k
        with pytest.raises(Crash):
            trigger()
        if rt.crash_exhausted:
            break
        if redeliver:
            trigger()
        drive(rt, oid, AgentSim(rt))
        settle_webhooks(rt, receiver)
        assert state(rt, oid)["ProcessState"] == "Processed", k
        assert [e["type"] for e in receiver.told.values()] == ["order.processed"], k
        assert [h.status for h in hooks(rt, oid)] == ["delivered"], k
        k += 1
    assert k >= 5  # cover, commit, ..., the send of try 1, the index row's delete


@pytest.mark.parametrize("step", ["try", "watch"])
def test_a_crash_anywhere_in_a_failed_try_or_a_watch_loses_no_webhook(step: str) -> None:
    """A failed try's effects (next watch, row, next message, old watch's delete), or a due
    watch's (new watch, row, re-send, delete), cut after each one; the message is redelivered
    (the try) or the sweep runs again (the watch). The receiver is told."""
    k = 0
    while True:
        rt = _rt()
        receiver = Receiver(fail_first=True)
        oid = processed(rt)
        if step == "watch":
            rt.bus.take("webhooks")  # type: ignore[attr-defined]  # try 1's message is lost
            rt.clock.advance(webhooks.COVER.total_seconds() + 1)
            rt.crash_at = k
            with pytest.raises(Crash):
                sweep(rt)
        else:
            [msg] = rt.bus.peek("webhooks")  # type: ignore[attr-defined]
            rt.crash_at = k
            with pytest.raises(Crash):
                handle_delivery(rt, msg.body, send=receiver)
        if rt.crash_exhausted:
            break
        settle_webhooks(rt, receiver)  # the message is still there (redelivered), or the watch stays due
        assert [e["data"]["orderId"] for e in receiver.told.values()] == [oid], (step, k)
        assert [h.status for h in hooks(rt, oid)] == ["delivered"], (step, k)
        k += 1
    assert k >= 3


def test_an_ending_that_lost_its_race_leaves_only_a_watch_which_goes() -> None:
    rt = _rt()
    receiver = Receiver()
    oid, trigger = _last_reply(rt)
    rt.crash_at = 1  # the watch put, the ending's transaction never run
    with pytest.raises(Crash):
        trigger()
    assert len(_watches(rt)) == 1 and hooks(rt, oid) == []
    rt.clock.advance(webhooks.COVER.total_seconds() + 1)
    report = sweep(rt)
    assert report.webhooks == {"deleted": 1}
    assert _watches(rt) == [] and receiver.tries == []


def test_the_message_is_read_from_its_bytes_and_a_stranger_is_poison() -> None:
    from shared.core.messages import PoisonMessage

    rt = _rt()
    receiver = Receiver()
    oid = processed(rt)
    [msg] = rt.bus.take("webhooks")  # type: ignore[attr-defined]
    assert handle_delivery(rt, json.dumps(msg.body).encode(), send=receiver) == "delivered"
    assert hooks(rt, oid)[0].status == "delivered"
    for stranger in (b"not json", b'{"kind": "status"}', {"kind": "webhook", "orderId": oid}):
        with pytest.raises(PoisonMessage):
            handle_delivery(rt, stranger, send=receiver)


@pytest.mark.parametrize("seed", range(40))
def test_random_schedules_of_tries_copies_losses_and_crashes_tell_every_ending(seed: int) -> None:
    """Six orders end (processed, failed); then, at random: a try's message is handled, handled
    twice, lost (dead-lettered), or its handler dies after a random number of effects; the
    receiver fails at random; the Supervisor sweeps; time passes. Every ending is told, none is left
    pending, no watch is left, and a delivery's tries all carry its one webhook-id and body."""
    import random

    rng = random.Random(seed)
    rt = _rt()

    class Flaky(Receiver):
        flaky = True

        def __call__(self, target: WebhookTarget, msg_id: str, body: str, now: datetime) -> str | None:
            self.down = self.flaky and rng.random() < 0.4
            return super().__call__(target, msg_id, body, now)

    receiver = Flaky()
    orders = []
    for n in range(6):
        oid = post(rt).body["orderId"]
        drive(rt, oid, AgentSim(rt, reject={"charge-payment": "declined"} if n % 3 == 0 else {}))
        orders.append(oid)
    for _ in range(300):
        now = rt.clock()
        queued = rt.bus.take("webhooks")  # type: ignore[attr-defined]
        later = [m for m in queued if m.scheduled_enqueue_time and m.scheduled_enqueue_time > now]
        rt.bus.sent["webhooks"].extend(later)  # type: ignore[attr-defined]
        for m in (m for m in queued if m not in later):
            fate = rng.random()
            if fate < 0.1:
                continue  # lost: dead-lettered after its deliveries, or never sent
            copies = 2 if fate > 0.85 else 1
            for _copy in range(copies):
                if rng.random() < 0.15:
                    rt.crash_at = rng.randrange(0, 6)
                    try:
                        handle_delivery(rt, m.body, send=receiver)
                    except Crash:
                        rt.bus.sent["webhooks"].append(m)  # type: ignore[attr-defined]  # redelivered later
                    rt.crash_at = None
                else:
                    handle_delivery(rt, m.body, send=receiver)
        if rng.random() < 0.5:
            sweep(rt)
        rt.clock.advance(rng.choice([1, 5, 15, 60]))
        if not _pending(rt) and not _watches(rt):
            break
    settle_webhooks(rt, receiver)  # whatever is left: the schedule's remaining tries, the watches
    assert not _pending(rt) and not _watches(rt), seed
    # A delivery that gave up (every try failed) is listed; sent again to a receiver that answers, it is told.
    failed = list_deliveries(rt, {}).body["deliveries"]
    assert {d["orderId"] for d in failed} == {o for o in orders for h in hooks(rt, o) if h.status == "failed"}
    receiver.flaky = False
    for d in failed:
        assert resend_delivery(rt, d["orderId"], d["delivery"]).status == 202
    settle_webhooks(rt, receiver)
    assert {e["data"]["orderId"] for e in receiver.told.values()} == set(orders), seed
    if failed:
        print(f"seed {seed}: {len(failed)} gave up, sent again and told")
    for o in orders:
        [hook] = hooks(rt, o)
        assert {(t[0], t[1]) for t in receiver.tries if t[0] == hook.webhook_id} <= {(hook.webhook_id, hook.body)}


def _counted(rt: CrashRuntime) -> tuple[int, int, int]:
    """(table writes, table reads, messages sent) so far."""
    store = rt.store
    return store.writes, len(store.reads), rt.bus.sent_count  # type: ignore[attr-defined]


def test_the_price_per_ended_order_is_what_docs_cost_md_says() -> None:
    """docs/cost.md, "Webhooks": an ending costs 1 table request more (the watch; the delivery row
    rides in the ending's transaction) and 1 message; a delivered try 1 read and 2 writes (the row's
    replace, the watch's delete), no message; a failed try 1 read, 3 writes (the next watch, the row,
    the old watch's delete) and 1 message. With no WebhookUrl, not one more request."""
    off, on = make_runtime(), _rt()
    for rt in (off, on):
        oid = post(rt).body["orderId"]
        drive(rt, oid, AgentSim(rt))
    w_off, r_off, s_off = _counted(off)
    w_on, r_on, s_on = _counted(on)
    assert (w_on - w_off, r_on - r_off, s_on - s_off) == (1, 0, 1)
    [msg] = on.bus.take("webhooks")  # type: ignore[attr-defined]
    before = _counted(on)
    assert handle_delivery(on, msg.body, send=Receiver(down=True)) == "retry"
    after = _counted(on)
    assert tuple(a - b for a, b in zip(after, before, strict=True)) == (3, 1, 1)
    on.clock.advance(SCHEDULE[0])
    [msg] = on.bus.take("webhooks")  # type: ignore[attr-defined]
    before = _counted(on)
    assert handle_delivery(on, msg.body, send=Receiver()) == "delivered"
    after = _counted(on)
    assert tuple(a - b for a, b in zip(after, before, strict=True)) == (2, 1, 0)


def test_a_copy_of_the_last_reply_decided_on_its_token_leaves_one_delivery() -> None:
    """The last reply handled twice: the copy is decided on its token's rows first (no read), which
    the order has left. Its watch is put, its transaction loses the race, and the read finds the
    reply a duplicate: one delivery, told once; the copy's watch, due, finds no delivery of its own."""
    rt = _rt()
    receiver = Receiver()
    oid, trigger = _last_reply(rt)
    trigger()
    rt.clock.advance(1)  # the copy decides at another instant: its watch is another row
    trigger()
    assert len(hooks(rt, oid)) == 1 and len(_watches(rt)) == 2
    settle_webhooks(rt, receiver)
    assert [e["data"]["orderId"] for e in receiver.told.values()] == [oid]
    assert len(receiver.tries) == 1 and _watches(rt) == []


class TellingStore(MemoryStore):
    """Checks, on every committed transaction, that one which ends an order (its state row to
    finished or held, from a state that was neither that nor finished) creates a delivery row, and
    that no other transaction does."""

    def __init__(self) -> None:
        super().__init__()
        self.endings: list[tuple[str, str]] = []  # (order id, webhook type) of each committed ending

    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        state_op = next((op for op in ops if op.row_key == STATE_ROW and op.kind != "delete"), None)
        old = self.peek_partition(order_id).get(STATE_ROW)
        etags = super().transact(order_id, ops)
        if state_op is not None:
            new_mode, old_mode = state_op.row.get("Mode"), (old or {}).get("Mode")
            ends = new_mode in ("finished", "held") and old_mode not in ("finished", new_mode)
            hooked = any(op.kind == "create" and op.row_key.startswith(HOOK_PREFIX) for op in ops)
            assert hooked == ends, (order_id, old_mode, new_mode, [op.row_key for op in ops])
            if ends:
                self.endings.append((order_id, str(event_type(StateRow.from_entity(state_op.row)))))
        return etags


@pytest.mark.parametrize("sc", OPERATOR_SCENARIOS, ids=lambda sc: sc.name)
def test_every_ending_an_operator_action_leads_to_writes_its_delivery_and_is_told(sc: Any) -> None:
    """The operator crash-point scenarios (retry, cancel, terminate, in every state they take),
    run with webhooks on and no crash: every transaction that ends an order writes its delivery (the
    store checks each one), and every ending is told once, with the type of how it ended."""
    rt = _rt(store=TellingStore())
    agents = AgentSim(rt)
    oid, action = sc.setup(rt, agents)
    action()
    agents.reject.clear()
    agents.hang.clear()
    drive(rt, oid, agents)
    receiver = Receiver()
    settle_webhooks(rt, receiver)
    endings = rt.store.endings  # type: ignore[attr-defined]
    assert endings and {o for o, _ in endings} == {oid}, sc.name
    in_order = sorted(hooks(rt, oid), key=lambda h: h.key)  # by the seq of the ending's first event
    assert [receiver.told[h.webhook_id]["type"] for h in in_order] == [t for _, t in endings], sc.name
    assert all(e["data"]["orderId"] == oid for e in receiver.told.values())


@pytest.mark.parametrize("redeliver", [True, False], ids=["redelivered", "lost"])
@pytest.mark.parametrize("sc", CRASH_SCENARIOS, ids=lambda sc: sc.name)
def test_the_crash_point_scenarios_with_webhooks_on_converge_and_tell_every_ending(sc: Any, redeliver: bool) -> None:
    """tests/unit/core/statemachine/test_crash_points.py's scenarios (claims, replies, redrives,
    timeouts, compensations, operator actions), each cut after every effect of its handler, with
    webhooks on: the order still converges as there, every transaction that ends it writes its
    delivery (the store checks), and every ending is told, in order, with its type."""
    k = 0
    while True:
        rt = _rt(store=TellingStore(), workflow=sc.workflow)
        agents = AgentSim(rt, reject=dict(sc.reject or {}), hang=set(sc.hang or ()), lost=set(sc.lost or ()))
        oid, trigger = sc.setup(rt, agents)
        expect = crash_then_recover(sc, rt, agents, oid, trigger, k, redeliver)
        st = drive(rt, oid, agents)
        assert {key: st.get(key) for key in expect} == expect, (sc.name, k)
        mine = [c for c in agents.calls if c[0] == oid]
        assert len(mine) == len(set(mine)), mine  # each remote effect once (per idempotency key)
        receiver = Receiver(fail_first=True)
        settle_webhooks(rt, receiver)
        for _ in range(40):  # the order's own deadline rows go too (lazily, by the sweep)
            rt.clock.advance(30)
            sweep(rt)
        assert rt.store.index_rows() == [], (sc.name, k)  # type: ignore[attr-defined]
        endings = [t for o, t in rt.store.endings if o == oid]  # type: ignore[attr-defined]
        in_order = sorted(hooks(rt, oid), key=lambda h: h.key)
        assert [receiver.told[h.webhook_id]["type"] for h in in_order] == endings, (sc.name, k)
        assert all(h.status == "delivered" for h in in_order), (sc.name, k)
        if rt.crash_exhausted:
            break
        k += 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 7)), min_size=5, max_size=60),
       reject=RANDOM_REJECT, lost=RANDOM_LOST)
def test_random_interleavings_with_webhooks_tell_every_ending_once_in_order(
        actions: list[tuple[int, int]], reject: dict[str, str], lost: set[str]) -> None:
    """test_random_schedules.py's interleavings (messages late, twice or never, handlers cut short,
    time jumping, sweeps) over an order of each shipped workflow, with webhooks on and webhook tries
    among them (handled, lost, cut short). Every transaction that ends an order writes its delivery
    (the store checks); once the faults stop, every order settles and each of its endings is told,
    in order, with its type."""
    from shared.core.workflows import Registry, Workflow, load_registry
    from tests.unit.core.statemachine.test_random_schedules import QUEUES, deliver, reply
    from tests.unit.harness import BODY, WORKFLOW

    registry = Registry.of([Workflow("order", 1, WORKFLOW), load_registry().get("digital", 1),
                            load_registry().get("express", 1)])
    rt = _rt(store=TellingStore(), max_failures=4, registry=registry)
    agents = AgentSim(rt, reject=dict(reject), lost=set(lost))
    orders = [post(rt).body["orderId"], post(rt, {**BODY, "workflow": "digital"}).body["orderId"],
              post(rt, {**BODY, "workflow": "express"}).body["orderId"]]
    receiver = Receiver(fail_first=True)
    for action, arg in actions:
        queue = QUEUES[arg % len(QUEUES)]
        if action in (0, 1):
            deliver(rt, queue, None, action == 1, lambda msg: agents._handle(msg, rt.clock()))
        elif action in (2, 3):
            reply(rt, agents, None, action == 3)
        elif action == 4:
            if rt.bus.sent.get(queue):  # type: ignore[attr-defined]
                rt.bus.sent[queue].pop(0)  # type: ignore[attr-defined]  # lost
            elif agents.pending_replies:
                agents.pending_replies.pop(0)
        elif action == 5:
            rt.clock.advance(arg * 6)
        elif action == 6:
            sweep(rt)
        elif action == 7:
            deliver(rt, "scheduler", arg, False, lambda msg: None)
        elif action == 8:
            reply(rt, agents, arg, False)
        elif action == 9 and rt.bus.sent.get("webhooks"):  # type: ignore[attr-defined]
            rt.bus.sent["webhooks"].pop(0)  # type: ignore[attr-defined]  # a try's message lost
        elif action in (10, 11) and rt.bus.sent.get("webhooks"):  # type: ignore[attr-defined]
            msg = rt.bus.sent["webhooks"].pop(0)  # type: ignore[attr-defined]
            rt.crash_at = arg if action == 11 else None
            try:
                handle_delivery(rt, msg.body, send=receiver)
            except Crash:
                rt.bus.sent["webhooks"].append(msg)  # type: ignore[attr-defined]  # redelivered later
        elif action == 12:
            rt.clock.advance(arg * 60)
        rt.crash_at = None
    for oid in orders:
        drive(rt, oid, agents, max_rounds=400)
    settle_webhooks(rt, receiver)
    endings = rt.store.endings  # type: ignore[attr-defined]
    for oid in orders:
        in_order = sorted(hooks(rt, oid), key=lambda h: h.key)
        assert [receiver.told[h.webhook_id]["type"] for h in in_order] == [t for o, t in endings if o == oid]
        assert in_order and all(h.status == "delivered" for h in in_order)
    assert len(receiver.told) == len(endings)
