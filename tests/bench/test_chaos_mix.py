"""The chaos run mixes the two workflows (``--digital-share``): the plan, the ledger read per
order against its own workflow's steps, and the checks on made-up outcomes of digital orders
(reserve-licence, charge, deliver) beside order ones. No stack is started."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.chaos import (
    DIGITAL_WORKFLOW,
    SERVICES,
    ChaosRun,
    evaluate,
    main,
    plan_workflows,
    replay_command,
    view_workflow,
)
from bench.chaos_ledger import STEP_EFFECTS, effects_for, parse_key, split_ledger, step_key, view_effects
from bench.chaos_records import ChaosOptions, OrderRec
from tests.e2e.test_chaos import NOW, _good, _rec, _view

DIGITAL = {"name": "digital", "version": 1}


def _digital_view(oid: str, state: str, comp: str = "none", outcome: str | None = None) -> dict[str, Any]:
    return {**_view(oid, state, comp, outcome=outcome), "workflow": DIGITAL}


def _dfx(oid: str, service: str, operation: str, kind: str = "effect", generation: int = 0) -> dict[str, Any]:
    """A ledger entry of a digital order, keyed as the app keys it."""
    steps = effects_for("digital", 1)
    name = next(n for n, (_, fwd, comp) in steps.items() if operation in (fwd, comp))
    key = step_key(oid, name, generation)
    entry = {"service": service, "operation": operation, "orderId": oid, "kind": kind, "idempotencyKey": key}
    if operation != steps[name][1]:
        entry["idempotencyKey"], entry["compensates"] = f"{key}:compensate", key
    return entry


def _mixed() -> tuple[list[OrderRec], dict[str, Any], list[dict[str, Any]]]:
    """o1/o2 as in the order-workflow tests; d1 a digital order delivered, d2 one whose charge
    was refused (its licence released)."""
    recs, views, ledger = _good()
    recs += [_rec(3, "d1"), _rec(4, "d2")]
    for rec in recs[2:]:
        rec.workflow = DIGITAL_WORKFLOW
    views["d1"] = (200, _digital_view("d1", "Processed"))
    views["d2"] = (200, _digital_view("d2", "Error", "completed"))
    ledger += [_dfx("d1", "inventory", "reserve-licence"), _dfx("d1", "payment", "charge"),
               _dfx("d1", "delivery", "deliver"),
               _dfx("d2", "inventory", "reserve-licence"), _dfx("d2", "inventory", "release-licence")]
    return recs, views, ledger


def _failing(recs: list[OrderRec], views: dict[str, Any], ledger: list[dict[str, Any]], **kw: Any) -> set[str]:
    checks, _, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3, **kw)
    return {k for k, v in checks.items() if not v["ok"]}


# ---- the plan ----------------------------------------------------------------------------------


def test_the_digital_share_of_the_plan() -> None:
    plan = plan_workflows(200, 0.3, seed=5)
    assert plan.count("digital") == 60 and plan.count("order") == 140
    assert plan == plan_workflows(200, 0.3, seed=5)  # replayable from the seed
    assert plan != plan_workflows(200, 0.3, seed=6)
    assert plan_workflows(50, 0.0, seed=5) == ["order"] * 50
    assert plan_workflows(50, 1.0, seed=5) == ["digital"] * 50


def test_digital_orders_name_their_workflow_in_the_post() -> None:
    from bench.chaos import ChaosRun

    run = ChaosRun(ChaosOptions(orders=40, seed=3, digital_share=0.25, express_share=0.0, out=None).resolved())
    run.plan_orders()
    digital = [r for r in run.recs if r.workflow == "digital"]
    assert len(digital) == 10
    assert all(r.body["workflow"] == "digital" for r in digital)
    assert all("workflow" not in r.body for r in run.recs if r.workflow == "order")  # the default, unnamed
    # The rest of the seed's plan is the same whatever the share (a replay keeps its orders).
    same = ChaosRun(ChaosOptions(orders=40, seed=3, express_share=0.0, out=None).resolved())
    same.plan_orders()
    assert [{k: v for k, v in r.body.items() if k != "workflow"} for r in run.recs] == [r.body for r in same.recs]


def test_the_option_on_the_command_line_and_in_the_replay() -> None:
    opts = ChaosOptions(orders=10, seed=1, digital_share=0.3).resolved()
    assert "--digital-share 0.3" in replay_command(opts)
    assert "--digital-share" not in replay_command(ChaosOptions(orders=10, seed=1).resolved())
    try:
        ChaosOptions(digital_share=1.5).resolved()
    except ValueError as e:
        assert "--digital-share" in str(e)
    else:
        raise AssertionError("a share over 1 was accepted")
    assert callable(main)


def test_every_agents_service_gets_the_chaos_faults() -> None:
    assert set(SERVICES) == {"inventory", "payment", "shipping", "delivery"}


# ---- the ledger, per workflow ---------------------------------------------------------------------


def test_each_order_is_read_against_its_own_workflow() -> None:
    assert view_effects(None) == STEP_EFFECTS == effects_for("order", 1)
    assert view_effects({"workflow": DIGITAL}) == {
        "reserve-licence": ("inventory", "reserve-licence", "release-licence"),
        "charge-payment": ("payment", "charge", "refund"),
        "deliver": ("delivery", "deliver", None)}
    assert view_workflow({"workflow": DIGITAL}).label == "digital v1"
    assert view_workflow({}).label == "order v1"
    # A digital step's key is no key of an order-workflow order, and the other way round.
    assert parse_key("d1", "d1:deliver", view_effects({"workflow": DIGITAL})) is not None
    assert parse_key("d1", "d1:deliver") is None
    assert parse_key("o1", "o1:create-shipment", view_effects({"workflow": DIGITAL})) is None
    _, unexpected = split_ledger([_dfx("d1", "delivery", "deliver")])  # read as order v1: unexpected
    assert [u["problem"] for u in unexpected] == [
        "not a key of its order (orderId[:g<n>]:step[:compensate] of its workflow)"]
    _, unexpected = split_ledger([_dfx("d1", "delivery", "deliver")], {"d1": view_effects({"workflow": DIGITAL})})
    assert unexpected == []


def test_a_mixed_run_passes_every_check() -> None:
    recs, views, ledger = _mixed()
    checks, summary, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    assert all(v["ok"] for v in checks.values()), {k: v for k, v in checks.items() if not v["ok"]}
    assert summary["workflows"] == {"order": 2, "digital": 2}
    assert summary["failedWithEffectsToCompensate"] == 2
    assert summary["compensationsNeeded"] == summary["compensationsApplied"] == 3  # refund+release, release-licence


def test_double_effects_per_operation_of_the_digital_workflow() -> None:
    for service, operation in (("inventory", "reserve-licence"), ("payment", "charge"), ("delivery", "deliver")):
        recs, views, ledger = _mixed()
        ledger.append(_dfx("d1", service, operation))  # the same key applied twice
        assert _failing(recs, views, ledger) == {"doubleEffects", "processedOrdersWithWrongEffects"}, operation
    recs, views, ledger = _mixed()
    ledger.append(_dfx("d2", "inventory", "release-licence"))  # a licence released twice
    assert _failing(recs, views, ledger) == {"doubleEffects", "failedOrdersFullyCompensatedPercent",
                                             "compensationsAppliedMoreThanOnce"}


def test_a_digital_order_missing_its_licence_release_or_its_delivery() -> None:
    recs, views, ledger = _mixed()
    kept = [e for e in ledger if e["operation"] != "release-licence"]
    assert _failing(recs, views, kept) == {"failedOrdersFullyCompensatedPercent"}
    undelivered = [e for e in ledger if e["operation"] != "deliver"]
    assert _failing(recs, views, undelivered) == {"processedOrdersWithWrongEffects"}
    # A processed digital order that shipped (an order-workflow effect) is wrong, and its key unexpected.
    recs, views, ledger = _mixed()
    ledger.append({"service": "shipping", "operation": "ship", "orderId": "d1", "kind": "effect",
                   "idempotencyKey": "d1:create-shipment"})
    assert _failing(recs, views, ledger) == {"processedOrdersWithWrongEffects", "effectsWithUnexpectedKeys"}


def test_a_failed_digital_order_that_delivered_is_caught() -> None:
    """The delivery is the digital workflow's pivot: a failed order must never have delivered."""
    recs, views, ledger = _mixed()
    ledger.append(_dfx("d2", "delivery", "deliver"))
    assert _failing(recs, views, ledger) == {"failedOrdersThatShipped"}


def test_a_digital_order_held_at_its_delivery() -> None:
    """An unknown delivery outcome: held for an operator (onFailure hold), nothing compensated."""
    recs, views, ledger = _mixed()
    recs.append(_rec(5, "d3"))
    recs[-1].workflow = DIGITAL_WORKFLOW
    views["d3"] = (200, _digital_view("d3", "Error", outcome="held"))
    ledger += [_dfx("d3", "inventory", "reserve-licence"), _dfx("d3", "payment", "charge")]
    assert _failing(recs, views, ledger) == {"ordersLeftHeldForAnOperator"}
    assert _failing(recs, views, ledger, held_allowed=True) == set()
    views["d3"] = (200, _digital_view("d3", "Processed"))  # the operator's retry delivered it
    ledger.append(_dfx("d3", "delivery", "deliver"))
    assert _failing(recs, views, ledger) == set()


def test_a_restarted_digital_order_is_undone_generation_by_generation() -> None:
    recs, views, ledger = _mixed()
    rec = _rec(5, "d4")
    rec.workflow = DIGITAL_WORKFLOW
    rec.restarts_planned = rec.restarts_tried = rec.restarts_done = 1
    rec.operator_actions = [{"action": "retry", "status": 202, "result": "restarted", "expected": "restarted",
                             "answersLost": 0}]
    recs.append(rec)
    views["d4"] = (200, {**_digital_view("d4", "Processed"), "generation": 1})
    ledger += [_dfx("d4", "inventory", "reserve-licence"), _dfx("d4", "inventory", "release-licence"),
               _dfx("d4", "payment", "refund", kind="tombstone"),
               _dfx("d4", "inventory", "reserve-licence", generation=1), _dfx("d4", "payment", "charge", generation=1),
               _dfx("d4", "delivery", "deliver", generation=1)]
    assert _failing(recs, views, ledger) == set()
    kept = [e for e in ledger if not (e["orderId"] == "d4" and e["operation"] == "release-licence")]
    assert _failing(recs, views, kept) == {"failedOrdersFullyCompensatedPercent"}


class _Answers:
    """A session that answers each POST with the next (status, body), and records the calls."""

    def __init__(self, *answers: tuple[int, dict[str, Any]]) -> None:
        self.answers, self.calls = list(answers), 0

    def post(self, url: str, **kw: Any) -> Any:
        self.calls += 1
        status, body = self.answers.pop(0)
        return SimpleNamespace(status_code=status, json=lambda: body, text=str(body))


def _submitting(session: _Answers) -> tuple[ChaosRun, OrderRec]:
    run = ChaosRun(ChaosOptions(orders=1, seed=1, out=None))
    run.o.post_retry_seconds = 5
    run.stack = SimpleNamespace(api_url="http://api")  # type: ignore[assignment]
    run.session = lambda level="function": session  # type: ignore[method-assign,assignment,misc]
    return run, _rec(0, "")


def test_a_submission_is_posted_again_through_a_restart_until_it_is_answered() -> None:
    session = _Answers((503, {}), (202, {"orderId": "o-1"}))
    run, rec = _submitting(session)
    assert run._post(rec) == (202, "o-1", None) and session.calls == 2


def test_a_submission_answered_409_is_not_posted_again() -> None:
    """The key reused with another body: a rejection the checks count, not a pause to wait out
    (an operator's action asks a 409 "conflict" again; a submission does not)."""
    reuse = {"type": "https://errors/idempotency-key-reuse", "detail": "Idempotency-Key reused"}
    session = _Answers((409, reuse), (202, {"orderId": "o-1"}))
    run, rec = _submitting(session)
    status, order_id, error = run._post(rec)
    assert (status, order_id, session.calls) == (409, None, 1) and "idempotency-key-reuse" in str(error)
