"""The chaos runner (bench/chaos.py): a CI-sized run through the whole local stack with every
fault kind injected at least once, an operator terminating, restarting and redriving orders
meanwhile (bench/chaos_operator.py), and the runner's checks themselves on made-up outcomes.

The run asserts correctness only (terminal, lost, stuck, double effects, compensations), never
speed. Replay a failure with the seed it prints: ``python -m bench.chaos --seed S --orders 200 ...``
(the report's ``replay`` field has the whole command line).
"""

from __future__ import annotations

import io
import math
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.chaos import ChaosOptions, OrderRec, evaluate, run_chaos
from bench.chaos_ledger import STEP_EFFECTS, parse_key, step_key

CI_SEED = int(os.environ.get("CHAOS_SEED", "20261122"))


def _print_evidence(printed: str, state_dir: Path, lines: int = 150) -> None:
    """What a failed or timed-out run leaves to read: its own progress lines and the tail of every
    log of its stack. pytest shows them with the failure, so they outlive the run's temporary
    folder (pytest keeps only its last few, and CI's clone is thrown away)."""
    print("---- chaos run output ----")
    print(printed)
    for log in sorted(state_dir.glob("**/*.log")):
        try:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        except OSError as exc:
            tail = [f"(unreadable: {exc})"]
        print(f"---- last {len(tail)} lines of {log.relative_to(state_dir)} ----")
        print("\n".join(tail))


def _failed(report: dict[str, Any]) -> str:
    bad = {k: v for k, v in report["checks"].items() if not v["ok"]}
    examples = {k: v for k, v in report["examples"].items() if v}
    return (f"seed {report['seed']} (replay: {report['replay']}); failed checks {bad}; examples {examples}; "
            f"infrastructure errors {report['infrastructureErrors']}; logs in {report['stateDir']}")


@pytest.mark.integration
@pytest.mark.slow
def test_ci_sized_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    opts = ChaosOptions(
        orders=200, seed=CI_SEED, instances=2, rate=8.0, out=tmp_path / "chaos.json",
        state_dir=tmp_path / "stack", step_timeout=4, supervisor_schedule="*/1 * * * * *",
        kills=2, duplicate_submit_rate=0.08, duplicate_delivery_rate=0.08,
        transient_rate=0.2, lost_response_rate=0.05, hang_rate=0.05, reject_rate=0.02,
        outage_seconds=12.0, settle_timeout=30.0, drain_timeout=120.0,
        terminate_rate=0.05, terminate_within=4.0, operator_restarts=True, fixable_rate=0.015,
        digital_share=0.3,  # both workflows (issue 13), each order checked against its own steps
    )
    out = io.StringIO()
    try:
        report = run_chaos(opts, out=out)
    except BaseException:  # pytest-timeout's signal raises here too
        _print_evidence(out.getvalue(), tmp_path / "stack")
        raise
    printed = out.getvalue()
    if not report["ok"]:
        _print_evidence(printed, tmp_path / "stack")

    # The seed is printed first, the figures last; the JSON report is written.
    assert printed.splitlines()[0].startswith(f"chaos run: seed {CI_SEED} ")
    assert "RESULT: " in printed and (tmp_path / "chaos.json").exists()

    checks = report["checks"]
    assert report["ok"], _failed(report)
    assert checks["terminalPercent"]["value"] == 100.0
    assert checks["lostOrders"]["value"] == 0 and checks["stuckOrders"]["value"] == 0
    assert checks["doubleEffects"]["value"] == 0
    assert checks["failedOrdersFullyCompensatedPercent"]["value"] == 100.0
    assert checks["compensationsAppliedMoreThanOnce"]["value"] == 0
    assert report["orders"]["accepted"] == 200
    assert report["orders"]["workflows"] == {"order": 140, "digital": 60}, report["orders"]

    # The shipping outage (issue 14): its breaker opened, steps waited instead of failing, and
    # after the first cool-down the dead service got probes only (the calls in flight when it
    # opened are the excess over threshold + one probe per cool-down).
    outage = report["outage"]
    calls, incs = outage["deadRemoteCalls"], outage["failureCountIncrements"]
    assert outage["breakerAlerts"]["openedDuringOutage"] >= 1, outage["breakerAlerts"]
    assert incs["attributable"] == incs["alsoProcessFault"], incs  # none from the outage alone
    assert outage["heldForOperator"]["attributable"] == 0, outage["heldForOperator"]
    assert outage["drain"]["notEnded"] == 0, outage["drain"]
    probes = [t for t in calls["offsetsAfterFirstThreshold"] if t > calls["openedAfterSeconds"] + 1.0]
    assert len(probes) <= math.ceil(calls["outageSeconds"] / calls["coolDownSeconds"]) + 1, calls
    # A wait is one state (issue 28): a waiting order writes one wait per opening of the breaker
    # (a redrive that a killed instance caused may start one more), not one per probe cycle.
    waited = outage["historyWhileWaiting"]
    assert waited["orders"] >= 1, waited
    assert waited["waitsMax"] <= outage["breakerAlerts"]["openedDuringOutage"] + 1, waited

    # Every fault kind was really injected, so the checks above were exercised.
    f = report["faults"]
    assert f["hostInstanceKills"] >= 1, f
    assert f["serviceBusEmulatorRestarts"] == 1 and f["azuriteRestarts"] == 1, f
    assert f["duplicateSubmissions"] >= 1, f
    assert f["duplicateRequestDeliveries"] >= 1 and f["duplicateReplyDeliveries"] >= 1, f
    assert f["shippingOutageWindows"] == 1, f
    injected = {k: sum(svc.get(k, 0) for svc in f["remoteInjected"].values() if isinstance(svc, dict))
                for k in ("transient", "hang")}
    assert injected["transient"] >= 1 and injected["hang"] >= 1, f["remoteInjected"]
    assert sum(f["remote503"].values()) >= 1, f
    assert f["permanentRejections"]["reserve422"] >= 1 and f["permanentRejections"]["charge422"] >= 1, f
    # ... and failures did leave effects to compensate (a charge rejection leaves a reservation).
    assert report["orders"]["failedWithEffectsToCompensate"] >= 1, report["orders"]
    assert report["orders"]["compensationsApplied"] == report["orders"]["compensationsNeeded"] >= 1

    # The operator was at work (issue 11), and every kind of action did what it says.
    op = report["orders"]["operator"]
    assert op["terminatesSent"] == 11, op  # 5% of the orders and the stalled one, each answered
    assert op["terminated"] + op["terminateHeld"] >= 2, op  # some were still in flight (the stall is)
    assert op["restarted"] >= 1 and op["restartedOrders"] >= 1, op
    assert op["restartedThenProcessed"] >= 2, op  # fixed causes (restock, limit): generation 1 went through
    assert op["earlierGenerationsWithEffectsUndone"] >= 1, op  # ... after generation 0 was undone
    assert op["compensationsRedriven"] >= 1 and op["causesFixed"] == 3, op  # the stalled refund, redriven
    for name in ("effectsWithUnexpectedKeys", "generationsNotFromAnOperatorRestart",
                 "terminatedOrdersNotEndedAsTerminated", "ordersTerminatedWithoutAnOperator",
                 "terminatesRefusedInFlight", "operatorRetriesRefused", "ordersSearchListsWrongly"):
        assert checks[name]["value"] == 0, (name, checks[name])


# ---- the checks themselves -----------------------------------------------------------------------

NOW = datetime(2026, 11, 22, 8, 0, tzinfo=UTC)


def _rec(i: int, oid: str) -> OrderRec:
    return OrderRec(index=i, key=f"k-{i}", body={}, reject=None, dup_submit=False, dup_delivery=False,
                    order_id=oid, post_status=202)


def _view(oid: str, state: str, comp: str = "none", complete_by: datetime | None = None,
          outcome: str | None = None) -> dict[str, Any]:
    return {"orderId": oid, "processState": state, "compensation": {"state": comp, "pending": 0},
            "completeBy": complete_by.isoformat() if complete_by else None, "steps": [], "outcome": outcome}


_STEP_OF = {op: name for name, (_, fwd, comp) in STEP_EFFECTS.items() for op in (fwd, comp) if op}


def _fx(oid: str, service: str, operation: str, key: str | None = None, kind: str = "effect",
        generation: int = 0) -> dict[str, Any]:
    """A ledger entry as the simulator writes it: the key is the one the app sends, a step's
    ``{orderId}[:g{n}]:{step}``, its compensation's that plus ``:compensate`` (naming the
    step's key in ``compensates``)."""
    name = _STEP_OF[operation]
    step = step_key(oid, name, generation)
    entry = {"service": service, "operation": operation, "orderId": oid, "kind": kind,
             "idempotencyKey": key or step}
    if operation != STEP_EFFECTS[name][1]:
        entry["idempotencyKey"], entry["compensates"] = key or f"{step}:compensate", step
    return entry


def _good() -> tuple[list[OrderRec], dict[str, Any], list[dict[str, Any]]]:
    """o1 processed; o2 failed at shipping, payment refunded and reservation released."""
    recs = [_rec(1, "o1"), _rec(2, "o2")]
    views = {"o1": (200, _view("o1", "Processed")), "o2": (200, _view("o2", "Error", "completed"))}
    ledger = [_fx("o1", "inventory", "reserve"), _fx("o1", "payment", "charge"), _fx("o1", "shipping", "ship"),
              _fx("o2", "inventory", "reserve"), _fx("o2", "payment", "charge"),
              _fx("o2", "payment", "refund"), _fx("o2", "inventory", "release")]
    return recs, views, ledger


def _failing(recs: list[OrderRec], views: dict[str, Any], ledger: list[dict[str, Any]]) -> set[str]:
    checks, _, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    return {k for k, v in checks.items() if not v["ok"]}


def test_checks_pass_on_a_clean_outcome() -> None:
    recs, views, ledger = _good()
    checks, summary, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    assert all(v["ok"] for v in checks.values()), checks
    assert summary["failedWithEffectsToCompensate"] == 1
    assert summary["compensationsNeeded"] == summary["compensationsApplied"] == 2


def test_checks_catch_a_double_effect() -> None:
    recs, views, ledger = _good()
    ledger.append(_fx("o1", "payment", "charge"))  # the same key applied twice
    assert _failing(recs, views, ledger) == {"doubleEffects", "processedOrdersWithWrongEffects"}


def test_checks_catch_a_missing_and_a_repeated_compensation() -> None:
    recs, views, ledger = _good()
    missing = [e for e in ledger if e["operation"] != "refund"]
    assert _failing(recs, views, missing) == {"failedOrdersFullyCompensatedPercent"}
    twice = ledger + [_fx("o2", "payment", "refund", key="o2:refund-again")]
    # (a key that is no key of the app's is caught on its own too)
    assert _failing(recs, views, twice) == {"failedOrdersFullyCompensatedPercent",
                                            "compensationsAppliedMoreThanOnce", "effectsWithUnexpectedKeys"}


def test_a_compensation_of_nothing_is_no_effect() -> None:
    """A step that timed out without its effect: its compensation tombstones the key."""
    recs, views, ledger = _good()
    recs.append(_rec(3, "o3"))
    views["o3"] = (200, _view("o3", "Error", "completed"))
    ledger += [_fx("o3", "inventory", "reserve"), _fx("o3", "payment", "refund", kind="tombstone"),
               _fx("o3", "inventory", "release")]
    checks, summary, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    assert all(v["ok"] for v in checks.values()), checks
    assert summary["compensationsOfNothing"] == 1 and summary["compensationsApplied"] == 3
    # ... but a tombstone where the effect did happen is no compensation
    ledger = [e for e in ledger if not (e["orderId"] == "o3" and e["operation"] == "release")]
    ledger.append(_fx("o3", "inventory", "release", kind="tombstone"))
    assert _failing(recs, views, ledger) == {"failedOrdersFullyCompensatedPercent"}
    # ... and a processed order has no compensation of any kind
    ledger.append(_fx("o1", "payment", "refund", kind="tombstone"))
    assert "processedOrdersWithWrongEffects" in _failing(recs, views, ledger)


def test_an_order_held_for_an_operator_is_not_compensated_but_must_not_stay_held() -> None:
    """A shipment of unknown outcome cannot be undone: the app holds the order for an operator."""
    recs, views, ledger = _good()
    recs.append(_rec(3, "o3"))
    views["o3"] = (200, _view("o3", "Error", outcome="held"))
    ledger += [_fx("o3", "inventory", "reserve"), _fx("o3", "payment", "charge"), _fx("o3", "shipping", "ship")]
    assert _failing(recs, views, ledger) == {"ordersLeftHeldForAnOperator"}
    checks, summary, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3, held_allowed=True)
    assert all(v["ok"] for v in checks.values()) and summary["heldForAnOperator"] == 1
    # once the operator's retry learnt that it shipped, it is Processed with each effect once
    views["o3"] = (200, _view("o3", "Processed"))
    assert _failing(recs, views, ledger) == set()


def test_checks_catch_lost_stuck_and_unfinished_orders() -> None:
    recs, views, ledger = _good()
    recs.append(_rec(3, "o3"))
    views["o3"] = (404, None)
    assert _failing(recs, views, ledger) == {"terminalPercent", "lostOrders"}
    views["o3"] = (200, _view("o3", "Processing", complete_by=NOW - timedelta(seconds=10)))
    assert _failing(recs, views, ledger) == {"terminalPercent", "lostOrders", "stuckOrders"}
    views["o3"] = (200, _view("o3", "Processing", complete_by=NOW + timedelta(seconds=10)))
    assert _failing(recs, views, ledger) == {"terminalPercent", "lostOrders"}
    # Error while compensations still run is not terminal yet
    views["o3"] = (200, _view("o3", "Error", "running", complete_by=NOW + timedelta(seconds=10)))
    assert _failing(recs, views, ledger) == {"terminalPercent", "lostOrders"}


def test_checks_catch_a_failed_order_that_shipped_and_unknown_effects() -> None:
    recs, views, ledger = _good()
    ledger.append(_fx("o2", "shipping", "ship"))
    ledger.append(_fx("zz", "inventory", "reserve"))
    assert _failing(recs, views, ledger) == {"failedOrdersThatShipped", "effectsOfUnknownOrders"}


def test_checks_catch_bad_submissions() -> None:
    recs, views, ledger = _good()
    recs[0].dup_submit_done, recs[0].dup_submit_order_id = True, "another"
    recs.append(OrderRec(index=3, key="k-3", body={}, reject=None, dup_submit=False, dup_delivery=False,
                         post_status=400, post_error="400 bad"))
    recs.append(OrderRec(index=4, key="k-4", body={}, reject=None, dup_submit=False, dup_delivery=False))
    assert _failing(recs, views, ledger) == {"duplicateSubmissionsGivingAnotherOrder", "submissionsRejected",
                                             "submissionsNeverAnswered"}


# ---- the operator's actions (issue 11): generations, terminates, retries ----------------------


def _restarted(rec: OrderRec, times: int = 1) -> OrderRec:
    rec.restarts_planned = rec.restarts_tried = rec.restarts_done = times
    rec.operator_actions = [{"action": "retry", "status": 202, "result": "restarted", "expected": "restarted",
                             "answersLost": 0} for _ in range(times)]
    return rec


def _with_generation(view: dict[str, Any], generation: int) -> dict[str, Any]:
    return {**view, "generation": generation}


def test_the_keys_carry_the_generation() -> None:
    assert step_key("o1", "charge-payment", 0) == "o1:charge-payment"
    assert step_key("o1", "charge-payment", 2) == "o1:g2:charge-payment"
    assert parse_key("o1", "o1:g2:charge-payment:compensate") is not None
    info = parse_key("o1", "o1:g2:charge-payment:compensate")
    assert info is not None and (info.generation, info.step, info.compensation) == (2, "charge-payment", True)
    for bad in ("o1:charge", "o2:charge-payment", "o1:g0:charge-payment", "o1:g01:charge-payment",
                "o1:gx:charge-payment", "o1x:charge-payment"):
        assert parse_key("o1", bad) is None, bad


def _restarted_then_processed() -> tuple[list[OrderRec], dict[str, Any], list[dict[str, Any]]]:
    """o3 failed at payment (its reservation released), was restarted, and went through."""
    recs, views, ledger = _good()
    recs.append(_restarted(_rec(3, "o3")))
    views["o3"] = (200, _with_generation(_view("o3", "Processed"), 1))
    ledger += [_fx("o3", "inventory", "reserve"), _fx("o3", "payment", "refund", kind="tombstone"),
               _fx("o3", "inventory", "release"),
               _fx("o3", "inventory", "reserve", generation=1), _fx("o3", "payment", "charge", generation=1),
               _fx("o3", "shipping", "ship", generation=1)]
    return recs, views, ledger


def test_a_restarted_order_applies_each_step_once_per_generation() -> None:
    recs, views, ledger = _restarted_then_processed()
    checks, summary, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    assert all(v["ok"] for v in checks.values()), checks
    op = summary["operator"]
    assert op["restarted"] == op["restartedOrders"] == op["restartedThenProcessed"] == 1
    assert op["earlierGenerationsUndone"] == op["earlierGenerationsWithEffectsUndone"] == 1
    assert summary["failedWithEffectsToCompensate"] == 2 and summary["compensationsApplied"] == 3


def test_checks_catch_an_earlier_generation_left_applied() -> None:
    recs, views, ledger = _restarted_then_processed()
    kept = [e for e in ledger if not (e["orderId"] == "o3" and e["operation"] == "release")]
    assert _failing(recs, views, kept) == {"failedOrdersFullyCompensatedPercent"}
    # ... or one that shipped before the order was restarted
    shipped = ledger + [_fx("o3", "shipping", "ship")]
    assert _failing(recs, views, shipped) == {"failedOrdersThatShipped"}
    # ... and the last generation is judged as any order: each step exactly once
    again = ledger + [_fx("o3", "payment", "charge", generation=1)]
    assert _failing(recs, views, again) == {"processedOrdersWithWrongEffects", "doubleEffects"}


def test_checks_catch_generations_no_operator_asked_for() -> None:
    recs, views, ledger = _restarted_then_processed()
    recs[2].restarts_done = 0  # the app restarted it on its own
    assert _failing(recs, views, ledger) == {"generationsNotFromAnOperatorRestart"}
    recs[2].restarts_unanswered = 1  # ... unless a restart the operator sent lost its answer
    assert _failing(recs, views, ledger) == set()
    recs, views, ledger = _restarted_then_processed()
    ledger.append(_fx("o3", "inventory", "reserve", generation=2))  # a generation the order never reached
    assert "effectsWithUnexpectedKeys" in _failing(recs, views, ledger)


def test_a_restart_that_fails_again_is_undone_again() -> None:
    recs, views, ledger = _good()
    recs.append(_restarted(_rec(3, "o3"), times=2))
    views["o3"] = (200, _with_generation(_view("o3", "Error", "completed", outcome="failed"), 2))
    for g in range(3):  # the charge is refused in every generation: the reservation is released
        ledger += [_fx("o3", "inventory", "reserve", generation=g), _fx("o3", "inventory", "release", generation=g)]
    checks, summary, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    assert all(v["ok"] for v in checks.values()), checks
    assert summary["operator"]["restartedAndFailedAgain"] == 1 and summary["compensationsNeeded"] == 5
    del ledger[-1]  # the last generation's release is missing
    assert _failing(recs, views, ledger) == {"failedOrdersFullyCompensatedPercent"}


def _terminated(rec: OrderRec, result: str = "terminating") -> OrderRec:
    rec.terminate_after, rec.terminate_status, rec.terminate_result = 1.0, 202, result
    return rec


def test_a_terminated_order_ends_terminated_with_its_effects_undone() -> None:
    recs, views, ledger = _good()
    recs.append(_terminated(_rec(3, "o3")))
    views["o3"] = (200, _view("o3", "Error", "completed", outcome="terminated"))
    ledger += [_fx("o3", "inventory", "reserve"), _fx("o3", "inventory", "release"),
               _fx("o3", "payment", "refund", kind="tombstone")]  # the charge in flight, fenced
    checks, summary, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3)
    assert all(v["ok"] for v in checks.values()), checks
    assert summary["operator"]["terminated"] == 1
    # its reservation kept
    kept = [e for e in ledger if e["operation"] != "release" or e["orderId"] != "o3"]
    assert _failing(recs, views, kept) == {"failedOrdersFullyCompensatedPercent"}
    # ... or it went on to the end anyway (a late reply)
    views["o3"] = (200, _view("o3", "Processed", outcome="processed"))
    ledger = [e for e in ledger if e["orderId"] != "o3"] + [
        _fx("o3", "inventory", "reserve"), _fx("o3", "payment", "charge"), _fx("o3", "shipping", "ship")]
    assert _failing(recs, views, ledger) == {"terminatedOrdersNotEndedAsTerminated"}


def test_a_terminate_that_holds_the_order_must_see_it_held_or_retried() -> None:
    recs, views, ledger = _good()
    recs.append(_terminated(_rec(3, "o3"), "held"))
    views["o3"] = (200, _view("o3", "Error", outcome="held"))
    ledger += [_fx("o3", "inventory", "reserve"), _fx("o3", "payment", "charge")]
    assert _failing(recs, views, ledger) == {"ordersLeftHeldForAnOperator"}
    recs[2].held_retry_status = 202  # the operator retried it: the shipment went out
    views["o3"] = (200, _view("o3", "Processed", outcome="processed"))
    ledger.append(_fx("o3", "shipping", "ship"))
    assert _failing(recs, views, ledger) == set()
    recs[2].held_retry_status = None  # Processed, but nobody retried the held order
    assert _failing(recs, views, ledger) == {"terminatedOrdersNotEndedAsTerminated"}


def test_checks_catch_wrong_answers_to_the_operator() -> None:
    recs, views, ledger = _good()
    views["o2"] = (200, _view("o2", "Error", "completed", outcome="terminated"))  # nobody terminated it
    assert _failing(recs, views, ledger) == {"ordersTerminatedWithoutAnOperator"}
    recs, views, ledger = _good()
    recs[0].terminate_after, recs[0].terminate_status, recs[0].terminate_state = 1.0, 409, "Processing"
    assert _failing(recs, views, ledger) == {"terminatesRefusedInFlight"}
    recs[0].terminate_state = "Processed"  # too late: fine
    assert _failing(recs, views, ledger) == set()
    recs[1].operator_actions = [{"action": "retry", "status": 409, "result": None, "expected": "restarted",
                                 "answersLost": 0}]
    assert _failing(recs, views, ledger) == {"operatorRetriesRefused"}
    recs[1].operator_actions[0]["answersLost"] = 1  # an earlier call whose answer was lost did it
    assert _failing(recs, views, ledger) == set()


def test_checks_catch_what_search_shows_the_operator_wrongly() -> None:
    recs, views, ledger = _good()
    views["o1"][1]["category"], views["o2"][1]["category"] = "processed", "attention"
    listing = {"inFlight": [], "attention": ["o2"], "processed": ["o1"], "error": []}
    checks, _, _ = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3, listing=listing)
    assert all(v["ok"] for v in checks.values()), checks
    for wrong in ({**listing, "attention": []},  # a failed order an operator cannot find
                  {**listing, "inFlight": ["o2"]},  # ... or finds twice
                  {**listing, "error": ["o1"], "processed": []}):  # ... or under another state
        checks, _, examples = evaluate(recs, views, ledger, now=NOW, sweep_seconds=3, listing=wrong)
        assert {k for k, v in checks.items() if not v["ok"]} == {"ordersSearchListsWrongly"}, wrong
        assert examples["searchWrong"], wrong
