"""The chaos run's bulk retry (bench/chaos_bulk.py): the plan (a batch of orders of a customer of
their own, refused by the inventory until the operator restocks, a quarter of them for good), and
the checks on made-up outcomes: the operation done, its counts, no order acted on twice, each
succeeded one restarted once, every order where it should end, a kill while it ran. No stack is
started; tests/e2e/test_chaos_bulk.py runs it through the stack."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.chaos import ChaosRun, evaluate, render_summary, replay_command
from bench.chaos_bulk import CUSTOMER, KEPT_EVERY, bulk_outcomes, render_bulk
from bench.chaos_records import ChaosOptions, OrderRec
from tests.e2e.test_chaos import NOW, _rec, _view

OP = "0123456789abcdef0123456789abcdef"


def _planned(**kw: Any) -> ChaosRun:
    run = ChaosRun(ChaosOptions(out=None, **{"orders": 20, "seed": 5, "bulk_orders": 8, **kw}))
    run.plan_orders()
    run.operator.plan()
    run.recs[:0] = run.bulk.plan()
    return run


def test_the_batch_is_planned_apart_and_posted_first() -> None:
    run = _planned()
    bulk = run.recs[:8]
    assert all(r.bulk and r.index >= 20 for r in bulk) and not any(r.bulk for r in run.recs[8:])
    assert {r.body["customerId"] for r in bulk} == {CUSTOMER.format(seed=5)}
    assert not any(r.body["customerId"] == CUSTOMER.format(seed=5) for r in run.recs[8:])
    assert all(any(i["sku"] == run.bulk.sku for i in r.body["items"]) for r in bulk)
    assert [run.bulk.kept(r) for r in bulk] == [j % KEPT_EVERY == KEPT_EVERY - 1 for j in range(8)]
    assert {r.workflow for r in bulk} == {"order", "digital", "express"}
    for r in bulk:  # nothing else is planned for them: they wait for no approval, no terminate
        assert r.reject is None and r.fix is None and r.terminate_after is None and r.restarts_planned == 0
        assert sum(i["quantity"] * i["unitPrice"] for i in r.body["items"]) < 1000
    # the rest of the seed's plan is as it was without the batch
    same = ChaosRun(ChaosOptions(out=None, orders=20, seed=5))
    same.plan_orders()
    same.operator.plan()
    assert [(r.key, r.body, r.terminate_after) for r in same.recs] == [
        (r.key, r.body, r.terminate_after) for r in run.recs[8:]]


def test_the_inventory_refuses_the_batch_until_restocked_and_the_kept_causes_for_good() -> None:
    run = _planned()
    calls: dict[str, dict[str, Any]] = {}
    run.stack = SimpleNamespace(remotes=SimpleNamespace(set_faults=lambda svc, **kw: calls.__setitem__(svc, kw)))
    run.apply_remote_faults()
    kept = [i["sku"] for r in run.recs if run.bulk.kept(r) for i in r.body["items"] if i["sku"].count("-") == 3]
    assert len(kept) == 2 and set(run.bulk.refused_skus()) == {run.bulk.sku, *kept}
    assert set(run.bulk.refused_skus()) <= set(calls["inventory"]["rejectSkus"])
    run.remote_faults_off()  # no chaos fault: it stays
    assert set(run.bulk.refused_skus()) <= set(calls["inventory"]["rejectSkus"])
    run.remove_remote_cause("restock", run.bulk.sku)  # the operator's fix: the kept ones stay
    assert run.bulk.sku not in calls["inventory"]["rejectSkus"] and set(kept) <= set(calls["inventory"]["rejectSkus"])
    assert _planned(bulk_orders=0).bulk.refused_skus() == []


def test_the_options_on_the_command_line_and_in_the_replay() -> None:
    assert "--bulk" not in replay_command(ChaosOptions(orders=10, seed=1).resolved())
    replay = replay_command(ChaosOptions(orders=10, seed=1, bulk_orders=30, bulk_per_tick=2).resolved())
    assert "--bulk-orders 30" in replay and "--bulk-per-tick 2" in replay
    for bad in ({"bulk_orders": -1}, {"bulk_orders": 10_001}, {"bulk_per_tick": 0}):
        try:
            ChaosOptions(**bad).resolved()  # type: ignore[arg-type]
        except ValueError as e:
            assert "--bulk" in str(e)
        else:
            raise AssertionError(f"{bad} was accepted")


# ---- made-up outcomes ----------------------------------------------------------------------------


def _ev(kind: str, op: str | None = OP, by: str | None = "ops@example.com") -> dict[str, Any]:
    detail = {k: v for k, v in (("operationId", op), ("by", by)) if v}
    return {"event": kind, "detail": detail or None}


def _batch() -> tuple[list[OrderRec], dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """b1, b2: restarted once by the operation and processed; b3: restarted once, failed again (kept)."""
    recs = [_rec(i, f"b{i}") for i in (1, 2, 3)]
    for r in recs:
        r.bulk, r.bulk_restarts = True, 1
    views = {"b1": (200, {**_view("b1", "Processed"), "generation": 1}),
             "b2": (200, {**_view("b2", "Processed"), "generation": 1}),
             "b3": (200, {**_view("b3", "Error", outcome="failed"), "generation": 1})}
    hist = {oid: [_ev("accepted", None, None), _ev("failed", None, None), _ev("restarted")] for oid in views}
    return recs, views, hist


def _kept(rec: OrderRec) -> bool:
    return rec.order_id == "b3"


def _checks(recs: list[OrderRec], views: dict[str, Any], hist: dict[str, list[dict[str, Any]]],
            op: dict[str, Any] | None = None, kills: list[dict[str, Any]] | None = None) -> set[str]:
    op = op if op is not None else {"state": "done", "matched": 3, "succeeded": 3, "failed": 0}
    kills = kills if kills is not None else [{"during": "post", "afterSeconds": 0.4}]
    out = bulk_outcomes(recs, _kept, OP, op, views, hist, kills=kills, post={"status": 202}, problems=[])
    return {k for k, v in out["checks"].items() if not v["ok"]}


def test_a_clean_bulk_retry_passes() -> None:
    recs, views, hist = _batch()
    assert _checks(recs, views, hist) == set()
    out = bulk_outcomes(recs, _kept, OP, {"state": "done", "matched": 3, "succeeded": 3, "failed": 0}, views, hist,
                        kills=[{"during": "ticks", "afterSeconds": 2.0}], post={"status": 202}, problems=[])
    assert out["summary"]["actedOn"] == 3 and out["summary"]["keptCause"] == 1
    line = "\n".join(render_bulk(out))
    assert "matched 3, succeeded 3, failed 0" in line and "ticks at 2.0s" in line
    assert render_bulk({}) == []


def test_checks_catch_an_order_acted_on_twice() -> None:
    recs, views, hist = _batch()
    hist["b3"] += [_ev("failed", None, None), _ev("restarted")]  # a second pass restarted it again
    views["b3"] = (200, {**views["b3"][1], "generation": 2})
    assert _checks(recs, views, hist) == {"bulkOrdersActedOnTwice", "bulkSucceededNotRestartedOnce",
                                          "bulkOrdersEndedWrongly"}


def test_checks_catch_counts_that_do_not_add_up_or_a_success_never_acted() -> None:
    recs, views, hist = _batch()
    assert _checks(recs, views, hist, {"state": "done", "matched": 3, "succeeded": 2, "failed": 0}) == {
        "bulkCountsNotAddingUp", "bulkSucceededNotRestartedOnce"}
    hist["b2"] = hist["b2"][:2]  # counted as succeeded, but no event of the operation on it
    views["b2"] = (200, {**views["b2"][1], "generation": 0})
    assert _checks(recs, views, hist) == {"bulkSucceededNotRestartedOnce", "bulkOrdersEndedWrongly"}
    assert _checks(recs, views, hist, {"state": "done", "matched": 4, "succeeded": 2, "failed": 2}) >= {
        "bulkMatchedOtherThanTheBatch"}


def test_checks_catch_a_running_operation_an_event_without_by_and_no_kill() -> None:
    recs, views, hist = _batch()
    assert "bulkOperationDone" in _checks(recs, views, hist, {"state": "running", "matched": 3, "succeeded": 3,
                                                               "failed": 0})
    assert _checks(recs, views, hist, kills=[]) == {"bulkKillsWhileRunning"}
    hist["b1"][-1] = _ev("restarted", by=None)
    assert _checks(recs, views, hist) == {"bulkEventsWithoutBy"}


def test_checks_catch_an_order_that_ends_where_it_should_not() -> None:
    recs, views, hist = _batch()
    recs[0].body = {"items": [{"sku": "SKU-1"}, {"sku": "SKU-BULK-5"}]}
    # its cause was fixed, but it failed again on a chaos fault: where it may end
    views["b1"] = (200, {**_view("b1", "Error", outcome="failed"), "generation": 1,
                         "reason": "timed out (attempt 1); failure count 2 reached 2"})
    assert _checks(recs, views, hist) == set()
    views["b1"][1]["reason"] = "out of stock: SKU-BULK-5"  # ... but never on the restocked SKU
    assert _checks(recs, views, hist) == {"bulkOrdersEndedWrongly"}
    views["b1"] = (200, {**_view("b1", "Processed"), "generation": 1})
    views["b3"] = (200, {**_view("b3", "Processed"), "generation": 1})  # its cause was kept
    assert _checks(recs, views, hist) == {"bulkOrdersEndedWrongly"}


def test_a_bulk_restart_is_a_generation_the_operator_asked_for() -> None:
    recs, views, _ = _batch()
    checks, _, _ = evaluate(recs, views, [], now=NOW, sweep_seconds=3)
    assert checks["generationsNotFromAnOperatorRestart"]["ok"]
    recs[0].bulk_restarts = 0  # restarted by nobody
    checks, _, _ = evaluate(recs, views, [], now=NOW, sweep_seconds=3)
    assert checks["generationsNotFromAnOperatorRestart"]["value"] == 1


def test_the_summary_prints_the_bulk_checks() -> None:
    recs, views, hist = _batch()
    checks, summary, examples = evaluate(recs, views, [], now=NOW, sweep_seconds=3)
    bulk = bulk_outcomes(recs, _kept, OP, {"state": "done", "matched": 3, "succeeded": 3, "failed": 0}, views, hist,
                         kills=[{"during": "post", "afterSeconds": 0.4}], post={"status": 202}, problems=[])
    checks.update(bulk["checks"])
    report = {"seed": 1, "replay": "x", "ok": True, "checks": checks, "bulk": bulk,
              "orders": {"planned": 3, **summary},
              "faults": {"remoteInjected": {}, "permanentRejections": {"reserve422": 0, "charge422": 0,
                                                                        "ordersDesigned": 0},
                         "hostInstanceKills": 1, "serviceBusEmulatorRestarts": 0, "azuriteRestarts": 0,
                         "shippingOutageWindows": 0, "duplicateSubmissions": 0, "duplicateDeliveries": 0,
                         "duplicateRequestDeliveries": 0, "duplicateReplyDeliveries": 0, "remoteCalls": {},
                         "remote503": {}}}
    text = render_summary(report)
    assert "[ok ] bulkOrdersActedOnTwice: 0" in text and "bulk retry " + OP in text


def test_a_bulk_order_seen_before_the_operation_reached_it_is_polled_until_it_shows_the_restart() -> None:
    """A poll can read an order after the operation started but before it acted on it: that view
    (generation 0, failed) looks final, yet the order is about to run again."""
    run = _planned()
    rec = run.recs[0]
    rec.order_id, rec.view = "b0", {**_view("b0", "Error", outcome="failed"), "generation": 0}
    assert not run.bulk.behind(rec)  # the operation has not started: nothing is owed
    rec.bulk_restarts = 1
    assert run.bulk.behind(rec)
    run.bulk.finished = True
    run.posted = len(run.recs)
    for other in run.recs[1:]:
        other.order_id, other.view = f"o{other.index}", _view(f"o{other.index}", "Processed")
    assert not run.all_settled()
    rec.view = {**_view("b0", "Processed"), "generation": 1}
    assert not run.bulk.behind(rec) and run.all_settled()
    rec.view = {**_view("b0", "Error", outcome="failed"), "generation": 0}
    run.bulk.operation = {"state": "done", "failed": 1}  # it was counted failed: it may never restart
    assert not run.bulk.behind(rec)
