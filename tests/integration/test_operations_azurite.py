"""Issue 11 on real Table Storage (Azurite): an order's history and its paging, search paging
with every filter and its continuation tokens, terminate, each kind of retry, the retention
purge, and the search index's group commit under many threads at once.

The pipeline is driven as in ``test_pipeline_azurite``: the in-memory bus, the agents played by
``AgentSim``, the harness clock (so that retention can jump RetentionDays ahead)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from shared.api.operator import cancel_order, retry_order, terminate_order
from shared.api.orders import get_history, get_order
from shared.api.search import search_orders
from shared.core.rows import SearchRow
from shared.core.states import Category
from shared.core.workflows import DEFAULT_WORKFLOW
from shared.scheduler import handle_reply
from shared.storage.table_store import TableStore
from shared.supervisor import sweep
from shared.supervisor.retention import purge
from tests.unit.harness import BODY, T0, WORKFLOW, AgentSim, deliver_schedules, drive, make_runtime, post, state, steps

pytestmark = pytest.mark.integration

# charge-payment holds on a failure (an operator decides); the others compensate.
HOLD = tuple(replace(s, on_failure="hold") if s.name == "charge-payment" else s for s in WORKFLOW)
# create-shipment (the pivot) holds on a failure too: the concurrency test's "attention" half.
HOLD_SHIP = tuple(replace(s, on_failure="hold") if s.name == "create-shipment" else s for s in HOLD)
NEVER = 30 * 24 * 3600.0  # a step timeout no test reaches: orders left in flight stay there
HOUR = 3600.0


# helpers ---------------------------------------------------------------------------------------
def events(rt: Any, oid: str) -> list[dict[str, Any]]:
    r = get_history(rt, oid, {"limit": "1000"})
    assert r.status == 200, r.body
    assert r.body["continuationToken"] is None
    return list(r.body["history"])


def names(history: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in history]


def index_snapshot(rt: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Every search index row, by order (the tables are per test, so one read is small)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rt.store.query_index("", "~", 100_000):
        out.setdefault(row.order_id, {})[row.row_key] = row.to_entity()
    return out


def index_rows_of(rt: Any, oid: str, snapshot: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    return dict((snapshot if snapshot is not None else index_snapshot(rt)).get(oid, {}))


def expect_index(rt: Any, oid: str, category: str, *, finished: bool, snapshot: dict[str, Any] | None = None) -> None:
    """The order's index rows are exactly all/cust/cat-{category} (+ fin when it may be purged).
    Rows of a final category show the order as its state row says; those of a changing one are
    written only when the category changes, and a search shows them as the state row is now."""
    rows = index_rows_of(rt, oid, snapshot)
    st = state(rt, oid)
    kinds = sorted("-".join(k.split("-")[:2]) if k.startswith("cat-") else k.split("-")[0] for k in rows)
    assert kinds == sorted(["all", "cust", f"cat-{category}"] + (["fin"] if finished else [])), (oid, sorted(rows))
    for key, row in rows.items():
        assert row["Category"] == category, (key, row)
        if category in ("processed", "error") and not key.startswith("fin-"):
            assert row["ProcessState"] == st["ProcessState"], (key, row, st["ProcessState"])
            assert row.get("Outcome") == st.get("Outcome"), (key, row)
            assert row["FailureCount"] == st.get("FailureCount", 0), (key, row)
            assert row.get("FailedStep") == st.get("FailedStep"), (key, row)
        if not key.startswith("fin-"):
            assert row["Workflow"] == DEFAULT_WORKFLOW, (key, row)
    if finished:
        [fin] = [k for k in rows if k.startswith("fin-")]
        assert fin == f"fin-{st['FinishedAt'][:10].replace('-', '')}-{oid}"


def page_through(rt: Any, params: dict[str, str], limit: int) -> tuple[list[str], int, list[str]]:
    """Follow the continuation tokens to the end: (order ids, pages read, tokens seen)."""
    ids: list[str] = []
    tokens: list[str] = []
    token: str | None = None
    for pages in range(1, 100):
        query = {**params, "limit": str(limit), **({"continuationToken": token} if token else {})}
        r = search_orders(rt, query)
        assert r.status == 200, (query, r.body)
        assert len(r.body["orders"]) <= limit
        ids += [o["orderId"] for o in r.body["orders"]]
        token = r.body["continuationToken"]
        if token is None:
            return ids, pages, tokens
        tokens.append(token)
    raise AssertionError(f"search {params} never ended")


def in_flight(rt: Any, customer: str) -> str:
    """A new order whose first request is lost: Processing, reserve-inventory in flight."""
    oid = str(post(rt, {**BODY, "customerId": customer}).body["orderId"])
    rt.bus.take(rt.config.agent_queue(rt.config.workflow[0]))
    return oid


def to_step(rt: Any, agents: AgentSim, oid: str, step: str) -> Any:
    """Drive the order until ``step`` is dispatched; return its request, taken off the bus."""
    queue = rt.config.agent_queue(rt.config.spec(step))
    for _ in range(10):
        requests = [m for m in rt.bus.peek(queue) if m.body["orderId"] == oid and m.body["step"] == step]
        if requests:
            rt.bus.sent[queue].remove(requests[0])
            return requests[0]
        deliver_schedules(rt)
        agents.work(rt.clock())
        agents.reply_all()
    raise AssertionError(f"{step} of {oid} never dispatched: {state(rt, oid)}")


def reply_to(request: Any, outcome: str = "success", reason: str | None = None) -> bytes:
    body = request.body
    return json.dumps({"kind": body["kind"], "orderId": body["orderId"], "step": body["step"],
                       "attempt": body["attempt"], "outcome": outcome,
                       "result": {"id": f"late-{body['step']}"} if outcome == "success" else None,
                       "reason": reason}).encode()


def etags(rt: Any, oid: str) -> dict[str, str]:
    return {k: v["_etag"] for k, v in rt.store.read_partition(oid).items()}


# history ---------------------------------------------------------------------------------------
def test_history_records_every_change_and_pages(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    agents = AgentSim(rt, hang={"charge-payment"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st.get("FailureCount") == 1)  # charge timed out once
    agents.hang.clear()
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"

    view = get_order(rt, oid).body
    history = view["history"]
    assert view["historyContinuationToken"] is None and view["generation"] == 0 and view["category"] == "processed"
    assert names(history) == ["accepted", "dispatched", "stepDone", "dispatched", "redriven", "dispatched",
                              "stepDone", "dispatched", "stepDone", "processed"], names(history)
    assert [e["seq"] for e in history] == list(range(1, len(history) + 1))
    assert [e["at"] for e in history] == sorted(e["at"] for e in history)
    assert [(e.get("step"), e.get("attempt")) for e in history if e["event"] == "dispatched"] == [
        ("reserve-inventory", 1), ("charge-payment", 1), ("charge-payment", 2), ("create-shipment", 1)]
    redrive = next(e for e in history if e["event"] == "redriven")
    assert redrive["detail"]["failureCount"] == 1 and "backoffSeconds" in redrive["detail"], redrive
    assert all("completeBy" in e["detail"] for e in history if e["event"] == "dispatched")
    trace = rt.store.read_row(oid, "order")["Traceparent"].split("-")[1]
    assert {e.get("traceId") for e in history} == {trace} and all(e.get("instance") for e in history)
    assert state(rt, oid)["EventSeq"] == len(history)
    # the forward path's partition read never returns the history rows
    assert not [k for k in rt.store.read_partition(oid) if k.startswith("history-")]

    # paging: every limit gives the same events, in order, through the tokens, and no empty last page
    for limit in (1, 3, len(history) - 1, len(history)):
        got, token, pages = [], None, 0
        while True:
            r = get_history(rt, oid, {"limit": str(limit), **({"continuationToken": token} if token else {})})
            assert r.status == 200 and r.body["orderId"] == oid, r.body
            got += r.body["history"]
            pages += 1
            token = r.body["continuationToken"]
            if token is None:
                break
        assert got == history and pages == -(-len(history) // limit), (limit, pages)

    first = get_history(rt, oid, {"limit": "2"}).body["continuationToken"]
    other = post(rt, headers={"Idempotency-Key": "another"}).body["orderId"]
    assert get_history(rt, other, {"continuationToken": first}).status == 400  # another order's token
    assert get_history(rt, oid, {"continuationToken": first[:-2]}).status == 400  # cut short
    assert get_history(rt, "ab" * 16, {}).status == 404


def test_long_history_pages_and_is_purged_in_batches(table_runtime) -> None:  # type: ignore[no-untyped-def]
    """Over 100 events (a held order retried again and again): GET /api/orders/{id} shows the
    first 100 and a token for the rest, contiguous across the pages; once finished and old, the
    purge deletes more rows than one transaction holds."""
    rt = table_runtime(workflow=HOLD)
    agents = AgentSim(rt, reject={"charge-payment": "declined"})
    oid = post(rt).body["orderId"]
    assert drive(rt, oid, agents)["Mode"] == "held"
    while state(rt, oid)["EventSeq"] <= 110:
        r = retry_order(rt, oid)
        assert (r.status, r.body["result"]) == (202, "retried"), r.body
        assert drive(rt, oid, agents)["Mode"] == "held"
    agents.reject.clear()
    assert retry_order(rt, oid).status == 202
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    total = state(rt, oid)["EventSeq"]

    view = get_order(rt, oid).body
    assert len(view["history"]) == 100 and view["historyContinuationToken"]
    rest = get_history(rt, oid, {"continuationToken": view["historyContinuationToken"], "limit": "1000"}).body
    everything = view["history"] + rest["history"]
    assert rest["continuationToken"] is None
    assert [e["seq"] for e in everything] == list(range(1, total + 1))
    assert names(everything)[-1] == "processed"
    assert names(everything).count("retried") == names(everything).count("held")
    expect_index(rt, oid, "processed", finished=True)

    rows = len(rt.store.partition_keys(oid, 1000))
    assert rows == total + 2 + len(WORKFLOW)  # history + order + state + steps
    rt.clock.advance((rt.config.retention_days + 2) * 24 * HOUR)
    report = purge(rt)
    assert report.orders == [oid] and report.rows_deleted == rows, report
    assert rt.store.partition_keys(oid, 1000) == [] and index_rows_of(rt, oid) == {}


# search ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def catalogue(table_service) -> Iterator[tuple[Any, dict[str, str], dict[str, list[str]]]]:  # type: ignore[no-untyped-def]
    """Eleven orders an hour apart, of two customers, in every category, on tables of their own
    (built once; the search tests only read them): (runtime, id by name, ids by category, newest
    first; key "": every order)."""
    suffix = uuid.uuid4().hex[:10]
    tables = [f"{kind}{suffix}" for kind in ("orders", "deadlines", "orderindex")]
    clients = [table_service.create_table_if_not_exists(t) for t in tables]
    rt = make_runtime(TableStore.of(*clients), workflow=HOLD, step_timeout_override=NEVER)
    agents = AgentSim(rt)
    made: dict[str, str] = {}

    def make(name: str, customer: str, reject: dict[str, str] | None = None) -> str:
        agents.reject = dict(reject or {})
        oid = str(post(rt, {**BODY, "customerId": customer}).body["orderId"])
        drive(rt, oid, agents)
        made[name] = oid
        rt.clock.advance(HOUR)
        return oid

    make("p1", "cust-a")
    make("held", "cust-b", {"charge-payment": "declined"})
    made["f1"] = in_flight(rt, "cust-a")
    rt.clock.advance(HOUR)
    make("p2", "cust-b")
    make("failed", "cust-a", {"create-shipment": "undeliverable"})
    cancelled = make("cancelled", "cust-a", {"create-shipment": "undeliverable"})
    r = cancel_order(rt, cancelled)  # failed and compensated: the operator gives up on it
    assert (r.status, r.body["result"]) == (202, "cancelled"), r.body
    made["f2"] = in_flight(rt, "cust-b")
    rt.clock.advance(HOUR)
    make("p3", "cust-a")
    made["terminated"] = in_flight(rt, "cust-b")
    assert terminate_order(rt, made["terminated"]).status == 202
    assert drive(rt, made["terminated"], agents)["Outcome"] == "terminated"
    rt.clock.advance(HOUR)
    make("compfail", "cust-a", {"create-shipment": "undeliverable", "charge-payment:compensate": "refund refused"})
    make("p4", "cust-b")

    created = sorted(made, key=lambda n: state(rt, made[n])["CreatedAt"], reverse=True)
    by_category: dict[str, list[str]] = {"": [made[n] for n in created]}
    for n in created:
        by_category.setdefault(get_order(rt, made[n]).body["category"], []).append(made[n])
    assert {c: len(v) for c, v in by_category.items()} == {"": 11, "processed": 4, "attention": 3, "inFlight": 2,
                                                           "error": 2}, by_category
    assert set(by_category["attention"]) == {made["held"], made["failed"], made["compfail"]}
    assert set(by_category["error"]) == {made["cancelled"], made["terminated"]}
    snapshot = index_snapshot(rt)
    for category, ids in by_category.items():
        for oid in ids if category else []:
            expect_index(rt, oid, category, finished=category in ("processed", "error"), snapshot=snapshot)
    yield rt, made, by_category
    for t in tables:
        table_service.delete_table(t)


def test_search_pages_through_every_filter(catalogue) -> None:  # type: ignore[no-untyped-def]
    rt, made, by_category = catalogue
    everyone = by_category[""]
    customer = {c: [o for o in everyone if get_order(rt, o).body["order"]["customerId"] == c]
                for c in ("cust-a", "cust-b")}
    cases: list[tuple[dict[str, str], list[str]]] = [({}, everyone)]
    cases += [({"state": c}, ids) for c, ids in by_category.items() if c]
    cases += [({"customerId": c}, ids) for c, ids in customer.items()]
    cases.append(({"customerId": "nobody"}, []))
    for limit in (1, 4):  # 4: a full page, a short last page, and a page that ends exactly
        for params, expected in cases:
            ids, pages, _ = page_through(rt, params, limit)
            assert ids == expected, (params, limit)
            assert pages == max(1, -(-len(expected) // limit)), (params, limit, pages)  # no empty last page
    # customer and state together: the customer's rows filtered, so follow tokens to the end
    for c, ids in customer.items():
        for cat, in_cat in by_category.items():
            if cat:
                got, _, _ = page_through(rt, {"customerId": c, "state": cat}, 2)
                assert got == [o for o in ids if o in in_cat], (c, cat)

    refused = search_orders(rt, {"limit": "200", "unknown": "x"})
    assert (refused.status, [e["field"] for e in refused.body["errors"]]) == (400, ["unknown"]), refused.body
    results = {o["orderId"]: o for o in search_orders(rt, {"limit": "200", "code": "x"}).body["orders"]}
    assert list(results) == everyone
    live = results[made["f1"]]
    assert (live["processState"], live["category"], live["customerId"]) == ("Processing", "inFlight", "cust-a")
    done = results[made["p4"]]
    assert (done["processState"], done["outcome"], done["category"], done["priority"]) == (
        "Processed", "processed", "processed", "normal")
    assert set(done) == {"orderId", "processState", "outcome", "customerId", "createdAt", "updatedAt",
                         "failureCount", "priority", "category", "workflow", "failedStep", "waiting", "waitingFor",
                         "total", "currency"}
    assert results[made["cancelled"]]["outcome"] == "cancelled"
    assert results[made["terminated"]]["outcome"] == "terminated"


def test_search_by_workflow_and_failed_step(catalogue) -> None:  # type: ignore[no-untyped-def]
    """Both filter the rows the key range gives (the rows carry them): pages stay newest first,
    short ones keep their token, and a token stays in its query."""
    rt, made, by_category = catalogue
    everyone = by_category[""]
    failed = {o: state(rt, o).get("FailedStep") for o in everyone}
    assert failed[made["held"]] == "charge-payment" and failed[made["failed"]] == "create-shipment"
    assert failed[made["p1"]] is None
    for step in ("charge-payment", "create-shipment", "reserve-inventory"):
        for limit in (1, 3):
            ids, _, _ = page_through(rt, {"failedStep": step}, limit)
            assert ids == [o for o in everyone if failed[o] == step], (step, limit)
        ids, _, _ = page_through(rt, {"failedStep": step, "state": "attention", "customerId": "cust-a"}, 1)
        assert ids == [o for o in by_category["attention"] if failed[o] == step
                       and get_order(rt, o).body["order"]["customerId"] == "cust-a"]
    ids, _, _ = page_through(rt, {"workflow": DEFAULT_WORKFLOW}, 4)
    assert ids == everyone
    ids, pages, _ = page_through(rt, {"workflow": "no-such-workflow"}, 4)
    assert (ids, pages) == ([], 3)
    token = search_orders(rt, {"failedStep": "create-shipment", "limit": "1"}).body["continuationToken"]
    assert token is not None
    r = search_orders(rt, {"failedStep": "charge-payment", "continuationToken": token})
    assert (r.status, r.body["type"].rsplit("/", 1)[-1]) == (400, "invalid-continuation-token"), r.body


def test_search_by_creation_time(catalogue) -> None:  # type: ignore[no-untyped-def]
    rt, _made, by_category = catalogue
    everyone = by_category[""]
    created = {o: state(rt, o)["CreatedAt"] for o in everyone}
    oldest_first = list(reversed(everyone))
    lo, hi = oldest_first[2], oldest_first[7]
    window = [o for o in everyone if created[lo] <= created[o] < created[hi]]
    assert len(window) == 5
    # from inclusive, to exclusive; the same instants written with Z or another offset
    local_lo = datetime.fromisoformat(created[lo]).astimezone(timezone(timedelta(hours=2)))
    for params in ({"createdFrom": created[lo], "createdTo": created[hi]},
                   {"createdFrom": created[lo].replace("+00:00", "Z"), "createdTo": created[hi].replace("+00:00", "Z")},
                   {"createdFrom": local_lo.isoformat(), "createdTo": created[hi]}):
        for limit in (1, 2, 5):
            ids, pages, _ = page_through(rt, params, limit)
            assert ids == window and pages == -(-5 // limit), (params, limit)
    ids, _, _ = page_through(rt, {"createdFrom": created[lo]}, 2)
    assert ids == [o for o in everyone if created[o] >= created[lo]]
    ids, _, _ = page_through(rt, {"createdTo": created[hi]}, 2)
    assert ids == [o for o in everyone if created[o] < created[hi]]
    one = page_through(rt, {"createdFrom": created[lo], "createdTo": created[lo]}, 2)[0]
    assert one == []  # [t, t) is empty
    day = T0.strftime("%Y-%m-%d")
    next_day = (T0 + timedelta(days=1)).strftime("%Y-%m-%d")
    assert page_through(rt, {"createdFrom": day, "createdTo": next_day}, 4)[0] == everyone
    assert page_through(rt, {"createdTo": day}, 4)[0] == []
    assert page_through(rt, {"createdFrom": next_day}, 4)[0] == []
    # a window with the other filters
    ids, _, _ = page_through(rt, {"createdFrom": created[lo], "createdTo": created[hi], "customerId": "cust-a"}, 1)
    assert ids == [o for o in window if get_order(rt, o).body["order"]["customerId"] == "cust-a"]
    ids, _, _ = page_through(rt, {"createdFrom": created[lo], "createdTo": created[hi], "state": "processed"}, 1)
    assert ids == [o for o in window if o in by_category["processed"]]
    ids, _, _ = page_through(rt, {"createdFrom": created[lo], "state": "attention", "customerId": "cust-a"}, 1)
    assert ids == [o for o in by_category["attention"] if created[o] >= created[lo]
                   and get_order(rt, o).body["order"]["customerId"] == "cust-a"]


def test_search_continuation_token_round_trip(catalogue) -> None:  # type: ignore[no-untyped-def]
    rt, _made, by_category = catalogue
    first = search_orders(rt, {"state": "processed", "limit": "1"}).body
    token = first["continuationToken"]
    # the token continues the same query, whatever the page size
    rest = search_orders(rt, {"state": "processed", "limit": "200", "continuationToken": token}).body
    assert [o["orderId"] for o in first["orders"] + rest["orders"]] == by_category["processed"]
    assert rest["continuationToken"] is None
    # the same token twice gives the same page (a token is a position, not a cursor)
    again = search_orders(rt, {"state": "processed", "limit": "200", "continuationToken": token}).body
    assert again == rest
    window = {"createdFrom": "2026-11-22", "createdTo": "2026-11-23"}
    dated = search_orders(rt, {**window, "limit": "2"}).body["continuationToken"]
    assert search_orders(rt, {**window, "limit": "2", "continuationToken": dated}).status == 200

    def refused(params: dict[str, str]) -> None:
        r = search_orders(rt, params)
        assert r.status == 400 and r.content_type == "application/problem+json", (params, r.body)
        assert r.body["type"].endswith("/invalid-continuation-token"), r.body

    refused({"state": "error", "continuationToken": token})  # another query's token
    refused({"continuationToken": token})
    refused({"state": "processed", "customerId": "cust-a", "continuationToken": token})
    refused({"createdFrom": "2026-11-22", "createdTo": "2026-11-24", "continuationToken": dated})
    refused({"state": "processed", "continuationToken": token[:-3]})  # cut short
    flipped = token[:10] + ("A" if token[10] != "A" else "B") + token[11:]
    refused({"state": "processed", "continuationToken": flipped})  # tampered
    refused({"state": "processed", "continuationToken": "x" * 2000})
    refused({"state": "processed", "continuationToken": "not a token!"})
    history_token = get_history(rt, by_category["processed"][0], {"limit": "1"}).body["continuationToken"]
    refused({"state": "processed", "continuationToken": history_token})


def test_search_repairs_a_stale_index_row(table_runtime) -> None:  # type: ignore[no-untyped-def]
    """A lost index write (a crash between the state write and the index write) leaves the order
    listed in its old category: the search shows it as it is now and repairs the row."""
    rt = table_runtime(workflow=HOLD)
    agents = AgentSim(rt, reject={"charge-payment": "declined"})
    held, other = (post(rt, headers={"Idempotency-Key": k}).body["orderId"] for k in ("h", "o"))
    for oid in (held, other):
        drive(rt, oid, agents)
    rows = index_rows_of(rt, held)
    [stale_key] = [k for k in rows if k.startswith("cat-attention-")]
    agents.reject.clear()
    assert retry_order(rt, held).status == 202
    assert drive(rt, held, agents)["ProcessState"] == "Processed"
    expect_index(rt, held, "processed", finished=True)
    # as if the index writes after the retry were lost
    rt.store.write_index([SearchRow.from_entity(rows[stale_key])], [])
    assert page_through(rt, {"state": "attention"}, 50)[0] == [other]
    expect_index(rt, held, "processed", finished=True)  # the stale row is gone


# terminate -------------------------------------------------------------------------------------
def test_terminate_in_flight_compensates_and_fences_the_late_reply(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    charge = to_step(rt, agents, oid, "charge-payment")  # reserve done; charge in flight, never delivered
    expect_index(rt, oid, "inFlight", finished=False)

    r = terminate_order(rt, oid)
    assert (r.status, r.body["result"], r.body["action"]) == (202, "terminating", "terminate"), r.body
    assert r.headers["Location"] == f"/api/orders/{oid}"
    expect_index(rt, oid, "inFlight", finished=False)  # compensating: still in flight
    [listed] = search_orders(rt, {"state": "inFlight"}).body["orders"]
    assert (listed["orderId"], listed["processState"], listed["outcome"]) == (oid, "Error", "terminated"), listed
    again = terminate_order(rt, oid)  # compensating now: not running its steps any more
    assert again.status == 409 and again.body["type"].endswith("/wrong-state"), again.body
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["CompensationState"]) == ("Error", "terminated", "completed")
    assert (oid, "reserve-inventory", "release") in agents.calls
    assert (oid, "charge-payment", "refund") in agents.tombstones  # nothing charged: the key is tombstoned
    assert f"{oid}:charge-payment" in agents.tombstoned
    assert not [c for c in agents.calls if c[0] == oid and c[2] in ("charge", "refund")]
    s = steps(rt, oid)
    assert s["charge-payment"]["State"] == "Failed" and s["charge-payment"]["FailureReason"] == "terminated by operator"
    assert s["create-shipment"]["State"] == "Pending"

    # the attempt in flight answers late (either way): nothing changes, nothing is sent
    before, seq, sent = etags(rt, oid), state(rt, oid)["EventSeq"], rt.bus.sent_count
    for late in (reply_to(charge), reply_to(charge, "error", "compensated")):
        assert handle_reply(rt, late) in ("stale", "duplicate")
    assert etags(rt, oid) == before and state(rt, oid)["EventSeq"] == seq and rt.bus.sent_count == sent

    view = get_order(rt, oid).body
    assert view["category"] == "error"
    history = names(view["history"])
    assert history[history.index("terminated"):] == [
        "terminated", "compensationDispatched", "compensationDone", "compensationDispatched", "compensationDone",
        "compensated"], history
    terminated = next(e for e in view["history"] if e["event"] == "terminated")
    assert (terminated["step"], terminated["attempt"], terminated["detail"]["compensations"]) == (
        "charge-payment", 1, 2), terminated
    expect_index(rt, oid, "error", finished=True)
    assert oid in page_through(rt, {"state": "error"}, 10)[0]
    for action in (terminate_order, retry_order, cancel_order):
        assert action(rt, oid).status == 409


def test_terminate_before_any_effect_and_refusals(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    agents = AgentSim(rt)
    oid = in_flight(rt, "c-1")  # reserve in flight, its request lost
    refused = cancel_order(rt, oid)
    assert refused.status == 409 and "terminate" in refused.body["detail"], refused.body
    assert terminate_order(rt, oid).status == 202
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"]) == ("Error", "terminated")
    assert (oid, "reserve-inventory", "release") in agents.tombstones
    done = post(rt, headers={"Idempotency-Key": "done"}).body["orderId"]
    drive(rt, done, agents)
    r = terminate_order(rt, done)
    assert r.status == 409 and r.body["processState"] == "Processed" and "Processed" in r.body["detail"]
    assert terminate_order(rt, "cd" * 16).status == 404
    assert terminate_order(rt, "not-an-id").status == 400


def test_terminate_a_redriven_order_undoes_the_attempt_that_applied(table_runtime) -> None:  # type: ignore[no-untyped-def]
    """Pending after a redrive (its first attempt applied, the reply lost): terminate compensates
    that attempt by its idempotency key, and the redrive's schedule notice claims nothing."""
    rt = table_runtime()
    agents = AgentSim(rt, lost={"reserve-inventory"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents, until=lambda st: st["ProcessState"] == "Pending" and st.get("FailureCount") == 1)
    assert rt.bus.peek(rt.config.queues["SchedulerQueue"])  # the redrive's notice is on its way
    r = terminate_order(rt, oid)
    assert (r.status, r.body["result"]) == (202, "terminating"), r.body
    agents.lost.clear()
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["CompensationState"]) == ("Error", "terminated", "completed")
    assert [c[2] for c in agents.calls if c[0] == oid] == ["reserve", "release"]  # undone, not redone
    history = names(events(rt, oid))
    assert history[history.index("redriven"):] == [
        "redriven", "terminated", "compensationDispatched", "compensationDone", "compensated"], history
    expect_index(rt, oid, "error", finished=True)


def test_terminate_with_the_pivot_in_flight_holds(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    agents = AgentSim(rt)
    oid = post(rt).body["orderId"]
    ship = to_step(rt, agents, oid, "create-shipment")
    r = terminate_order(rt, oid)
    assert (r.status, r.body["result"], r.body["processState"]) == (202, "held", "Error"), r.body
    st = state(rt, oid)
    assert (st["Mode"], st["Outcome"], st.get("LockedBy")) == ("held", "held", None)
    assert not [c for c in agents.calls if c[2] in ("release", "refund")]  # nothing undone: goods may have left
    before, sent = etags(rt, oid), rt.bus.sent_count
    assert handle_reply(rt, reply_to(ship)) in ("stale", "duplicate")  # fenced
    assert etags(rt, oid) == before and rt.bus.sent_count == sent
    view = get_order(rt, oid).body
    assert view["category"] == "attention" and names(view["history"])[-2:] == ["terminated", "held"]
    expect_index(rt, oid, "attention", finished=False)
    assert oid in page_through(rt, {"state": "attention"}, 10)[0]
    # the operator retries it: the shipment's key is replayed, and the order completes
    r = retry_order(rt, oid)
    assert (r.status, r.body["result"]) == (202, "retried"), r.body
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    assert [c[2] for c in agents.calls if c[0] == oid] == ["reserve", "charge", "ship"]
    expect_index(rt, oid, "processed", finished=True)


# retry and cancel ------------------------------------------------------------------------------
def test_retry_held_runs_from_the_failed_step(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime(workflow=HOLD)
    agents = AgentSim(rt, reject={"charge-payment": "declined"})
    oid = post(rt).body["orderId"]
    assert drive(rt, oid, agents)["Mode"] == "held"
    expect_index(rt, oid, "attention", finished=False)
    assert oid in page_through(rt, {"state": "attention"}, 10)[0]
    agents.reject.clear()
    r = retry_order(rt, oid)
    assert (r.status, r.body["result"], r.body["processState"]) == (202, "retried", "Pending"), r.body
    expect_index(rt, oid, "inFlight", finished=False)
    assert retry_order(rt, oid).status == 409
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st.get("Generation", 0)) == ("Processed", 0)
    assert [c[2] for c in agents.calls if c[0] == oid] == ["reserve", "charge", "ship"]  # reserve not redone
    assert f"{oid}:charge-payment" in agents.effects  # the same key, replayed
    history = names(events(rt, oid))
    assert history.count("retried") == 1 and history.index("held") < history.index("retried")
    expect_index(rt, oid, "processed", finished=True)
    assert oid not in page_through(rt, {"state": "attention"}, 10)[0]


def test_retry_failed_and_compensated_restarts_a_new_generation(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    agents = AgentSim(rt, reject={"create-shipment": "undeliverable"})
    oid = post(rt).body["orderId"]
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("failed", "completed")
    assert get_order(rt, oid).body["category"] == "attention"
    expect_index(rt, oid, "attention", finished=False)
    first_keys = set(agents.effects)

    agents.reject.clear()
    r = retry_order(rt, oid)
    assert (r.status, r.body["result"], r.body["processState"]) == (202, "restarted", "Pending"), r.body
    expect_index(rt, oid, "inFlight", finished=False)
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Generation"]) == ("Processed", 1)
    calls = [c[2] for c in agents.calls if c[0] == oid]
    assert calls == ["reserve", "charge", "refund", "release", "reserve", "charge", "ship"], calls
    fresh = set(agents.effects) - first_keys
    assert fresh == {f"{oid}:g1:{s.name}" for s in WORKFLOW}, fresh  # fresh keys: nothing undone is replayed
    view = get_order(rt, oid).body
    assert (view["generation"], view["category"]) == (1, "processed")
    restarted = [e for e in view["history"] if e["event"] == "restarted"]
    assert len(restarted) == 1 and restarted[0]["detail"]["generation"] == 1
    assert all(s["state"] == "Done" and s["failureReason"] is None and s["compensation"] is None
               for s in view["steps"]), view["steps"]
    expect_index(rt, oid, "processed", finished=True)
    assert retry_order(rt, oid).status == 409


def test_retry_failed_compensation_redrives_it(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime()
    agents = AgentSim(rt, reject={"create-shipment": "undeliverable", "charge-payment:compensate": "refund refused"})
    oid = post(rt).body["orderId"]
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("failed", "failed")
    assert get_order(rt, oid).body["category"] == "attention"
    expect_index(rt, oid, "attention", finished=False)
    assert (oid, "reserve-inventory", "release") in agents.calls  # the other compensation went on

    agents.reject.clear()
    r = retry_order(rt, oid)
    assert (r.status, r.body["result"], r.body["processState"]) == (202, "compensation-redriven", "Error"), r.body
    expect_index(rt, oid, "inFlight", finished=False)
    st = drive(rt, oid, agents)
    assert (st["ProcessState"], st["Outcome"], st["CompensationState"]) == ("Error", "failed", "completed")
    calls = [c[2] for c in agents.calls if c[0] == oid]
    assert calls == ["reserve", "charge", "release", "refund"], calls  # only the failed one redone
    s = steps(rt, oid)
    assert s["charge-payment"]["Compensation"] == "Done" and s["reserve-inventory"]["Compensation"] == "Done"
    history = names(events(rt, oid))
    tail = history[history.index("retried"):]
    assert tail == ["retried", "compensationDispatched", "compensationDone", "compensated"], tail
    # compensated now: still failed and awaiting a decision (attention); a retry restarts it
    expect_index(rt, oid, "attention", finished=False)
    r = retry_order(rt, oid)
    assert r.body["result"] == "restarted", r.body
    assert drive(rt, oid, agents)["ProcessState"] == "Processed"
    expect_index(rt, oid, "processed", finished=True)


def test_cancel_of_a_held_order_moves_its_index_rows(table_runtime) -> None:  # type: ignore[no-untyped-def]
    """Cancelling a held order compensates it: attention -> inFlight -> error. Each category
    change must move the order's index rows (as every other transition does), so that it is
    listed under inFlight while it compensates and keeps no attention row afterwards."""
    rt = table_runtime(workflow=HOLD)
    agents = AgentSim(rt, reject={"charge-payment": "declined"})
    oid = post(rt).body["orderId"]
    assert drive(rt, oid, agents)["Mode"] == "held"
    expect_index(rt, oid, "attention", finished=False)
    r = cancel_order(rt, oid)
    assert (r.status, r.body["result"]) == (202, "cancelling"), r.body
    assert get_order(rt, oid).body["category"] == "inFlight"
    rows_while_compensating = sorted(index_rows_of(rt, oid))
    listed_in_flight = page_through(rt, {"state": "inFlight"}, 10)[0]
    st = drive(rt, oid, agents)
    assert (st["Outcome"], st["CompensationState"]) == ("cancelled", "completed")
    rows_after = sorted(index_rows_of(rt, oid))
    assert oid in listed_in_flight, ("not listed while compensating", rows_while_compensating)
    assert not [k for k in rows_after if k.startswith("cat-attention-")], rows_after
    expect_index(rt, oid, "error", finished=True)
    rt.clock.advance((rt.config.retention_days + 2) * 24 * HOUR)
    assert purge(rt).orders == [oid]
    assert index_rows_of(rt, oid) == {}  # the purge leaves no row of it behind


# retention -------------------------------------------------------------------------------------
def test_retention_purges_old_finished_orders_and_keeps_the_rest(table_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = table_runtime(workflow=HOLD)
    agents = AgentSim(rt)
    days = rt.config.retention_days

    def finished(reject: dict[str, str] | None = None, key: str | None = None) -> str:
        agents.reject = dict(reject or {})
        oid = str(post(rt, headers={"Idempotency-Key": key} if key else None).body["orderId"])
        drive(rt, oid, agents)
        return oid

    processed = finished()
    cancelled = finished({"create-shipment": "undeliverable"})
    assert cancel_order(rt, cancelled).status == 202 and state(rt, cancelled)["Outcome"] == "cancelled"
    terminated = in_flight(rt, "c-1")
    assert terminate_order(rt, terminated).status == 202 and drive(rt, terminated, agents)["Outcome"] == "terminated"
    held = finished({"charge-payment": "declined"})
    failed = finished({"create-shipment": "undeliverable"})
    compfail = finished({"create-shipment": "undeliverable", "reserve-inventory:compensate": "gone"})
    running = in_flight(rt, "c-2")
    snapshot = index_snapshot(rt)
    for oid in (held, failed, compfail):
        expect_index(rt, oid, "attention", finished=False, snapshot=snapshot)
    expect_index(rt, processed, "processed", finished=True, snapshot=snapshot)
    for oid in (cancelled, terminated):
        expect_index(rt, oid, "error", finished=True, snapshot=snapshot)

    rt.clock.advance((days + 1) * 24 * HOUR)
    recent = finished(key="recent")  # finished RetentionDays + 1 after the others: kept
    rt.clock.advance(24 * HOUR)  # RetentionDays + 2 days after the first ones finished

    old = (processed, cancelled, terminated)
    kept = (held, failed, compfail, running, recent)
    snapshot = index_snapshot(rt)
    kept_before = {o: (index_rows_of(rt, o, snapshot), events(rt, o)) for o in kept}
    report = purge(rt)
    assert sorted(report.orders) == sorted(old) and report.purged == 3, report
    assert (report.errors, report.lost_races, report.skipped) == (0, 0, 0), report
    snapshot = index_snapshot(rt)
    for oid in old:
        assert rt.store.partition_keys(oid, 1000) == []  # state, order, steps and history: all gone
        assert rt.store.read_history(oid, 0, 1000) == []
        assert index_rows_of(rt, oid, snapshot) == {}
        assert get_order(rt, oid).status == 404 and get_history(rt, oid, {}).status == 404
        assert retry_order(rt, oid).status == 404
    for oid in kept:
        assert get_order(rt, oid).status == 200
        assert (index_rows_of(rt, oid, snapshot), events(rt, oid)) == kept_before[oid], oid
    assert sorted(page_through(rt, {}, 3)[0]) == sorted(kept)
    assert sorted(page_through(rt, {"state": "attention"}, 2)[0]) == sorted([held, failed, compfail])

    again = purge(rt)
    assert (again.purged, again.errors, again.skipped) == (0, 0, 0), again
    assert sweep(rt).errors == 0  # deadline rows of purged orders (if any were left) trip nothing
    # the recent one goes once it is old enough too; held and attention orders never do
    rt.clock.advance((days + 2) * 24 * HOUR)
    assert purge(rt).orders == [recent]
    assert {o for o in kept if get_order(rt, o).status == 200} == {held, failed, compfail, running}


def test_retention_skips_an_order_retried_since_it_was_listed(table_runtime) -> None:  # type: ignore[no-untyped-def]
    """A finish-day row whose order is no longer final (a stale row: say the order was retried
    after its index row was written) is dropped, and the order is kept."""
    rt = table_runtime()
    agents = AgentSim(rt, reject={"create-shipment": "undeliverable"})
    oid = post(rt).body["orderId"]
    drive(rt, oid, agents)  # failed and compensated: attention, no finish-day row
    stale = SearchRow(f"fin-{T0.strftime('%Y%m%d')}-{oid}", oid, Category.PROCESSED, rev="0", customer_key="x")
    rt.store.write_index([stale], [])
    rt.clock.advance((rt.config.retention_days + 2) * 24 * HOUR)
    report = purge(rt)
    assert (report.purged, report.skipped) == (0, 1), report
    assert get_order(rt, oid).status == 200
    expect_index(rt, oid, "attention", finished=False)  # the stale row is gone, the rest untouched


# the search index under load ---------------------------------------------------------------------
def test_many_orders_finishing_at_once_index_correctly(table_runtime) -> None:  # type: ignore[no-untyped-def]
    """Sixteen orders finish at the same moment on as many threads (half processed, half held; some
    with their inFlight row already gone, so that their delete fails its transaction and the
    writes are made again without it): every order ends with exactly its index rows."""
    rt = table_runtime(workflow=HOLD_SHIP)
    agents = AgentSim(rt)
    count = 16
    orders = [str(post(rt, {**BODY, "customerId": f"cust-{i % 3}"}).body["orderId"]) for i in range(count)]
    for _ in range(2):  # reserve, then charge: done for every order
        agents.work(rt.clock())
        agents.reply_all()
    ship_queue = rt.config.agent_queue(rt.config.spec("create-shipment"))
    requests = {m.body["orderId"]: m for m in rt.bus.take(ship_queue)}
    assert sorted(requests) == sorted(orders)
    snapshot = index_snapshot(rt)
    for i, oid in enumerate(orders):
        expect_index(rt, oid, "inFlight", finished=False, snapshot=snapshot)
        if i % 4 == 0:  # a stale index: the finishing write's delete of this row finds nothing
            [key] = [k for k in snapshot[oid] if k.startswith("cat-inFlight-")]
            rt.store.write_index([], [key])

    barrier = threading.Barrier(count)
    verdicts: dict[str, str] = {}
    errors: list[BaseException] = []

    def finish(i: int, oid: str) -> None:
        try:
            body = reply_to(requests[oid]) if i % 2 == 0 else reply_to(requests[oid], "error", "no stock")
            barrier.wait()
            verdicts[oid] = handle_reply(rt, body)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(i, oid)) for i, oid in enumerate(orders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    snapshot = index_snapshot(rt)
    for i, oid in enumerate(orders):
        st = state(rt, oid)
        if i % 2 == 0:
            assert st["ProcessState"] == "Processed", (oid, verdicts[oid])
            expect_index(rt, oid, "processed", finished=True, snapshot=snapshot)
        else:
            assert st["Mode"] == "held", (oid, verdicts[oid])
            expect_index(rt, oid, "attention", finished=False, snapshot=snapshot)
    assert set(snapshot) == set(orders)
    processed = [o for i, o in enumerate(orders) if i % 2 == 0]
    attention = [o for i, o in enumerate(orders) if i % 2 == 1]
    assert sorted(page_through(rt, {"state": "processed"}, 7)[0]) == sorted(processed)
    assert sorted(page_through(rt, {"state": "attention"}, 7)[0]) == sorted(attention)
    assert page_through(rt, {"state": "inFlight"}, 7)[0] == []
    assert sorted(page_through(rt, {"customerId": "cust-1"}, 4)[0]) == sorted(orders[1::3])
