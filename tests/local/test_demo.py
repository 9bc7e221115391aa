"""The demo's order mix (local.demo), without a stack: which orders fail, where, and why they do."""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest

from local.demo import (
    DEMO_FAULTS,
    FAILING_CUSTOMER,
    FAILING_KINDS,
    PAYMENT_LIMIT,
    SLOW_SHIP_SKU,
    SOLD_OUT_SKU,
    demo,
    demo_plan,
    failing_slots,
    render_progress,
    summary,
)
from local.remotes.server import FAULT_DEFAULTS, validate_faults
from shared.core import jsonio
from shared.core.orders import OrderRequest
from shared.core.workflows import load_registry


def _order(body: dict[str, Any]) -> OrderRequest:
    """The body as the submission endpoint parses it (JSON, numbers as Decimals)."""
    return OrderRequest.model_validate(jsonio.loads(json.dumps(body)))


def _skus(body: dict[str, Any]) -> set[str]:
    return {item["sku"] for item in body["items"]}


def test_the_failing_orders_are_one_of_each_kind_among_the_orders() -> None:
    plan = demo_plan(20, random.Random(1))
    assert len(plan) == 20
    failing = [o.failing.name for o in plan if o.failing]
    assert failing == ["payment-declined", "shipment-hangs", "out-of-stock"]
    assert [o.awaited for o in plan if o.failing] == [True, False, True]  # the demo does not wait for the hang
    assert all(o.body["customerId"] == FAILING_CUSTOMER for o in plan if o.failing)
    assert all(o.body["customerId"] != FAILING_CUSTOMER for o in plan if not o.failing)


def test_no_failing_orders_posts_the_same_ordinary_orders_and_nothing_else() -> None:
    with_failing = demo_plan(20, random.Random(1))
    without = demo_plan(20, random.Random(1), failing=False)
    assert all(o.failing is None and o.awaited for o in without)
    # The ordinary orders are the same draws either way: only the failing orders' places differ.
    assert [o.body for o in with_failing if not o.failing] == [
        o.body for o, w in zip(without, with_failing, strict=True) if not w.failing]


@pytest.mark.parametrize("orders", [1, 2, 3, 4, 5, 7, 10, 100, 1000])
def test_failing_slots_are_distinct_and_spread(orders: int) -> None:
    kinds = min(len(FAILING_KINDS), orders)
    slots = failing_slots(kinds, orders)
    assert len(set(slots)) == kinds and all(0 <= s < orders for s in slots)
    assert slots == sorted(slots)
    plan = demo_plan(orders, random.Random(0))
    assert [o.failing for o in plan if o.failing] == list(FAILING_KINDS[:kinds])


def test_a_quarter_of_the_ordinary_demo_orders_run_the_digital_workflow() -> None:
    plan = demo_plan(100, random.Random(1), failing=False)
    digital = [i for i, o in enumerate(plan) if o.body.get("workflow") == "digital"]
    assert digital == list(range(3, 100, 4))
    assert all("workflow" not in o.body for i, o in enumerate(plan) if i not in digital)  # the default: order


def test_zero_orders_is_an_empty_plan() -> None:
    assert demo_plan(0, random.Random(0)) == []


def test_each_failing_order_is_a_valid_order_that_trips_its_fault() -> None:
    bodies = {o.failing.name: o.body for o in demo_plan(10, random.Random(0)) if o.failing}
    orders = {name: _order(body) for name, body in bodies.items()}  # the API accepts them all
    assert orders["payment-declined"].total > Decimal(PAYMENT_LIMIT)
    # over 1000, order v2 holds it for an approval: the demo sends it, and only for it
    approval = load_registry().latest("order").step("approval")
    assert approval is not None and approval.when is not None
    assert {name for name, o in orders.items() if approval.runs_for({**o.model_dump(), "total": o.total})} == {
        name for name, kind in ((k.name, k) for k in FAILING_KINDS) if kind.approve} == {"payment-declined"}
    assert SLOW_SHIP_SKU in _skus(bodies["shipment-hangs"])
    assert orders["shipment-hangs"].total <= Decimal(PAYMENT_LIMIT)  # it gets as far as the shipment
    assert SOLD_OUT_SKU in _skus(bodies["out-of-stock"])
    assert DEMO_FAULTS["payment"]["rejectAmountOver"] == PAYMENT_LIMIT
    assert DEMO_FAULTS["shipping"]["hangSkus"] == [SLOW_SHIP_SKU]
    assert DEMO_FAULTS["inventory"]["rejectSkus"] == [SOLD_OUT_SKU]


def test_the_demo_faults_are_valid_and_spare_every_ordinary_order() -> None:
    for faults in DEMO_FAULTS.values():
        assert set(faults) <= set(FAULT_DEFAULTS)
        validate_faults(faults)
    ordinary = [o.body for o in demo_plan(2000, random.Random(3)) if not o.failing]
    assert max(_order(b).total for b in ordinary) <= Decimal(PAYMENT_LIMIT)
    assert not any(_skus(b) & {SOLD_OUT_SKU, SLOW_SHIP_SKU} for b in ordinary)


def test_render_progress_line() -> None:
    """By search category, as the live line after the demo counts (local.watch): the bar and its
    count are the orders no longer in flight."""
    counts = Counter({"inFlight": 23, "attention": 1, "processed": 11})
    line = render_progress(counts, 50, 35, 0, 4.25)
    assert line == ("[#######-----------------------] 12/50  inFlight 23 · attention 1 · processed 11 · error 0"
                    "  posted 35/50  4.2s")
    assert len(render_progress(counts, 50, 35, 2, 4.25, columns=60)) <= 59
    # a category the demo does not know (a newer app's) is shown after the known ones, and counted as finished
    assert "processed 11 · error 0 · parked 2  " in render_progress(counts + Counter(parked=2), 50, 50, 0, 1.0)
    assert " 14/50 " in render_progress(counts + Counter(parked=2), 50, 50, 0, 1.0)


def test_the_demo_counts_in_the_words_of_the_live_line_after_it() -> None:
    """One vocabulary, one line apart: the demo's summary and the live count line (every order in
    the store) both name the search categories, in the same order and the same form; a failed order
    is in attention there (processState Error), not in error."""
    from datetime import UTC, datetime

    from local.watch import CATEGORIES, Tally, render_tally

    counts = Counter({"inFlight": 1, "attention": 2, "processed": 97})
    done = summary(counts)
    assert done == "100 orders by search category: inFlight 1 · attention 2 · processed 97 · error 0"
    live = render_tally(Tally(dict(counts) | {"error": 0}), datetime(2026, 1, 1, tzinfo=UTC))
    assert live.split("orders: ", 1)[1] == done.split("search category: ", 1)[1]
    assert [part.split()[0] for part in done.split(": ", 1)[1].split(" · ")] == list(CATEGORIES)


def test_a_demo_without_failing_orders_sets_no_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    """With only ordinary orders, the simulator is left alone (run_demo stubbed: no stack)."""
    import local.demo as demo_module

    calls: list[str] = []
    monkeypatch.setattr(demo_module, "set_demo_faults", lambda remotes: calls.append("faults"))
    monkeypatch.setattr(demo_module, "run_demo", lambda stack, plan, rate, out: (Counter(processed=len(plan)), []))

    class _Stack:
        remotes = None

    out = io.StringIO()
    demo(_Stack(), 5, 10.0, False, out)  # type: ignore[arg-type]
    assert calls == []
    assert out.getvalue() == ("posting 5 demo orders at 10/s ...\n"
                              "demo done: 5 orders by search category: "
                              "inFlight 0 · attention 0 · processed 5 · error 0\n")


def test_the_tracker_waits_for_each_awaited_order_to_leave_in_flight() -> None:
    """The tracker reads each order's ``category``, not its processState: an order whose step failed
    (processState Error) while it is still compensating is in flight, and the demo waits for it."""
    from local.demo import OrderTracker

    answers = {"o-1": {"processState": "Processed", "category": "processed"},
               "o-2": {"processState": "Error", "category": "inFlight"},  # compensating
               "o-3": {"processState": "Processing", "category": "inFlight"}}

    class _Stack:
        def get_order(self, order_id: str, session: Any = None, timeout: float = 30.0) -> dict[str, Any]:
            return answers[order_id]

    tracker = OrderTracker(_Stack(), workers=1)  # type: ignore[arg-type]
    try:
        tracker.add("o-1")
        tracker.add("o-2")
        tracker.add("o-3", awaited=False)  # the hanging shipment: posted, not waited for
        assert tracker.counts() == Counter(inFlight=3)
        tracker.poll()
        assert tracker.counts() == Counter(inFlight=2, processed=1)
        assert not tracker.done(3)
        answers["o-2"] = {"processState": "Error", "category": "attention"}  # compensated: failed, an operator's
        tracker.poll()
        assert tracker.counts() == Counter(inFlight=1, attention=1, processed=1) and tracker.done(3)
    finally:
        tracker.close()
