"""Fencing tokens on real Table Storage (Azurite), with each way of sending transactions: the
ETags a transaction returns are the ones a read returns, so a token's rows are what a read
would give, an order's forward path costs one transaction per step and no partition read, and an
agent's check of its request reads one row while the request's token is current."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from shared.agent.parsing import parse_request
from shared.agent.worker import check_in_flight
from shared.core import fence
from shared.core.messages import PoisonMessage
from shared.core.rows import Op
from shared.scheduler import handle_reply
from shared.storage.store import Conflict
from shared.storage.table_store import TableStore
from tests.unit.harness import AgentSim, make_runtime, post, state

pytestmark = pytest.mark.integration


class Counted:
    """The app's store, counting its partition reads and order transactions (committed, lost)."""

    def __init__(self, inner: TableStore) -> None:
        self.inner = inner
        self.partition_reads = self.transactions = self.lost = 0

    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        self.partition_reads += 1
        return self.inner.read_partition(order_id)

    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        self.transactions += 1
        try:
            return self.inner.transact(order_id, ops)
        except Conflict:
            self.lost += 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(params=["rest", "sdk"])
def store(request: pytest.FixtureRequest, table_service: Any) -> Iterator[Counted]:
    suffix = uuid.uuid4().hex[:10]
    names = (f"orders{suffix}", f"deadlines{suffix}", f"orderindex{suffix}")
    state_t, deadlines, search = (table_service.create_table_if_not_exists(n) for n in names)
    inner = TableStore.of(state_t, deadlines, search, rest=request.param == "rest")
    try:
        assert inner.path == request.param
        yield Counted(inner)
    finally:
        for n in names:
            table_service.delete_table(n)


@pytest.mark.parametrize("echo", [True, False], ids=["token", "no-token"])
def test_forward_path_costs_one_transaction_per_step_and_no_read(store: Counted, echo: bool) -> None:
    rt = make_runtime(store)  # type: ignore[arg-type]
    agents = AgentSim(rt, echo_fence=echo)
    oid = str(post(rt).body["orderId"])
    verdicts = []
    for _ in range(3):
        agents.work(rt.clock())
        [reply] = agents.pending_replies
        agents.pending_replies.clear()
        if echo:  # the token's rows are exactly what a read returns now (same ETags, same values)
            token_rows = fence.decode(rt.keys, oid, reply.body["fence"])
            before = store.partition_reads
            assert {k: {p: v for p, v in r.items() if p != "Timestamp"} for k, r in
                    store.read_partition(oid).items()} == token_rows
            store.partition_reads = before  # that read was the test's, not the app's
        verdicts.append(handle_reply(rt, json.dumps(reply.body).encode(), message_id=reply.message_id))
    assert verdicts == ["step-done", "step-done", "processed"]
    assert state(rt, oid)["ProcessState"] == "Processed"
    # submission + one per reply; the replies read the partition only without a token
    assert (store.transactions, store.lost, store.partition_reads) == (4, 0, 0 if echo else 3)


def test_a_duplicate_reply_on_table_storage_loses_its_write_then_reads(store: Counted) -> None:
    rt = make_runtime(store)  # type: ignore[arg-type]
    agents = AgentSim(rt)
    oid = str(post(rt).body["orderId"])
    agents.work(rt.clock())
    [reply] = agents.pending_replies
    body = json.dumps(reply.body).encode()
    assert handle_reply(rt, body) == "step-done"
    reads, transactions = store.partition_reads, store.transactions
    assert handle_reply(rt, body) == "duplicate"  # the token's ETags are stale: 412, then a read
    assert (store.transactions - transactions, store.lost, store.partition_reads - reads) == (1, 1, 1)
    assert state(rt, oid)["LeaseKey"] == "charge-payment:1"


def test_the_agents_check_reads_one_row_while_the_token_is_current_else_the_partition(store: Counted) -> None:
    rt = make_runtime(store)  # type: ignore[arg-type]
    post(rt)
    [req] = rt.bus.peek("agent-inventory")
    request = parse_request(json.dumps(req.body).encode(), message_id=req.message_id, reply_to="replies")
    check_in_flight(rt, request)  # the token's state ETag is the stored one: no partition read
    assert store.partition_reads == 0
    agents = AgentSim(rt)
    agents.work(rt.clock())
    agents.reply_all()  # the order moved on: the request's token is stale
    with pytest.raises(PoisonMessage, match="is not in flight"):
        check_in_flight(rt, request)
    assert store.partition_reads == 1
