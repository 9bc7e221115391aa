"""The chaos run's express orders (bench/chaos_express.py): a parallel step (reserve and charge at
once, then ship) in the mix. The plan, what the operator does to them, and the express checks on
made-up outcomes: compensations in reverse order of the branches' completion, no branch effect
standing on a failed order, every stopped branch compensated by its key. No stack is started."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from bench.chaos import (
    EXPRESS_WORKFLOW,
    ChaosRun,
    evaluate,
    plan_workflows,
    render_summary,
    replay_command,
)
from bench.chaos_express import GROUP_TERMINATE_AFTER, at_pivot, express_rejections
from bench.chaos_ledger import effects_for, parse_key, step_key, view_effects
from bench.chaos_operator import charging
from bench.chaos_records import ChaosOptions, OrderRec
from shared.core.statemachine.groups import STOPPED_REASON
from shared.core.states import TERMINATED_REASON
from tests.e2e.test_chaos import NOW, _good, _rec, _view

EXPRESS = {"name": "express", "version": 1}
CI = {"orders": 200, "seed": 20261122, "reject_rate": 0.02, "terminate_rate": 0.05, "fixable_rate": 0.015,
      "digital_share": 0.3, "express_share": 0.15}


def _planned(**kw: Any) -> ChaosRun:
    run = ChaosRun(ChaosOptions(out=None, **{**CI, **kw}))
    run.plan_orders()
    events = run.plan_events()
    run.operator.plan()
    run.express.plan(events)
    run.approvals.plan()
    return run


# ---- made-up outcomes ----------------------------------------------------------------------------


def _at(seconds: float | None) -> str | None:
    return None if seconds is None else (NOW + timedelta(seconds=seconds)).isoformat()


def _branch(name: str, state: str, finished: float | None = None, comp: str | None = None,
            reason: str | None = None) -> dict[str, Any]:
    return {"name": name, "kind": "call", "group": "prepare", "state": state, "finishedAt": _at(finished),
            "failureReason": reason, "compensation": {"state": comp} if comp else None}


def _xview(oid: str, state: str, outcome: str | None, reserve: dict[str, Any], charge: dict[str, Any], *,
           ship: str = "Pending", ship_reason: str | None = None, comp: str = "none",
           failed_step: str | None = None, generation: int = 0) -> dict[str, Any]:
    ship_row = {"name": "create-shipment", "kind": "call", "group": None, "state": ship, "finishedAt": None,
                "failureReason": ship_reason, "compensation": None}
    return {**_view(oid, state, comp, outcome=outcome), "workflow": EXPRESS, "generation": generation,
            "steps": [reserve, charge, ship_row], "failedStep": failed_step, "history": []}


def _xfx(oid: str, operation: str, kind: str = "effect", generation: int = 0) -> dict[str, Any]:
    """A ledger entry of an express order, keyed as the app keys it."""
    steps = effects_for("express", 1)
    name = next(n for n, (_, fwd, comp) in steps.items() if operation in (fwd, comp))
    key = step_key(oid, name, generation)
    entry = {"service": steps[name][0], "operation": operation, "orderId": oid, "kind": kind,
             "idempotencyKey": key}
    if operation != steps[name][1]:
        entry["idempotencyKey"], entry["compensates"] = f"{key}:compensate", key
    return entry


def _xrec(i: int, oid: str, **fields: Any) -> OrderRec:
    rec = _rec(i, oid)
    rec.workflow = EXPRESS_WORKFLOW
    for k, v in fields.items():
        setattr(rec, k, v)
    return rec


def _express() -> tuple[list[OrderRec], dict[str, Any], list[dict[str, Any]]]:
    """Beside o1/o2 (order workflow): x1 processed; x2 a charge refused after the reservation was
    done (released); x3 a charge refused while the reservation ran (stopped: a tombstone); x4
    terminated while its group ran (the reservation stopped: a tombstone; the charge refunded);
    x5 terminated at its shipment (held), then cancelled: the charge finished last, so it is
    refunded before the reservation is released."""
    recs, views, ledger = _good()
    recs += [_xrec(21, "x1"), _xrec(22, "x2", reject="amount"), _xrec(23, "x3", reject="amount"),
             _xrec(24, "x4", express_plan="groupTerminate", terminate_after=3.0, terminate_status=202,
                   terminate_result="terminating"),
             _xrec(25, "x5", express_plan="pivotCancel", terminate_status=202, terminate_result="held",
                   cancel_status=202, cancel_result="cancelling")]
    refused = "amount 60000 EUR exceeds the limit 50000"
    views["x1"] = (200, _xview("x1", "Processed", "processed", _branch("reserve-inventory", "Done", 1),
                               _branch("charge-payment", "Done", 2), ship="Done"))
    views["x2"] = (200, _xview("x2", "Error", "failed", _branch("reserve-inventory", "Done", 1, "Done"),
                               _branch("charge-payment", "Failed", 2, reason=refused),
                               comp="completed", failed_step="charge-payment"))
    views["x3"] = (200, _xview("x3", "Error", "failed",
                               _branch("reserve-inventory", "Failed", 2, "Done", STOPPED_REASON),
                               _branch("charge-payment", "Failed", 2, reason=refused),
                               comp="completed", failed_step="charge-payment"))
    views["x4"] = (200, _xview("x4", "Error", "terminated",
                               _branch("reserve-inventory", "Failed", 3, "Done", TERMINATED_REASON),
                               _branch("charge-payment", "Done", 1, "Done"), comp="completed",
                               failed_step="reserve-inventory"))
    views["x5"] = (200, _xview("x5", "Error", "cancelled", _branch("reserve-inventory", "Done", 1, "Done"),
                               _branch("charge-payment", "Done", 2, "Done"), ship="Failed",
                               ship_reason=TERMINATED_REASON, comp="completed", failed_step="create-shipment"))
    ledger += [_xfx("x1", "reserve"), _xfx("x1", "charge"), _xfx("x1", "ship"),
               _xfx("x2", "reserve"), _xfx("x2", "release"),
               _xfx("x3", "release", kind="tombstone"),
               _xfx("x4", "charge"), _xfx("x4", "release", kind="tombstone"), _xfx("x4", "refund"),
               _xfx("x5", "reserve"), _xfx("x5", "charge"), _xfx("x5", "refund"), _xfx("x5", "release")]
    return recs, views, _numbered(ledger)


def _numbered(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The simulator numbers its ledger (``seq``) in the order the effects were applied."""
    return [{**e, "seq": i + 1} for i, e in enumerate(ledger)]


def _failing(recs: list[OrderRec], views: dict[str, Any], ledger: list[dict[str, Any]], **kw: Any) -> set[str]:
    checks, _, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3, **kw)
    return {k for k, v in checks.items() if not v["ok"]}


def _without(ledger: list[dict[str, Any]], oid: str, operation: str) -> list[dict[str, Any]]:
    return [e for e in ledger if not (e["orderId"] == oid and e["operation"] == operation)]


def test_express_orders_pass_every_check() -> None:
    recs, views, ledger = _express()
    checks, summary, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    assert all(v["ok"] for v in checks.values()), {k: v for k, v in checks.items() if not v["ok"]}
    ex = summary["express"]
    assert ex["orders"] == 5 and ex["outcomes"] == {"processed": 1, "failed": 2, "terminated": 1, "cancelled": 1}
    assert ex["reverseOrder"] == {"bothUndone": 1, "passed": 1, "ties": 0, "notComparable": 0}
    assert ex["stoppedBranches"] == {"byFailure": 1, "byTerminate": 1, "tombstones": 2, "undone": 0}
    assert ex["rejections"] == {"charge-payment": {"orders": 2, "generations": 2, "otherUndone": 1,
                                                   "otherTombstoned": 1}}
    assert ex["plans"]["pivotCancel"] == {"planned": 1, "terminate:held": 1, "cancel:cancelling": 1}
    assert ex["bothBranchesStanding"] == 0
    assert summary["operator"]["cancelled"] == 1


def test_checks_catch_compensations_in_the_wrong_order() -> None:
    """x5's charge finished after its reservation: the refund must come first."""
    recs, views, ledger = _express()
    swapped = [e for e in ledger if not (e["orderId"] == "x5" and e["operation"] in ("refund", "release"))]
    swapped = _numbered(swapped + [_xfx("x5", "release"), _xfx("x5", "refund")])
    assert _failing(recs, views, swapped) == {"expressCompensationsOutOfOrder"}
    _, _, examples = evaluate(recs, views, swapped, now=NOW, sweep_seconds=3)
    assert examples["expressOutOfOrder"][0]["expected"] == ["charge-payment", "reserve-inventory"]
    # ... which is right if the reservation finished last
    views["x5"][1]["steps"][0]["finishedAt"] = _at(3)
    assert _failing(recs, views, swapped) == set()
    # branches that finished at the same instant (one failed, the other stopped with it) may go either way
    views["x5"][1]["steps"][0]["finishedAt"] = _at(2)
    checks, summary, _ = evaluate(recs, views, swapped, now=NOW, sweep_seconds=3)
    assert all(v["ok"] for v in checks.values()) and summary["express"]["reverseOrder"]["ties"] == 1


def test_checks_catch_a_branch_effect_standing_on_a_failed_order() -> None:
    """x2's charge was refused after its reservation was done: the reservation must end released."""
    recs, views, ledger = _express()
    kept = _without(ledger, "x2", "release")
    assert _failing(recs, views, kept) == {"expressFailedOrdersWithBranchEffectsStanding",
                                           "expressBranchesNotCompensatedByKey", "failedOrdersFullyCompensatedPercent"}
    _, _, examples = evaluate(recs, views, kept, now=NOW, sweep_seconds=3)
    assert examples["expressStanding"][0]["standing"] == ["reserve-inventory"]
    # ... and both branches' effects standing on a cancelled order
    kept = _without(_without(ledger, "x5", "release"), "x5", "refund")
    _, summary, examples = evaluate(recs, views, kept, now=NOW, sweep_seconds=3)
    assert summary["express"]["bothBranchesStanding"] == 1
    assert examples["expressStanding"][0]["standing"] == ["reserve-inventory", "charge-payment"]
    # the charge of a refused express order never stands (it was never applied; had it been, refunded)
    charged = _numbered(ledger + [_xfx("x3", "charge")])
    assert "expressFailedOrdersWithBranchEffectsStanding" in _failing(recs, views, charged)


def test_checks_catch_a_stopped_branch_not_compensated_by_its_key() -> None:
    """x3's reservation was stopped when the charge was refused: compensated by its key, a
    tombstone (never applied), so that a late reservation is refused."""
    recs, views, ledger = _express()
    no_tombstone = _without(ledger, "x3", "release")
    assert _failing(recs, views, no_tombstone) == {"expressBranchesNotCompensatedByKey"}
    # ... nor compensated at all, as its view shows
    views["x3"][1]["steps"][0]["compensation"] = None
    assert _failing(recs, views, no_tombstone) == {"expressBranchesNotCompensatedByKey"}
    # a terminate stops a branch too: x4's reservation
    recs, views, ledger = _express()
    assert _failing(recs, views, _without(ledger, "x4", "release")) == {"expressBranchesNotCompensatedByKey"}
    # the stopped reservation was applied after all: released, not tombstoned
    recs, views, ledger = _express()
    applied = _numbered(_without(ledger, "x3", "release") + [_xfx("x3", "reserve"), _xfx("x3", "release")])
    assert _failing(recs, views, applied) == set()
    tombstoned = _numbered(_without(ledger, "x3", "release") + [_xfx("x3", "reserve"),
                                                                 _xfx("x3", "release", kind="tombstone")])
    assert _failing(recs, views, tombstoned) == {"expressFailedOrdersWithBranchEffectsStanding",
                                                 "expressBranchesNotCompensatedByKey",
                                                 "failedOrdersFullyCompensatedPercent"}


def test_every_generation_of_a_refused_express_order_is_undone_by_key() -> None:
    """A designed rejection restarted: each generation's other branch compensated once by key."""
    recs, views, ledger = _express()
    rec = recs[3]  # x2, restarted once: generation 0 was refused too
    rec.restarts_planned = rec.restarts_tried = rec.restarts_done = 1
    rec.operator_actions = [{"action": "retry", "status": 202, "result": "restarted", "expected": "restarted",
                             "answersLost": 0}]
    views["x2"][1]["generation"] = 1
    ledger = [e for e in ledger if e["orderId"] != "x2"]
    gen0 = [_xfx("x2", "release", kind="tombstone")]  # generation 0: the reservation stopped, never applied
    gen1 = [_xfx("x2", "reserve", generation=1), _xfx("x2", "release", generation=1)]
    assert _failing(recs, views, _numbered(ledger + gen0 + gen1)) == set()
    _, summary, _ = evaluate(recs, views, _numbered(ledger + gen0 + gen1), now=NOW, sweep_seconds=3)
    assert summary["express"]["rejections"]["charge-payment"]["generations"] == 3
    # generation 0's reservation stopped, and nobody tombstoned its key
    assert _failing(recs, views, _numbered(ledger + gen1)) == {"expressBranchesNotCompensatedByKey"}


def test_an_order_posted_as_express_runs_express() -> None:
    recs, views, ledger = _express()
    views["x1"][1]["workflow"] = {"name": "order", "version": 1}
    ledger = _numbered(_without(ledger, "x1", "ship") + [
        {"service": "shipping", "operation": "ship", "orderId": "x1", "kind": "effect",
         "idempotencyKey": "x1:create-shipment"}])
    assert "expressOrdersNotRunAsExpress" in _failing(recs, views, ledger)


def test_the_express_held_terminate_is_cancelled_as_planned() -> None:
    recs, views, ledger = _express()
    recs[6].cancel_status = None  # x5: held by the terminate, and nobody cancelled it
    assert "ordersTerminatedWithoutAnOperator" in _failing(recs, views, ledger)
    recs[6].cancel_status, recs[6].terminate_result = 202, "terminating"  # cancelled, but never held
    assert "terminatedOrdersNotEndedAsTerminated" in _failing(recs, views, ledger)
    recs, views, ledger = _express()
    recs[6].operator_actions = [{"action": "cancel", "status": 409, "result": None,
                                 "expected": ["cancelling", "cancelled"], "answersLost": 0}]
    assert _failing(recs, views, ledger) == {"operatorRetriesRefused"}


def test_the_summary_prints_the_express_figures() -> None:
    recs, views, ledger = _express()
    checks, summary, examples = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    report = {"ok": True, "seed": 1, "replay": "x", "checks": checks, "examples": examples,
              "orders": {"planned": 7, **{k: v for k, v in summary.items() if k not in ("approvals", "express")}},
              "express": summary["express"], "approvals": summary["approvals"],
              "faults": {"hostInstanceKills": 0, "serviceBusEmulatorRestarts": 0, "azuriteRestarts": 0,
                         "shippingOutageWindows": 0, "duplicateSubmissions": 0, "duplicateDeliveries": 0,
                         "duplicateRequestDeliveries": 0, "duplicateReplyDeliveries": 0, "remoteCalls": {},
                         "remote503": {}, "permanentRejections": {"ordersDesigned": 0, "reserve422": 0,
                                                                  "charge422": 0}}}
    printed = render_summary(report)
    assert "express: 5 orders" in printed and "reverse order of completion passed 1" in printed
    assert "[ok ] expressCompensationsOutOfOrder: 0" in printed


# ---- the plan --------------------------------------------------------------------------------------


def test_the_express_share_of_the_plan() -> None:
    plan = plan_workflows(200, 0.3, seed=5, express_share=0.15)
    assert plan.count("express") == 30 and plan.count("digital") == 60 and plan.count("order") == 110
    # the digital orders do not move with the express share; with none, the plan is as before
    digital = [i for i, w in enumerate(plan) if w == "digital"]
    assert digital == [i for i, w in enumerate(plan_workflows(200, 0.3, seed=5)) if w == "digital"]
    assert plan_workflows(200, 0.3, seed=5, express_share=0.0) == plan_workflows(200, 0.3, seed=5)
    assert plan == plan_workflows(200, 0.3, seed=5, express_share=0.15)
    assert plan_workflows(10, 0.5, seed=5, express_share=0.5).count("order") == 0


def test_express_orders_name_their_workflow_and_meet_each_designed_path() -> None:
    run = _planned()
    express = [r for r in run.recs if r.workflow == "express"]
    assert len(express) == 30 and all(r.body["workflow"] == "express" for r in express)
    # each kind of designed rejection falls on an express order
    assert {r.reject for r in express} >= {"amount", "sku"}
    for r in express:
        if r.reject == "amount":
            assert any(i["unitPrice"] == 60000 for i in r.body["items"])
    # the operator restarts them, as any designed rejection
    assert all(r.restarts_planned >= 1 for r in express if r.reject)
    group = [r for r in express if r.express_plan == "groupTerminate"]
    pivot = [r for r in express if r.express_plan == "pivotCancel"]
    assert len(group) == len(pivot) == 2  # max(1, round(30 * 5%))
    for r in group:
        lo, hi = GROUP_TERMINATE_AFTER
        assert lo <= (r.terminate_after or 0) <= hi and r.dup_delivery
        assert r.express_hold_sku in run.express.held_skus("groupTerminate")
        assert {"sku": r.express_hold_sku, "quantity": 1, "unitPrice": 1} in r.body["items"]
    outage = dict((kind, at) for at, kind in run.plan_events() if kind.startswith("outage"))
    for r in pivot:
        assert r.dup_delivery and r.express_hold_sku in run.express.held_skus("pivotCancel")
        due = r.index / run.o.rate
        assert not outage["outage-start"] - 3 <= due <= outage["outage-end"] + 2, (due, outage)
    for r in group + pivot:  # nothing else planned for them
        assert r.reject is None and r.fix is None and r.approval is None
    assert not any(r.approval for r in express)  # express waits for nothing


def test_the_remotes_hang_on_the_express_holds() -> None:
    run = _planned()
    calls: dict[str, dict[str, Any]] = {}
    run.stack = SimpleNamespace(remotes=SimpleNamespace(set_faults=lambda svc, **kw: calls.__setitem__(svc, kw)))
    run.apply_remote_faults()
    assert set(run.express.held_skus("groupTerminate")) <= set(calls["inventory"]["hangSkus"])
    assert calls["shipping"]["hangSkus"] == run.express.held_skus("pivotCancel")
    run.remote_faults_off()  # the holds are no chaos faults: they stay
    assert calls["shipping"]["hangSkus"] == run.express.held_skus("pivotCancel")
    sku = run.express.held_skus("groupTerminate")[0]
    run.remove_remote_cause("hold", sku)  # the operator's terminate lifts it
    assert sku not in calls["inventory"]["hangSkus"]


def test_express_rejections_of_each_kind() -> None:
    assert express_rejections([(1, None), (2, None), (3, None)], 0.02, seed=1).keys() <= {1, 2, 3}
    assert sorted(express_rejections([(1, None), (2, None), (3, None)], 0.02, seed=1).values()) == ["amount", "sku"]
    assert express_rejections([(1, "sku"), (2, None), (3, "amount")], 0.02, seed=1) == {}
    assert express_rejections([(1, None), (2, None)], 0.0, seed=1) == {}


def test_the_option_on_the_command_line_and_in_the_replay() -> None:
    assert "--express-share" not in replay_command(ChaosOptions(orders=10, seed=1).resolved())
    assert "--express-share 0.3" in replay_command(ChaosOptions(orders=10, seed=1, express_share=0.3).resolved())
    for bad in ({"express_share": 1.5}, {"express_share": 0.6, "digital_share": 0.6}):
        try:
            ChaosOptions(**bad).resolved()  # type: ignore[arg-type]
        except ValueError as e:
            assert "--express-share" in str(e)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_the_ledger_reads_express_keys() -> None:
    effects = view_effects({"workflow": EXPRESS})
    assert effects == {"reserve-inventory": ("inventory", "reserve", "release"),
                       "charge-payment": ("payment", "charge", "refund"),
                       "create-shipment": ("shipping", "ship", None)}
    info = parse_key("x1", "x1:g1:charge-payment:compensate", effects)
    assert info is not None and (info.generation, info.step, info.compensation) == (1, "charge-payment", True)
    assert parse_key("x1", "x1:prepare", effects) is None  # the group has no key of its own


# ---- the operator and the duplicates -----------------------------------------------------------------


def _running_group(charge: str = "Done") -> dict[str, Any]:
    due = (datetime.now(UTC) + timedelta(hours=1)).isoformat()  # (inject_duplicates reads the clock)
    view = _xview("x9", "Processing", None, {**_branch("reserve-inventory", "Running"),
                                             "completeBy": due, "attempt": 1},
                  {**_branch("charge-payment", charge, 1), "attempt": 1, "result": {"paymentId": "p-1"}})
    view["currentStep"] = "prepare"
    return view


def test_the_operator_sees_an_express_charge_and_shipment() -> None:
    view = _running_group(charge="Running")
    assert charging(view) and not at_pivot(view)  # a stall's charge is a branch: terminated in the group
    assert not charging(_running_group(charge="Done"))
    shipping = _xview("x9", "Processing", None, _branch("reserve-inventory", "Done", 1),
                      _branch("charge-payment", "Done", 2), ship="Running")
    shipping["currentStep"] = "create-shipment"
    assert at_pivot(shipping) and not charging(shipping)
    assert not at_pivot({**shipping, "processState": "Error"})
    assert charging({"processState": "Processing", "currentStep": "charge-payment", "steps": []})  # order workflow


def test_the_operator_terminates_at_the_pivot_then_cancels() -> None:
    run = _planned()
    rec = next(r for r in run.recs if r.express_plan == "pivotCancel")
    rec.order_id = "x9"
    shipping = _xview("x9", "Processing", None, _branch("reserve-inventory", "Done", 1),
                      _branch("charge-payment", "Done", 2), ship="Running")
    rec.view = {**shipping, "currentStep": "create-shipment"}
    assert run.operator.due(rec, 0.0) == "terminate" and run.operator.pending(rec)
    rec.terminate_status, rec.terminate_result = 202, "held"
    rec.view = _xview("x9", "Error", "held", _branch("reserve-inventory", "Done", 1),
                      _branch("charge-payment", "Done", 2), ship="Failed")
    assert run.operator.due(rec, 0.0) == "cancel"
    rec.cancel_status = 202
    assert run.operator.due(rec, 0.0) is None


def test_duplicates_of_a_branch_request_and_of_its_reply_while_the_group_runs() -> None:
    run = ChaosRun(ChaosOptions(orders=1, seed=1, out=None))
    sent: list[tuple[str, dict[str, Any]]] = []

    def send(queue: str, body: dict[str, Any], **kw: Any) -> bool:
        sent.append((queue, body))
        return True

    run.stack = SimpleNamespace(settings=_AnyKey())  # type: ignore[assignment]  # every queue setting: its name
    run._sb_send = send  # type: ignore[method-assign]
    rec = _xrec(1, "x9", dup_delivery=True)
    run.inject_duplicates(rec, _running_group())
    assert rec.request_copy_step == "reserve-inventory" and rec.reply_copy_step == "charge-payment"
    assert rec.reply_copy_in_group
    request, reply = (body for _, body in sent)
    assert request["idempotencyKey"] == "x9:reserve-inventory" and request["workflow"] == "express"
    assert reply["step"] == "charge-payment" and reply["outcome"] == "success"


class _AnyKey(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return key
