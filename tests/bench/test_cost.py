"""Issue 15's cost report (``bench.cost``, ``bench.report``) on counted windows built by hand: the
target per order at saturation by table and kind with the breaker's reads on their own line, and
the relations the counts must satisfy (each shown to fail when broken)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench.cost import consistency, saturation_cost
from bench.report import per_order, targets

ORDERS = 10


def t(requests: int, entities: int) -> dict[str, float]:
    return {"requests": requests, "entities": entities, "failed": 0, "seconds": 0.1 * requests}


def window(breaker_reads: int = 12, breaker_queries: int = 0) -> dict[str, Any]:
    """10 orders of 3 steps: 4 state transactions each, the deadline put and delete, the search
    index written behind, the breaker read ``breaker_reads`` times (point reads) and queried
    ``breaker_queries`` times (an instance's every breaker at once), the agents' checks (a point
    read of the state row per request) with the sweep's one point read beside them, and the
    sweep's own queries."""
    table = {"orders|batch": t(40, 130), "deadlines|upsert": t(7, 7), "deadlines|batch": t(3, 10),
             "orderindex|batch": t(2, 20), "orders|get|breakers": t(breaker_reads, 0),
             "deadlines|query": t(5, 3), "orders|get": t(31, 31), "orders|query|waiting": t(3, 0)}
    if breaker_queries:
        table["orders|query|breakers"] = t(breaker_queries, 3 * breaker_queries)
    request = {"sent": ORDERS, "delivered": ORDERS, "completed": ORDERS}
    bus = {"scheduler": {"sent": 0, "delivered": 0, "completed": 0},
           "replies": {"sent": 3 * ORDERS, "delivered": 3 * ORDERS + 1, "completed": 3 * ORDERS},
           **{f"agent-{a}": dict(request) for a in ("inventory", "payment", "shipping")},
           "order-status": {"sent": 5 * ORDERS, "delivered": 5 * ORDERS}}
    return {"table": table, "bus": bus, "seconds": 5.0}


def result(breaker_reads: int = 12, breaker_queries: int = 0) -> dict[str, Any]:
    return {"phases": {"saturation": {"processed": ORDERS, "orders_posted": ORDERS, "orders_per_s": 2.0,
                                      "window": window(breaker_reads, breaker_queries)}}}


def test_the_cost_at_saturation_by_table_and_kind_with_the_breaker_reads_apart() -> None:
    cost = saturation_cost(result())
    assert cost is not None
    # 40 + 7 + 3 + 2 + 12 + 31 work requests over 10 orders; the sweep's 8 queries apart
    assert cost["requests_per_order"] == 9.5
    assert cost["requests_per_order_by_table"] == {"deadlines": 1.0, "orderindex": 0.2, "orders": 8.3}
    assert cost["breaker_reads_per_order"] == 1.2
    # the Supervisor lists the waiting steps of each closed breaker as often as it reads it
    assert cost["breaker_reads_per_order_by_reader"] == {"agents": 0.9, "supervisor": 0.3}
    assert cost["requests_per_order_by_kind"]["orders|get|breakers"] == 1.2
    assert cost["requests_per_order_by_kind"]["orders|get"] == 3.1  # the agents' checks are work
    assert cost["sweep_requests_in_window"] == {"deadlines|query": 5, "orders|query|waiting": 3}
    assert cost["target"]["met"] is False and "9.5 per order" in cost["target"]["value"]
    without_breaker = saturation_cost(result(breaker_reads=0))
    assert without_breaker is not None and without_breaker["target"]["met"] is False  # 8.3 > 5
    cheap = result(breaker_reads=0)
    for kind in ("deadlines|upsert", "orders|get"):
        cheap["phases"]["saturation"]["window"]["table"][kind] = t(0, 0)
    met = saturation_cost(cheap)
    assert met is not None and met["requests_per_order"] == 4.5 and met["target"]["met"]


def test_an_instances_query_of_every_breaker_counts_as_breaker_reads_and_in_the_cost() -> None:
    """``orders|query|breakers`` (shared.agent.board) is a breaker read: in the breaker line, the
    agents' share, the total and its table, and the relations still hold."""
    cost = saturation_cost(result(breaker_reads=3, breaker_queries=4))
    assert cost is not None
    assert cost["breaker_reads_per_order"] == 0.7  # 4 queries + 3 point reads over 10 orders
    assert cost["breaker_reads_per_order_by_reader"] == {"agents": 0.4, "supervisor": 0.3}
    assert cost["requests_per_order_by_kind"]["orders|query|breakers"] == 0.4
    assert cost["requests_per_order"] == 9.0 and cost["requests_per_order_by_table"]["orders"] == 7.8
    r = result(breaker_reads=3, breaker_queries=4)
    checks = consistency(per_order(r), saturation_cost(r))
    assert checks and all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]


def test_the_report_shows_the_new_target_and_retires_the_storage_bound_ones() -> None:
    r = result()
    r["azurite_raw"] = {"best_tx_per_s": 800}
    r["cost_at_saturation"] = saturation_cost(r)
    names = [x["target"] for x in targets(r, per_order(r))]
    assert any(n.startswith("<= 5 table requests per order of 3 steps at saturation") for n in names)
    assert not any("storage-bound" in n or "<= 3 table transactions per step" in n for n in names)


def test_consistent_counts_satisfy_every_relation() -> None:
    r = result()
    checks = consistency(per_order(r), saturation_cost(r))
    assert checks and all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    four = next(c for c in checks if c["check"].startswith("work-queue messages per step == 4"))
    assert four["detail"]["redeliveries"] == 1  # at-least-once delivery: counted, not a break


@pytest.mark.parametrize(("path", "value", "broken"), [
    (("bus", "replies", "completed"), 29, "replies: every message sent was completed"),
    (("bus", "agent-payment", "sent"), 11, "work-queue messages per step == 4"),
    (("table", "orders|batch"), t(30, 130), "state transactions per order >= steps + 1"),
    (("table", "orders|batch"), t(40, 35), "state entities written per order >= state transactions"),
])
def test_each_relation_fails_when_the_counts_break_it(path: tuple[str, ...], value: Any, broken: str) -> None:
    r = copy.deepcopy(result())
    node = r["phases"]["saturation"]["window"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    failed = [c["check"] for c in consistency(per_order(r), saturation_cost(r)) if not c["ok"]]
    assert any(f.startswith(broken) for f in failed), failed


def test_re_sends_on_the_scheduler_queue_allow_more_than_four_messages_per_step() -> None:
    r = copy.deepcopy(result())
    bus = r["phases"]["saturation"]["window"]["bus"]
    bus["scheduler"] = {"sent": 1, "delivered": 1, "completed": 1}  # a redrive
    bus["agent-payment"] = {"sent": ORDERS + 1, "delivered": ORDERS + 1, "completed": ORDERS + 1}
    checks = consistency(per_order(r), saturation_cost(r))
    assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    assert any(c["check"].startswith("work-queue messages per step >= 4") for c in checks)


def test_the_emulators_management_operations_are_counted_in_all_and_by_name() -> None:
    from bench import busstats

    before = {"agent-payment": {"sent": 0, "delivered": 0, "completed": 0, "management": {"renew-lock": 1}}}
    after = {"agent-payment": {"sent": 4, "delivered": 5, "completed": 4, "abandoned": 1,
                               "management": {"renew-lock": 4, "peek-message": 2, "update-disposition": 1}}}
    bus = busstats.diff(after, before)["agent-payment"]
    assert bus["management"] == 6 and bus["management:renew-lock"] == 3 and bus["management:peek-message"] == 2
    assert (bus["sent"], bus["delivered"], bus["completed"], bus["abandoned"]) == (4, 5, 4, 1)
