"""The reply path with fencing tokens (``shared.scheduler``, ``shared.core.fence``): a reply whose
token is current is decided and written without a read; a token that anything has overtaken
(a duplicate, a Supervisor redrive, a terminate, a retry's new generation) loses its write
(412) and the reply is decided on a read, exactly as without a token."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from shared.api.operator import retry_order, terminate_order
from shared.core import fence
from shared.core.messages import OutMessage, PoisonMessage
from shared.core.rows import ETAG, Op
from shared.core.sealed import Keys
from shared.scheduler import handle_reply
from shared.storage.memory import MemoryStore
from shared.storage.store import Conflict
from shared.supervisor import sweep
from tests.unit.harness import TEST_KEYS as KEYS
from tests.unit.harness import AgentSim, CrashRuntime, deliver_schedules, drive, make_runtime, post, state, steps


class CountingStore(MemoryStore):
    """Counts partition reads and state transactions (committed and lost) of one order."""

    def __init__(self) -> None:
        super().__init__()
        self.partition_reads = 0
        self.committed = 0
        self.lost = 0

    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        self.partition_reads += 1
        return super().read_partition(order_id)

    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        try:
            etags = super().transact(order_id, ops)
        except Conflict:
            self.lost += 1
            raise
        self.committed += 1
        return etags


@dataclass
class Counts:
    reads: int
    committed: int
    lost: int


def counted(store: CountingStore, fn: Any) -> tuple[Any, Counts]:
    before = (store.partition_reads, store.committed, store.lost)
    out = fn()
    return out, Counts(store.partition_reads - before[0], store.committed - before[1], store.lost - before[2])


def setup(echo: bool = True, **sim: Any) -> tuple[CrashRuntime, CountingStore, AgentSim, str]:
    store = CountingStore()
    rt = make_runtime(store=store)
    agents = AgentSim(rt, echo_fence=echo, **sim)
    return rt, store, agents, str(post(rt).body["orderId"])


def next_reply(rt: CrashRuntime, agents: AgentSim) -> OutMessage:
    deliver_schedules(rt)
    agents.work(rt.clock())
    [reply] = agents.pending_replies
    agents.pending_replies.clear()
    return reply


def deliver(rt: CrashRuntime, reply: OutMessage) -> str:
    return handle_reply(rt, json.dumps(reply.body).encode(), message_id=reply.message_id)


def live(rt: CrashRuntime, oid: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {k: v for k, v in rt.store.snapshot().items() if k[0] == "state" and k[1] == oid}  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the forward path
@pytest.mark.parametrize("echo", [True, False], ids=["token", "no-token"])
def test_forward_path_one_write_per_step_and_reads_only_without_a_token(echo: bool) -> None:
    store = CountingStore()
    rt = make_runtime(store=store)
    agents = AgentSim(rt, echo_fence=echo)
    oid, at_submission = counted(store, lambda: str(post(rt).body["orderId"]))
    assert at_submission == Counts(reads=0, committed=1, lost=0)
    verdicts = []
    for _ in range(3):
        reply = next_reply(rt, agents)
        assert ("fence" in reply.body) is echo
        verdict, cost = counted(store, lambda r=reply: deliver(rt, r))
        verdicts.append(verdict)
        assert cost == Counts(reads=0 if echo else 1, committed=1, lost=0)
    assert verdicts == ["step-done", "step-done", "processed"]
    assert state(rt, oid)["ProcessState"] == "Processed"


def test_a_duplicate_reply_loses_its_write_then_reads_and_is_a_duplicate() -> None:
    rt, store, agents, oid = setup()
    reply = next_reply(rt, agents)
    assert deliver(rt, reply) == "step-done"
    rows = live(rt, oid)
    verdict, cost = counted(store, lambda: deliver(rt, reply))
    assert (verdict, cost) == ("duplicate", Counts(reads=1, committed=0, lost=1))
    assert live(rt, oid) == rows


@pytest.mark.parametrize("echo", [True, False], ids=["token", "no-token"])
def test_a_reply_after_the_supervisor_redrove_its_attempt_is_stale(echo: bool) -> None:
    rt, store, agents, oid = setup(echo)
    reply = next_reply(rt, agents)
    rt.clock.advance(31)  # type: ignore[attr-defined]
    assert sweep(rt).acted == {"redriven": 1}
    rows = live(rt, oid)
    verdict, cost = counted(store, lambda: deliver(rt, reply))
    assert verdict == "stale" and live(rt, oid) == rows
    assert cost == (Counts(reads=1, committed=0, lost=1) if echo else Counts(reads=1, committed=0, lost=0))


def test_a_reply_racing_the_supervisor_loses_to_its_write_and_reads() -> None:
    """The Supervisor expires the lease between the token's write and the reply's own write:
    the reply's token write fails (412), the read shows the expired lease, the reply is stale."""
    rt, store, agents, oid = setup()
    reply = next_reply(rt, agents)
    rt.clock.advance(31)  # type: ignore[attr-defined]
    real = store.transact
    raced: list[str] = []

    def supervisor_first(order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        if not raced:
            raced.append(order_id)
            sweep(rt)  # its write lands first
        return real(order_id, ops)

    store.transact = supervisor_first  # type: ignore[method-assign]
    verdict, cost = counted(store, lambda: deliver(rt, reply))
    # the sweep's read, its write and its delete of the attempt's waiting row (none here: a 404),
    # then the reply's lost token write and its one read
    assert verdict == "stale" and cost == Counts(reads=2, committed=1, lost=2)
    assert state(rt, oid)["LeaseKey"] in ("unclaimed", "reserve-inventory:2")


def test_a_late_reply_after_terminate_changes_nothing() -> None:
    rt, store, agents, oid = setup()
    deliver(rt, next_reply(rt, agents))  # reserve-inventory done; charge-payment in flight
    reply = next_reply(rt, agents)
    assert terminate_order(rt, oid).body["result"] == "terminating"
    rows = live(rt, oid)
    verdict, cost = counted(store, lambda: deliver(rt, reply))
    assert verdict in ("stale", "duplicate") and live(rt, oid) == rows
    assert (cost.reads, cost.committed, cost.lost) == (1, 0, 1)


def test_a_waiting_reply_is_decided_without_a_read_and_its_probe_on_one() -> None:
    rt, store, agents, oid = setup(breaker_open={"reserve-inventory": 1})
    waiting = next_reply(rt, agents)
    assert waiting.body["outcome"] == "waiting" and "fence" in waiting.body
    verdict, cost = counted(store, lambda: deliver(rt, waiting))
    assert cost == Counts(reads=0, committed=1, lost=0), verdict
    assert steps(rt, oid)["reserve-inventory"].get("WaitingOn")
    rt.clock.advance(6)  # type: ignore[attr-defined]
    # The probe resume (a schedule message: read there) sends the request again and writes
    # nothing, so no ETag vouches for a token: its reply is decided on a read.
    reply = next_reply(rt, agents)
    assert reply.body["outcome"] == "success" and reply.body["attempt"] == 1 and "fence" not in reply.body
    verdict, cost = counted(store, lambda: deliver(rt, reply))
    # lost=1: the delete of its waiting row, which this simulated agent never registered
    assert (verdict, cost) == ("step-done", Counts(reads=1, committed=1, lost=1))
    assert "WaitingOn" not in steps(rt, oid)["reserve-inventory"]


def test_compensation_replies_are_decided_without_a_read() -> None:
    rt, store, agents, oid = setup(reject={"create-shipment": "no"})
    for _ in range(2):
        deliver(rt, next_reply(rt, agents))
    rejected = next_reply(rt, agents)
    assert deliver(rt, rejected) == "failed" or state(rt, oid)["Mode"] == "compensate"
    for _ in range(2):
        reply = next_reply(rt, agents)
        assert reply.body["kind"] == "compensation" and "fence" in reply.body
        verdict, cost = counted(store, lambda r=reply: deliver(rt, r))
        assert cost == Counts(reads=0, committed=1, lost=0), verdict
    st = state(rt, oid)
    assert (st["Mode"], st["CompensationState"]) == ("finished", "completed")


def test_a_token_of_the_previous_generation_loses_after_a_retry() -> None:
    rt, store, agents, oid = setup(reject={"create-shipment": "no"})
    first = next_reply(rt, agents)  # reserve-inventory, generation 0
    deliver(rt, first)
    drive(rt, oid, agents)
    assert state(rt, oid)["Outcome"] == "failed"
    agents.reject.clear()
    assert retry_order(rt, oid).body["result"] == "restarted"
    deliver_schedules(rt)  # generation 1 claims reserve-inventory again
    assert state(rt, oid)["Generation"] == 1
    rows = live(rt, oid)
    verdict, cost = counted(store, lambda: deliver(rt, first))
    assert verdict == "stale" and live(rt, oid) == rows
    assert (cost.reads, cost.lost) == (1, 1)
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"


# --------------------------------------------------------------------------- tokens refused
def _with_token(reply: OutMessage, token: str | None) -> OutMessage:
    return OutMessage(queue=reply.queue, body={**reply.body, "fence": token}, message_id=reply.message_id)


@pytest.mark.parametrize("token", ["damaged", "other-order", "other-attempt", "not-a-string", "too-long",
                                   "unknown-key"])
def test_a_token_that_cannot_be_used_is_ignored_and_the_reply_read(token: str) -> None:
    rt, store, agents, oid = setup()
    reply = next_reply(rt, agents)
    good = reply.body["fence"]
    rows = {k: {kk: vv for kk, vv in v.items() if kk != "PartitionKey"}
            for k, v in fence.decode(KEYS, oid, good).items()}
    other = post(rt, headers={"Idempotency-Key": "another"}).body["orderId"]
    elsewhere = {**rows, "state": {**rows["state"], "LeaseKey": "reserve-inventory:7"}}
    bad: Any = {"damaged": good[:-3] + ("AAA" if not good.endswith("AAA") else "BBB"),
                "other-order": fence.encode(KEYS, other, rows), "other-attempt": fence.encode(KEYS, oid, elsewhere),
                "not-a-string": 42, "too-long": "A" * (fence.MAX_FENCE_LENGTH + 1),
                "unknown-key": fence.encode(Keys(b"k" * 32), oid, rows)}[token]
    verdict, cost = counted(store, lambda: deliver(rt, _with_token(reply, bad)))
    assert (verdict, cost) == ("step-done", Counts(reads=1, committed=1, lost=0))


def test_after_a_rotation_a_token_by_the_previous_key_still_saves_the_read() -> None:
    """TokenKeys rotated while a request was in flight (new key current, the old one previous):
    its reply's token, by the old key, is still used; the next request's is by the new key. Once
    the previous key is dropped, a token by it is ignored and the reply read, like a changed one."""
    rt, store, agents, oid = setup()
    reply = next_reply(rt, agents)  # its request's token is by the tests' key
    rt.keys = Keys(current=b"n" * 32, previous=KEYS.current)
    verdict, cost = counted(store, lambda: deliver(rt, reply))
    assert (verdict, cost) == ("step-done", Counts(reads=0, committed=1, lost=0))
    second = next_reply(rt, agents)
    assert fence.decode(Keys(b"n" * 32), oid, second.body["fence"])  # by the new key alone
    with pytest.raises(fence.InvalidFence, match="MAC"):
        fence.decode(KEYS, oid, second.body["fence"])
    rt.keys = Keys(current=b"n" * 32)  # the previous key dropped
    old = fence.encode(KEYS, oid, {k: {kk: vv for kk, vv in v.items() if kk != "PartitionKey"}
                                   for k, v in fence.decode(rt.keys, oid, second.body["fence"]).items()})
    verdict, cost = counted(store, lambda: deliver(rt, _with_token(second, old)))
    assert (verdict, cost) == ("step-done", Counts(reads=1, committed=1, lost=0))


def test_a_token_decision_that_does_not_write_is_dropped_unrun() -> None:
    """A valid token whose rows say the step is already Done (a duplicate on those rows): its
    decision writes nothing, so it is not trusted; the read shows the step Running: step-done."""
    rt, store, agents, oid = setup()
    reply = next_reply(rt, agents)
    rows = {k: {kk: vv for kk, vv in v.items() if kk != "PartitionKey"}
            for k, v in fence.decode(KEYS, oid, reply.body["fence"]).items()}
    step = next(k for k, v in rows.items() if v.get("Name") == "reserve-inventory")
    rows[step] = {**rows[step], "State": "Done"}
    sent_before = rt.bus.sent_count  # type: ignore[attr-defined]
    verdict, cost = counted(store, lambda: deliver(rt, _with_token(reply, fence.encode(KEYS, oid, rows))))
    assert (verdict, cost) == ("step-done", Counts(reads=1, committed=1, lost=0))
    # only the read decision's messages: the next request (and no re-sent request or alert of the dropped one)
    assert rt.bus.sent_count - sent_before == 1  # type: ignore[attr-defined]


def test_a_token_reply_too_large_to_store_is_poison() -> None:
    rt, store, agents, oid = setup()
    reply = next_reply(rt, agents)
    body = {**reply.body, "result": {"blob": "x" * 40_000}}
    assert "fence" in body
    with pytest.raises(PoisonMessage):
        handle_reply(rt, json.dumps(body).encode(), message_id=reply.message_id)
    assert state(rt, oid)["LeaseKey"] == "reserve-inventory:1"


def test_an_unknown_order_is_poison_only_after_a_read() -> None:
    rt, store, agents, oid = setup()
    reply = next_reply(rt, agents)
    for key in list(live(rt, oid)):  # the order is gone (e.g. retention) after its token was issued
        row = rt.store.read_row(oid, key[2])
        assert row is not None
        rt.store.transact(oid, [Op("delete", {"RowKey": key[2]}, etag=row[ETAG])])
    with pytest.raises(PoisonMessage, match="unknown order"):
        counted(store, lambda: deliver(rt, reply))
    assert store.partition_reads >= 1 and store.lost >= 1


def test_an_error_reply_on_an_overtaken_token_sends_no_alert() -> None:
    """A failure's alert comes before its write (a crash after it re-sends the same alert id). A
    decision on a token must not act before its write: the remote's rejection of attempt 1,
    delivered after the Supervisor redrove the step to attempt 2, alerts nobody and is stale."""
    rt, store, agents, oid = setup(reject={"reserve-inventory": "out of stock"})
    reply = next_reply(rt, agents)
    assert reply.body["outcome"] == "error" and "fence" in reply.body
    rt.clock.advance(31)  # type: ignore[attr-defined]
    assert sweep(rt).acted == {"redriven": 1}
    alerts = rt.config.queues["AlertsQueue"]
    before = len(rt.bus.peek(alerts))  # type: ignore[attr-defined]
    verdict, cost = counted(store, lambda: deliver(rt, reply))
    assert verdict == "stale" and cost == Counts(reads=1, committed=0, lost=0)
    assert len(rt.bus.peek(alerts)) == before  # type: ignore[attr-defined]


def test_a_live_error_reply_is_decided_on_a_read_and_alerts_once() -> None:
    """A live rejection alerts before it writes, so its token is not used: it is decided on a read."""
    rt, store, agents, oid = setup(reject={"reserve-inventory": "out of stock"})
    reply = next_reply(rt, agents)
    alerts = rt.config.queues["AlertsQueue"]
    verdict, cost = counted(store, lambda: deliver(rt, reply))
    assert verdict != "stale" and cost == Counts(reads=1, committed=1, lost=0)
    assert [m.body["step"] for m in rt.bus.peek(alerts)] == ["reserve-inventory"]  # type: ignore[attr-defined]
    assert state(rt, oid)["ProcessState"] == "Error"


def _forged(oid: str, rows: dict[str, dict[str, Any]]) -> str:
    token = fence.encode(KEYS, oid, rows)
    assert token is not None
    return token


def test_a_token_with_unconditional_etags_is_refused_and_the_late_reply_is_stale() -> None:
    """'*' would make the token's write unconditional: a late reply after a terminate, its token
    forged with '*' ETags (and an EventSeq past the history's), must not run the order forward."""
    rt, store, agents, oid = setup()
    deliver(rt, next_reply(rt, agents))
    reply = next_reply(rt, agents)
    assert terminate_order(rt, oid).body["result"] == "terminating"
    rows = fence.decode(KEYS, oid, reply.body["fence"])
    for entity in rows.values():
        entity[ETAG] = "*"
    rows["state"]["EventSeq"] = 500
    forged = OutMessage(**{**reply.__dict__, "body": {**reply.body, "fence": _forged(oid, rows)}})
    before = live(rt, oid)
    verdict, cost = counted(store, lambda: deliver(rt, forged))
    assert verdict in ("stale", "duplicate") and cost == Counts(reads=1, committed=0, lost=0)
    assert live(rt, oid) == before


def test_a_token_whose_rows_make_no_view_is_ignored_not_poison() -> None:
    """A token that passes the MAC but whose rows break the row codecs (a lease that is not text)
    is ignored: the reply is decided on a read, never raised for redelivery and dead-lettering."""
    rt, store, agents, oid = setup()
    reply = next_reply(rt, agents)
    rows = fence.decode(KEYS, oid, reply.body["fence"])
    rows["state"]["LeaseKey"] = 5
    broken = OutMessage(**{**reply.__dict__, "body": {**reply.body, "fence": _forged(oid, rows)}})
    verdict, cost = counted(store, lambda: deliver(rt, broken))
    assert verdict == "step-done" and cost == Counts(reads=1, committed=1, lost=0)


def test_a_stale_reply_too_large_to_store_is_stale_not_poison() -> None:
    """The token still shows the step running, so a late reply looks live on it; its result too
    large to store must not make it poison: the read decides, and there it is stale."""
    rt, store, agents, oid = setup()
    deliver(rt, next_reply(rt, agents))
    reply = next_reply(rt, agents)
    terminate_order(rt, oid)
    large = OutMessage(**{**reply.__dict__, "body": {**reply.body, "result": {"blob": "x" * 40000}}})
    assert "fence" in large.body
    assert deliver(rt, large) in ("stale", "duplicate")
