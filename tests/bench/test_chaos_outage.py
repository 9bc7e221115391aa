"""The chaos run's outage report (bench/chaos_outage.py) on made-up journals and histories: the
calls to the dead remote against the bound, the FailureCount increments and held orders the
outage caused (told apart from other faults by what the simulator saw), the drain once the remote
is back, and the breaker alerts. No stack is started."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.chaos import render_summary
from bench.chaos_outage import (
    BreakerSettings,
    OutageWindow,
    attempts_of,
    breaker_alerts,
    dead_remote_calls,
    drain,
    failure_increments,
    held_for_operator,
    history_while_waiting,
    index_calls,
    key_parts,
    outage_report,
    outage_window,
    render_outage,
)

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
WINDOW = OutageWindow("shipping", T0, T0 + timedelta(seconds=20))
SHIP = "create-shipment"
BREAKER = BreakerSettings(threshold=5, cool_down=5.0)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def ev(seconds: float, kind: str, step: str | None = SHIP, attempt: int | None = 1, **detail: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"at": at(seconds), "event": kind, "step": step, "attempt": attempt}
    if detail:
        e["detail"] = detail
    return e


def call(seconds: float, key: str, fault: str | None, service: str = "shipping") -> dict[str, Any]:
    return {"at": at(seconds), "service": service, "operation": "ship", "idempotencyKey": key, "fault": fault}


def order(oid: str, *events: dict[str, Any], workflow: dict[str, Any] | None = None,
          ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    view: dict[str, Any] = {"orderId": oid}
    if workflow:
        view["workflow"] = workflow
    return view, [ev(-10, "accepted", None, None), *events]


def test_the_window_and_the_bound_come_from_the_simulator_and_the_settings() -> None:
    windows = [{"service": "payment", "from": at(-5), "to": at(-1)},
               {"service": "shipping", "from": at(0), "to": at(20)}]
    assert outage_window(windows, "shipping") == WINDOW
    assert outage_window(windows, "delivery") is None
    still_down = outage_window([{"service": "shipping", "from": at(0), "to": None}], "shipping", now=T0)
    assert still_down is not None and still_down.end == T0
    assert BreakerSettings.from_settings({}) == BreakerSettings(5, 5.0)  # the declared defaults
    chaos = BreakerSettings.from_settings({"BreakerFailureThreshold": "3", "BreakerCoolDownSeconds": "2"})
    assert chaos.bound(20) == 13  # 3, then one probe per 2 s for 20 s
    assert BREAKER.bound(20) == 9 and BREAKER.bound(21) == 10


def test_calls_to_the_dead_remote_are_the_down_calls_inside_the_window() -> None:
    calls = [call(-1, "a:create-shipment", None),  # before: the service was up
             *(call(0.1 * i, f"o{i}:create-shipment", "down") for i in range(7)),  # the burst
             call(5.7, "p1:create-shipment", "down"), call(11.0, "p2:create-shipment", "reset"),  # probes
             call(12.0, "x:create-shipment", "transient"),  # no down call (should not happen, but)
             call(3.0, "o1:charge-payment", "down", service="payment"),  # another service
             call(25.0, "o1:create-shipment", None)]  # after the return
    out = dead_remote_calls(calls, WINDOW, BREAKER, opened_at=T0 + timedelta(seconds=0.65))
    assert out["calls"] == 9 and out["bound"] == 9 and out["withinBound"]
    assert (out["firstThreshold"], out["afterFirstThreshold"]) == (5, 4)
    assert out["offsetsAfterFirstThreshold"] == [0.5, 0.6, 5.7, 11.0]
    assert (out["beforeOpen"], out["afterOpen"], out["openedAfterSeconds"]) == (7, 2, 0.65)
    many = [call(0.01 * i, f"o{i}:create-shipment", "down") for i in range(300)]
    assert not dead_remote_calls(many, WINDOW, BREAKER)["withinBound"]


def test_keys_name_their_order_step_and_compensation() -> None:
    assert key_parts("abc:create-shipment") == ("abc", "create-shipment", False)
    assert key_parts("abc:g2:charge-payment:compensate") == ("abc", "charge-payment", True)
    assert key_parts("abc:g1:deliver") == ("abc", "deliver", False)


def test_attempts_pair_dispatches_with_their_ends() -> None:
    history = [ev(1, "dispatched"), ev(5, "redriven", failureCount=1), ev(6, "dispatched", attempt=2),
               ev(7, "stepWaiting", attempt=2, breaker="shipping"), ev(22, "resumed", attempt=2),
               ev(22, "dispatched", attempt=3), ev(23, "stepDone", attempt=3),
               ev(2, "dispatched", step="charge-payment")]
    got = [(a.attempt, a.end_event, a.increments) for a in attempts_of("o", history, {SHIP})]
    assert got == [(1, "redriven", True), (2, "stepWaiting", False), (3, "stepDone", False)]


def _failing_orders() -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    return {
        # redriven twice during the outage, the simulator answered "down": the outage's
        "a": order("a", ev(1, "dispatched"), ev(5, "redriven", failureCount=1), ev(6, "dispatched", attempt=2),
                   ev(10, "redriven", attempt=2, failureCount=2), ev(25, "dispatched", attempt=3),
                   ev(26, "stepDone", attempt=3), ev(26, "processed", None, None)),
        # timed out during the outage, but its only call hung: another fault's; then held
        "b": order("b", ev(2, "dispatched"), ev(6, "stepFailed", reason="timed out", outcomeUnknown=True),
                   ev(6, "alert"), ev(6, "held")),
        # timed out during the outage with no call at all (a killed instance): no fault seen; held
        "c": order("c", ev(3, "dispatched"), ev(7, "stepFailed", reason="timed out", outcomeUnknown=True),
                   ev(7, "held")),
        # the outage held it: its last call met the dead service
        "d": order("d", ev(4, "dispatched"), ev(8, "stepFailed", reason="timed out", outcomeUnknown=True),
                   ev(8, "held")),
        # failed before the outage (not counted), and a rejection (no increment) during it
        "e": order("e", ev(-9, "dispatched"), ev(-5, "redriven", failureCount=1), ev(-4, "dispatched", attempt=2),
                   ev(3, "stepFailed", attempt=2, reason="rejected"), ev(3, "failed")),
        # another step's failure during the outage is not the outage service's
        "f": order("f", ev(1, "dispatched", step="charge-payment"), ev(5, "redriven", step="charge-payment")),
    }


def _journal() -> list[dict[str, Any]]:
    return [call(1.5, "a:create-shipment", "down"), call(7, "a:create-shipment", "down"),
            call(2.5, "b:create-shipment", "hang"), call(4.5, "d:create-shipment", "transient"),
            call(5.5, "d:create-shipment", "down"), call(25.5, "a:create-shipment", None)]


def test_failure_count_increments_are_attributed_by_what_the_simulator_saw() -> None:
    out = failure_increments(_failing_orders(), WINDOW, index_calls(_journal(), "shipping"))
    assert (out["overlapping"], out["attributable"], out["otherFault"], out["noFaultSeen"]) == (5, 3, 1, 1)
    assert out["byEvent"] == {"redriven": 2, "stepFailed": 3}
    assert {(e["orderId"], e["attempt"], e["cause"]) for e in out["examples"]} == {
        ("a", 1, "outage"), ("a", 2, "outage"), ("b", 1, "otherFault"), ("c", 1, "noFaultSeen"), ("d", 1, "outage")}
    assert out["alsoProcessFault"] == 0
    # an instance killed during a's first attempt (1 s - 5 s) and during c's (3 s - 7 s): only a's is the outage's
    killed = failure_increments(_failing_orders(), WINDOW, index_calls(_journal(), "shipping"),
                                [T0 + timedelta(seconds=4.5)])
    assert (killed["attributable"], killed["alsoProcessFault"]) == (3, 2)  # a#1 (1-5 s) and d#1 (4-8 s)


def test_the_next_attempts_call_is_not_the_redriven_ones() -> None:
    # attempt 1 hung (before the outage) and was redriven at 1 s; attempt 2 called at 1.2 s: down
    orders = {"n": order("n", ev(-3, "dispatched"), ev(1, "redriven", failureCount=1),
                         ev(1.1, "dispatched", attempt=2), ev(2, "stepWaiting", attempt=2, breaker="shipping"))}
    journal = [call(-2.5, "n:create-shipment", "hang"), call(1.2, "n:create-shipment", "down")]
    out = failure_increments(orders, WINDOW, index_calls(journal, "shipping"))
    assert (out["overlapping"], out["attributable"], out["otherFault"]) == (1, 0, 1)


def test_compensations_of_the_outage_service_count_too() -> None:
    digital = {"name": "digital", "version": 1}
    orders = {"g": order("g", ev(1, "compensationDispatched", step="charge-payment"),
                         ev(5, "compensationRedriven", step="charge-payment", failureCount=1), workflow=digital)}
    journal = [call(2, "g:charge-payment:compensate", "down", service="payment")]
    window = OutageWindow("payment", T0, T0 + timedelta(seconds=20))
    out = failure_increments(orders, window, index_calls(journal, "payment"))
    assert (out["overlapping"], out["attributable"]) == (1, 1) and out["examples"][0]["compensation"] is True


def test_orders_held_because_of_the_outage() -> None:
    out = held_for_operator(_failing_orders(), WINDOW, index_calls(_journal(), "shipping"))
    assert (out["count"], out["attributable"], out["otherFault"], out["noFaultSeen"]) == (3, 1, 1, 1)
    assert out["orders"] == ["b", "c", "d"]


def test_a_hold_after_the_outage_burned_the_failure_count_is_the_outages() -> None:
    histories = {
        # redriven twice on the dead service, then its last attempt hung after the return: held
        "h": order("h", ev(1, "dispatched"), ev(5, "redriven", failureCount=1), ev(6, "dispatched", attempt=2),
                   ev(10, "redriven", attempt=2, failureCount=2), ev(21, "dispatched", attempt=3),
                   ev(25, "stepFailed", attempt=3, outcomeUnknown=True), ev(25, "held")),
        # held after the return on attempts that never met the outage
        "k": order("k", ev(30, "dispatched"), ev(34, "stepFailed", outcomeUnknown=True), ev(34, "held")),
    }
    journal = [call(2, "h:create-shipment", "down"), call(7, "h:create-shipment", "down"),
               call(22, "h:create-shipment", "hang"), call(31, "k:create-shipment", "hang")]
    out = held_for_operator(histories, WINDOW, index_calls(journal, "shipping"))
    assert (out["count"], out["attributable"], out["orders"]) == (1, 1, ["h"])


def test_the_drain_runs_from_the_return_to_the_last_waiting_order_ended() -> None:
    histories = {
        "w1": order("w1", ev(1, "dispatched"), ev(1.2, "stepWaiting", breaker="shipping"),
                    ev(24, "resumed"), ev(24, "dispatched", attempt=2), ev(24.5, "stepDone", attempt=2),
                    ev(24.5, "processed", None, None)),
        "w2": order("w2", ev(15, "dispatched"), ev(15.1, "stepWaiting", breaker="shipping"),
                    ev(24, "resumed"), ev(24, "dispatched", attempt=2), ev(27.25, "stepDone", attempt=2),
                    ev(27.25, "processed", None, None)),
        "inflight": order("inflight", ev(-2, "dispatched"), ev(2, "stepFailed", outcomeUnknown=True),
                          ev(2, "held")),
        "stuck": order("stuck", ev(10, "dispatched"), ev(10.1, "stepWaiting", breaker="shipping")),
        # done a moment before the simulator's window opened (the clocks' slack): in flight, ended
        "edge": order("edge", ev(-2, "dispatched"), ev(-0.3, "stepDone"), ev(-0.3, "processed", None, None)),
        "later": order("later", ev(30, "dispatched"), ev(31, "stepDone"), ev(31, "processed", None, None)),
        "untouched": order("untouched", ev(1, "dispatched", step="charge-payment")),
    }
    out = drain(histories, WINDOW)
    assert (out["orders"], out["waited"], out["inFlight"]) == (5, 3, 2)
    assert out["endedAs"] == {"processed": 3, "held": 1} and out["notEnded"] == 1
    assert out["notEndedOrders"] == ["stuck"]
    assert out["seconds"] == 7.25 and out["p50Seconds"] == 2.25  # 0 (edge), 0 (inflight), 4.5, 7.25


def test_breaker_alerts_are_read_from_the_host_log() -> None:
    def line(event: str, remote: str, seconds: float) -> str:
        record = {"event": event, "remote": remote, "state": event.split(".")[1], "at": at(seconds), "opens": 1}
        return f"[instance 0] 2026-11-23 12:00:00,000 ERROR shared: {json.dumps(record, separators=(',', ':'))}"

    lines = [line("breaker.open", "shipping", 0.7), "not json {", line("breaker.reopened", "shipping", 6),
             line("breaker.closed", "shipping", 22), line("breaker.open", "payment", 3), "[instance 1] noise"]
    out = breaker_alerts(lines, "shipping")
    assert (out["open"], out["closed"]) == (1, 1) and [a["state"] for a in out["alerts"]] == ["open", "closed"]
    assert out["everyRemote"] == {"payment open": 1, "shipping closed": 1, "shipping open": 1}


def test_the_report_and_its_summary_lines() -> None:
    histories = _failing_orders()
    log = [f'[instance 0] x ERROR y: {{"event":"breaker.open","remote":"shipping","at":"{at(0.65)}","opens":1}}']
    report = outage_report(WINDOW, _journal(), histories, BREAKER, log)
    assert set(report) == {"service", "window", "breaker", "deadRemoteCalls", "failureCountIncrements",
                           "heldForOperator", "drain", "historyWhileWaiting", "breakerAlerts"}
    assert report["deadRemoteCalls"]["calls"] == 3 and report["deadRemoteCalls"]["beforeOpen"] == 0
    lines = render_outage(report)
    assert "calls to the dead remote: 3 (bound 9)" in lines[1]
    assert "FailureCount increments caused by the outage: 3 " in lines[2]
    assert "orders held for an operator because of the outage: 1 " in lines[3]
    assert render_outage(outage_report(None, [], {}, BREAKER, [])) == ["  outage: none"]


def test_the_chaos_summary_prints_the_outage() -> None:
    report = outage_report(WINDOW, _journal(), _failing_orders(), BREAKER, [])
    summary = render_summary(_minimal_report(report))
    assert "calls to the dead remote: 3 (bound 9)" in summary and "the breaker never opened" in summary


def _minimal_report(outage: dict[str, Any]) -> dict[str, Any]:
    ok = {"ok": True, "value": 0}
    checks = {k: ok for k in ("terminalPercent", "lostOrders", "stuckOrders", "doubleEffects",
                              "failedOrdersFullyCompensatedPercent", "compensationsAppliedMoreThanOnce")}
    faults = {"remoteInjected": {}, "permanentRejections": {"ordersDesigned": 0, "reserve422": 0, "charge422": 0},
              "hostInstanceKills": 0, "serviceBusEmulatorRestarts": 0, "azuriteRestarts": 0,
              "shippingOutageWindows": 1, "duplicateSubmissions": 0, "duplicateDeliveries": 0,
              "duplicateRequestDeliveries": 0, "duplicateReplyDeliveries": 0, "remoteCalls": {}, "remote503": {}}
    orders = {"planned": 1, "accepted": 1, "finalStates": {}, "failedWithEffectsToCompensate": 0,
              "compensationsApplied": 0, "compensationsNeeded": 0}
    return {"checks": checks, "faults": faults, "orders": orders, "seed": 1, "replay": "", "ok": True,
            "outage": outage}


def test_the_history_while_waiting_counts_waits_and_events_per_waiting_order() -> None:
    """One wait that lasted the whole outage (4 probe cycles): 1 wait, its events; the old shape,
    a wait per probe cycle, shows as many waits as cycles. An order that never waited is not counted."""
    one = order("o-one", ev(1, "dispatched"), ev(2, "stepWaiting"), ev(25, "resumed"), ev(26, "stepDone"))
    per_probe = order("o-probe", ev(1, "dispatched"), ev(2, "stepWaiting"), ev(7, "resumed"),
                      ev(7, "dispatched", attempt=2),
                      ev(8, "stepWaiting", attempt=2), ev(13, "resumed", attempt=2),
                      ev(13, "dispatched", attempt=3), ev(14, "stepWaiting", attempt=3))
    never = order("o-never", ev(1, "dispatched"), ev(2, "stepDone"))
    histories = {"o-one": one, "o-probe": per_probe, "o-never": never}
    report = history_while_waiting(histories, WINDOW, BREAKER)
    assert report == {"orders": 2, "probeCycles": 4, "waitsMax": 3, "waitsP50": 2, "eventsMax": 8, "eventsP50": 5}
    assert history_while_waiting({"o-one": one}, WINDOW, BREAKER)["waitsMax"] == 1
