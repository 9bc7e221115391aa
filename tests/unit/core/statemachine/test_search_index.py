"""The search index's layout (``shared.core.statemachine.search_index``): categories, keys, the rows
of an order, when they are written, and that after every kind of transition an order has
exactly the rows its state says (no stale category row left behind)."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from shared.api.operator import cancel_order, retry_order, terminate_order
from shared.api.orders import get_order
from shared.core.effects import Effect, Reindex, Send
from shared.core.lease import Lease
from shared.core.messages import OutMessage
from shared.core.rows import OrderRow, StateRow
from shared.core.statemachine import Category, View, category_of, index_rows
from shared.core.statemachine.search_index import category_key, customer_key, finished_key, listing_keys, reindex, rev
from shared.core.states import Mode, OrderCompensation, Outcome, ProcessState
from shared.core.workflows import DEFAULT_WORKFLOW
from shared.runtime import executor
from tests.unit.api.test_search import REJECTS, Agents, Probe, make, new_order, probe, settle
from tests.unit.harness import T0, check_index_before_sends, post

OID = "0123456789abcdef0123456789abcdef"
ORDER = OrderRow(customer_id="c-1", currency="EUR", items=[], total="19.98", priority="normal", created_at=T0)
F = Mode.FINISHED


def _state(process: ProcessState, mode: Mode, outcome: Outcome | None = None,
           compensation: OrderCompensation | None = None, **more: Any) -> StateRow:
    return StateRow(order_id=OID, process_state=process, mode=mode, outcome=outcome, compensation_state=compensation,
                    **more)


CASES = [
    (_state(ProcessState.PROCESSING, Mode.FORWARD, lease=Lease.parse("reserve-inventory:1")), Category.IN_FLIGHT),
    (_state(ProcessState.PENDING, Mode.FORWARD, lease=Lease.parse("unclaimed")), Category.IN_FLIGHT),
    (_state(ProcessState.ERROR, Mode.COMPENSATE, Outcome.FAILED, OrderCompensation.RUNNING), Category.IN_FLIGHT),
    (_state(ProcessState.ERROR, Mode.COMPENSATE, Outcome.CANCELLED, OrderCompensation.RUNNING), Category.IN_FLIGHT),
    (_state(ProcessState.ERROR, Mode.COMPENSATE, Outcome.TERMINATED, OrderCompensation.RUNNING), Category.IN_FLIGHT),
    (_state(ProcessState.ERROR, Mode.HELD, Outcome.HELD), Category.ATTENTION),
    (_state(ProcessState.ERROR, F, Outcome.FAILED, OrderCompensation.COMPLETED), Category.ATTENTION),
    (_state(ProcessState.ERROR, F, Outcome.FAILED, OrderCompensation.NONE), Category.ATTENTION),
    (_state(ProcessState.ERROR, F, Outcome.FAILED, None), Category.ATTENTION),
    (_state(ProcessState.ERROR, F, Outcome.FAILED, OrderCompensation.FAILED), Category.ATTENTION),
    (_state(ProcessState.ERROR, F, Outcome.CANCELLED, OrderCompensation.FAILED), Category.ATTENTION),
    (_state(ProcessState.ERROR, F, Outcome.TERMINATED, OrderCompensation.FAILED), Category.ATTENTION),
    (_state(ProcessState.PROCESSED, F, Outcome.PROCESSED), Category.PROCESSED),
    (_state(ProcessState.ERROR, F, Outcome.CANCELLED, OrderCompensation.COMPLETED), Category.ERROR),
    (_state(ProcessState.ERROR, F, Outcome.CANCELLED, OrderCompensation.NONE), Category.ERROR),
    (_state(ProcessState.ERROR, F, Outcome.TERMINATED, OrderCompensation.COMPLETED), Category.ERROR),
]


@pytest.mark.parametrize(("state", "category"), CASES)
def test_category_of_every_state(state: StateRow, category: Category) -> None:
    assert category_of(state) is category


def test_final_categories() -> None:
    assert {c for c in Category if c.final} == {Category.PROCESSED, Category.ERROR}
    assert [str(c) for c in Category] == ["inFlight", "attention", "processed", "error"]


def test_rev_sorts_newest_first_to_the_microsecond() -> None:
    times = [datetime(2001, 1, 1, tzinfo=UTC), T0 - timedelta(days=400), T0, T0 + timedelta(microseconds=1),
             T0 + timedelta(seconds=1), datetime(2999, 12, 31, tzinfo=UTC)]
    revs = [rev(t) for t in times]
    assert all(re.fullmatch(r"\d{17}", r) for r in revs), revs
    assert revs == sorted(revs, reverse=True) and len(set(revs)) == len(revs)
    # an offset is the same instant
    assert rev(T0) == rev(T0.astimezone(timezone(timedelta(hours=5))))


@pytest.mark.parametrize("customer", ["c-1", "C-1", "x' or PartitionKey ne '", "\u00e9t\u00e9", "a" * 64, "a/b#c?d"])
def test_customer_key_is_fixed_length_hex(customer: str) -> None:
    key = customer_key(customer)
    assert re.fullmatch(r"[0-9a-f]{24}", key)
    assert key == customer_key(customer)


def test_customer_keys_differ() -> None:
    ids = ["c-1", "C-1", "c-2", "c-1 ", "c-10", "c-1@x"]
    assert len({customer_key(c) for c in ids}) == len(ids)


def test_keys() -> None:
    r = rev(T0)
    assert listing_keys(OID, r, "k" * 24, Category.ATTENTION) == (
        f"all-{r}-{OID}", f"cust-{'k' * 24}-{r}-{OID}", f"cat-attention-{r}-{OID}")
    assert category_key(Category.IN_FLIGHT, T0, OID) == f"cat-inFlight-{r}-{OID}"
    assert finished_key(T0 + timedelta(hours=20), OID) == f"fin-20261123-{OID}"
    # every key of one kind sorts inside its prefix's range, and the ranges do not overlap
    for prefix in ("all-", "cust-", "cat-inFlight-", "cat-attention-", "cat-processed-", "cat-error-", "fin-"):
        assert prefix[:-1] + "." > prefix + "9" * 40 + "f" * 32


def test_rows_of_a_finished_order() -> None:
    done = T0 + timedelta(minutes=3)
    state = _state(ProcessState.PROCESSED, F, Outcome.PROCESSED, updated_at=done, finished_at=done, failure_count=1)
    rows = {r.row_key: r.to_entity() for r in index_rows(ORDER, state)}
    r, ck = rev(T0), customer_key("c-1")
    summary = {"OrderId": OID, "CustomerId": "c-1", "CreatedAt": T0.isoformat(timespec="microseconds"),
               "UpdatedAt": done.isoformat(timespec="microseconds"), "ProcessState": "Processed",
               "Outcome": "processed", "FailureCount": 1, "Priority": "normal", "Category": "processed",
               "Workflow": DEFAULT_WORKFLOW, "Total": "19.98", "Currency": "EUR"}
    assert rows == {
        f"all-{r}-{OID}": {"RowKey": f"all-{r}-{OID}", **summary},
        f"cust-{ck}-{r}-{OID}": {"RowKey": f"cust-{ck}-{r}-{OID}", **summary},
        f"cat-processed-{r}-{OID}": {"RowKey": f"cat-processed-{r}-{OID}", **summary},
        f"fin-20261122-{OID}": {"RowKey": f"fin-20261122-{OID}", "OrderId": OID, "Rev": r, "CustomerKey": ck,
                                "Category": "processed"},
    }


def test_rows_of_an_order_that_failed_carry_its_workflow_and_failed_step() -> None:
    """What the search's ``workflow`` and ``failedStep`` filters read: in the rows, no key range."""
    order = replace(ORDER, workflow="express", workflow_version=2)
    state = _state(ProcessState.ERROR, F, Outcome.CANCELLED, OrderCompensation.COMPLETED, finished_at=T0,
                   failed_step="charge-payment")
    rows = index_rows(order, state)
    listings = [r for r in rows if not r.row_key.startswith("fin-")]
    assert len(listings) == 3 and len(rows) == 4
    for row in listings:
        entity = row.to_entity()
        assert (entity["Workflow"], entity["FailedStep"]) == ("express", "charge-payment"), row.row_key
    assert all(k not in rows[-1].to_entity() for k in ("Workflow", "FailedStep"))  # the finish-day row: keys only


@pytest.mark.parametrize(("state", "category"), CASES)
def test_only_final_orders_have_a_finish_day_row(state: StateRow, category: Category) -> None:
    finished = replace(state, finished_at=T0)
    keys = [r.row_key for r in index_rows(ORDER, finished)]
    assert len(keys) == (4 if category.final else 3)
    assert any(k.startswith(f"cat-{category}-") for k in keys)
    # no finish time: no finish-day row (nothing to purge by)
    assert not any(k.startswith("fin-") for k in (r.row_key for r in index_rows(ORDER, state)))


def test_reindex_only_when_the_category_changes() -> None:
    flying = CASES[0][0]
    pending = CASES[1][0]
    held = CASES[5][0]
    done = _state(ProcessState.PROCESSED, F, Outcome.PROCESSED, finished_at=T0)
    assert reindex(None, flying, done) == []
    assert reindex(ORDER, flying, pending) == []  # inFlight -> inFlight: no write
    [accepted] = reindex(ORDER, None, flying)
    assert isinstance(accepted, Reindex) and accepted.deletes == ()
    assert {r.row_key.split("-")[0] for r in accepted.puts} == {"all", "cust", "cat"}
    [ended] = reindex(ORDER, flying, done)
    assert ended.deletes == (category_key(Category.IN_FLIGHT, T0, OID),)
    assert len(ended.puts) == 4
    [holding] = reindex(ORDER, flying, held)
    assert holding.deletes == (category_key(Category.IN_FLIGHT, T0, OID),) and len(holding.puts) == 3
    [retried] = reindex(ORDER, held, pending)
    assert retried.deletes == (category_key(Category.ATTENTION, T0, OID),)


# ---------------------------------------------------------------------------------------------
# Through the workflow: after each transition, exactly the rows the state says
def _assert_indexed(store: Probe, rt: Any, oid: str, category: str, summary: bool = True) -> None:
    """The order is in ``category`` and has exactly the index rows its state says; with
    ``summary``, their properties too (false: a change within inFlight, which writes nothing,
    so the summary shows the state of the last category change, verified by each search)."""
    view = View.from_entities(rt.store.read_partition(oid))
    assert view.order is not None and view.state is not None
    assert str(category_of(view.state)) == category
    expected = {r.row_key: r.to_entity() for r in index_rows(view.order, view.state)}
    if summary:
        assert store.rows_of(oid) == expected
    else:
        assert store.rows_of(oid).keys() == expected.keys()
        assert {r["Category"] for r in store.rows_of(oid).values()} == {category}
    assert get_order(rt, oid).body["category"] == category


@pytest.mark.parametrize(("fate", "category", "fin"), [
    ("inFlight", "inFlight", False), ("processed", "processed", True), ("held", "attention", False),
    ("failed", "attention", False), ("compFailed", "attention", False), ("cancelled", "error", True),
    ("terminated", "error", True)])
def test_each_fate_leaves_exactly_its_rows(fate: str, category: str, fin: bool) -> None:
    rt = make()
    oid = new_order(rt, Agents(rt), fate)
    store = probe(rt)
    _assert_indexed(store, rt, oid, category)
    assert any(k.startswith("fin-") for k in store.rows_of(oid)) is fin


def test_index_writes_cost_one_per_category_change() -> None:
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    oid = post(rt).body["orderId"]
    assert store.index_writes == 1  # accepted
    settle(rt, oid, agents)  # three steps done, processed
    assert store.index_writes == 2
    # deadline row, submission, index, 3 replies, index, deadline row deleted: 2 of 8 for the index
    assert store.writes == 1 + 1 + 1 + 3 + 1 + 1
    _assert_indexed(store, rt, oid, "processed")


def test_held_retried_then_processed_leaves_no_attention_row() -> None:
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    oid = new_order(rt, agents, "held")
    _assert_indexed(store, rt, oid, "attention")
    assert retry_order(rt, oid).status == 202
    _assert_indexed(store, rt, oid, "inFlight")
    assert settle(rt, oid, agents)["ProcessState"] == "Processed"
    _assert_indexed(store, rt, oid, "processed")


def test_failed_restarted_as_a_new_generation_then_processed() -> None:
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    oid = new_order(rt, agents, "failed")
    _assert_indexed(store, rt, oid, "attention")
    r = retry_order(rt, oid)
    assert r.status == 202 and r.body["result"] == "restarted"
    _assert_indexed(store, rt, oid, "inFlight")
    settle(rt, oid, agents)
    _assert_indexed(store, rt, oid, "processed")
    assert get_order(rt, oid).body["generation"] == 1


def test_failed_then_cancelled_leaves_attention_for_error() -> None:
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    oid = new_order(rt, agents, "failed")
    rt.clock.advance(86400 * 3)
    assert cancel_order(rt, oid).status == 202
    _assert_indexed(store, rt, oid, "error")
    # its finish day is the day of the decision: retention counts from the cancel, not the failure
    [fin] = [k for k in store.rows_of(oid) if k.startswith("fin-")]
    assert fin == f"fin-{rt.clock():%Y%m%d}-{oid}"


def test_compensation_redriven_then_completed() -> None:
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    oid = new_order(rt, agents, "compFailed")
    _assert_indexed(store, rt, oid, "attention")
    r = retry_order(rt, oid)
    assert r.status == 202 and r.body["result"] == "compensation-redriven"
    _assert_indexed(store, rt, oid, "inFlight")
    settle(rt, oid, agents)
    _assert_indexed(store, rt, oid, "attention")  # failed and compensated: still for an operator


def test_terminate_in_flight_ends_in_error() -> None:
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    oid = post(rt).body["orderId"]
    agents.reject = dict(REJECTS["failed"])
    assert terminate_order(rt, oid).status == 202
    _assert_indexed(store, rt, oid, "inFlight", summary=False)  # compensating
    settle(rt, oid, agents)
    _assert_indexed(store, rt, oid, "error")


def test_cancel_of_a_held_order_leaves_attention() -> None:
    """Cancelling a held order moves it from attention to inFlight (compensating): that
    transition writes the index (``compensate_all``). Without it the order was missing from
    state=inFlight, and when its compensation ended the final Reindex dropped only the
    cat-inFlight key, so its cat-attention row was left behind."""
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    oid = new_order(rt, agents, "held")
    assert cancel_order(rt, oid).status == 202
    _assert_indexed(store, rt, oid, "inFlight")
    settle(rt, oid, agents)
    _assert_indexed(store, rt, oid, "error")


def _stall_after_first(rt: Any, what: str) -> list[list[Effect]]:
    """The next decision with a message whose ``what`` starts with ``what`` runs up to that message
    and 'stalls' there: the rest of its effects go to the list returned, for the test to run later,
    after what the message set off (an invocation slow to return while another instance goes on)."""
    rest: list[list[Effect]] = []
    run = rt.run

    def stalled(effects: list[Effect], limit: int | None = None) -> executor.Outcome:
        k = next((i for i, e in enumerate(effects) if isinstance(e, Send) and e.what.startswith(what)), None)
        if rest or k is None:
            return run(effects, limit)
        rest.append(effects[k + 1:])
        return executor.execute(effects, rt.store, rt.bus, keys=rt.keys, limit=k + 1)

    rt.run = stalled
    return rest


def test_an_order_processed_before_its_submission_returns_is_not_left_in_flight() -> None:
    """The submission writes the order's index rows before its first request: the order may finish
    on other instances while the submission's invocation is still running (issue 31's full runs: a
    late in-flight row listed Processed orders as in flight for good, and a bulk retry, which counts
    them, found no room)."""
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    rest = _stall_after_first(rt, "request")
    oid = str(post(rt).body["orderId"])
    assert settle(rt, oid, agents)["ProcessState"] == "Processed"
    executor.execute(rest[0], rt.store, rt.bus, keys=rt.keys)  # the submission's invocation goes on
    _assert_indexed(store, rt, oid, "processed")


def test_a_retried_order_processed_before_the_retry_returns_is_not_left_in_flight() -> None:
    """The same for an operator's retry (or a bulk retry's): its index rows before its notice."""
    rt = make()
    agents = Agents(rt)
    store = probe(rt)
    oid = new_order(rt, agents, "held")
    rest = _stall_after_first(rt, "schedule")
    assert retry_order(rt, oid).status == 202
    assert settle(rt, oid, agents)["ProcessState"] == "Processed"
    executor.execute(rest[0], rt.store, rt.bus, keys=rt.keys)
    _assert_indexed(store, rt, oid, "processed")


def test_the_harness_check_catches_an_index_write_after_a_message_that_moves_the_order_on() -> None:
    """``check_index_before_sends`` (run on every decision of the unit tests) does catch one."""
    message = OutMessage(queue="q", body={}, message_id="m")
    with pytest.raises(AssertionError):
        check_index_before_sends([Send(message, what="request"), Reindex(OID, ())])
    with pytest.raises(AssertionError):
        check_index_before_sends([Send(message, what="status received"), Send(message, what="schedule"),
                                  Reindex(OID, ())])
    check_index_before_sends([Send(message, what="status processed"), Reindex(OID, ()), Send(message, what="request")])
