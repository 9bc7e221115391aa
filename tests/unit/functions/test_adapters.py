"""The thin Functions adapters: request/message in, core called, response out."""

from __future__ import annotations

import json
from typing import Any

import azure.functions as func
import pytest
from azure.functions.servicebus import ServiceBusMessage

import functions.orders as sub_fn
import functions.scheduler as sched_fn
import functions.supervisor as sup_fn
from shared.supervisor import sweep
from tests.unit.core.statemachine.test_operator import events
from tests.unit.functions.test_settlement import RecordingActions
from tests.unit.harness import BODY, make_runtime


def _user(fb: Any) -> Any:
    return fb._function.get_user_function()


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Any:
    runtime = make_runtime()
    for mod in (sub_fn, sched_fn, sup_fn):
        monkeypatch.setattr(mod, "get_runtime", lambda: runtime)
    monkeypatch.setattr(sub_fn._limit, "value", 65536)
    return runtime


def _http(method: str, url: str, body: bytes = b"", headers: dict | None = None,
          route_params: dict | None = None) -> func.HttpRequest:
    return func.HttpRequest(method=method, url=url, body=body, headers=headers or {}, route_params=route_params or {})


def test_http_adapters(rt: Any) -> None:
    resp = _user(sub_fn.submit_order)(_http("POST", "/api/orders", json.dumps(BODY).encode(),
                                            {"Content-Type": "application/json"}))
    assert resp.status_code == 202 and resp.mimetype == "application/json"
    oid = json.loads(resp.get_body())["orderId"]
    assert resp.headers["Location"] == f"/api/orders/{oid}"
    got = _user(sub_fn.get_order_status)(_http("GET", f"/api/orders/{oid}", route_params={"id": oid}))
    assert got.status_code == 200 and json.loads(got.get_body())["processState"] == "Processing"
    bad = _user(sub_fn.get_order_status)(_http("GET", "/api/orders/zz", route_params={"id": "zz"}))
    assert bad.status_code == 400 and bad.mimetype == "application/problem+json"
    r = _user(sub_fn.retry)(_http("POST", f"/api/orders/{oid}/retry", route_params={"id": oid}))
    assert r.status_code == 409
    c = _user(sub_fn.cancel)(_http("POST", f"/api/orders/{oid}/cancel", route_params={"id": oid}))
    assert c.status_code == 409 and c.mimetype == "application/problem+json"  # a step is in flight
    rt.clock.advance(31)
    sweep(rt)  # the step timed out: redriven, Pending and unclaimed, so it can be cancelled
    c = _user(sub_fn.cancel)(_http("POST", f"/api/orders/{oid}/cancel", route_params={"id": oid}))
    assert c.status_code == 202
    # who acted: the operator's event says so (the key mode: whoever holds the master key)
    cancelled = [e for e in events(rt, oid) if e["event"] == "cancelled"]
    assert [e["detail"]["by"] for e in cancelled] == ["key"]
    assert all("by" not in (e.get("detail") or {}) for e in events(rt, oid) if e["event"] == "accepted")
    t = _user(sub_fn.submit_order)(_http("POST", "/api/orders", b"hello", {"Content-Type": "text/plain"}))
    assert t.status_code == 415


def _sb(body: bytes, message_id: str, props: dict | None = None) -> ServiceBusMessage:
    return ServiceBusMessage(body=body, message_id=message_id, application_properties=props or {},
                             user_properties={})


def test_service_bus_and_timer_adapters(rt: Any) -> None:
    oid = json.loads(_user(sub_fn.submit_order)(_http("POST", "/api/orders", json.dumps(BODY).encode(),
                                                      {"Content-Type": "application/json"})).get_body())["orderId"]
    assert rt.bus.peek("scheduler") == []  # the submission claimed the order itself
    [req] = rt.bus.take("agent-inventory")
    reply = {"kind": "step", "orderId": oid, "step": "reserve-inventory", "attempt": 1, "outcome": "success",
             "result": {"reservationId": "r"}, "reason": None}
    actions = RecordingActions()
    _user(sched_fn.replies)(_sb(json.dumps(reply).encode(), "reply:" + req.message_id), actions)
    assert len(rt.bus.take("agent-payment")) == 1 and actions.actions == []  # the host completes it
    garbage = _sb(b"garbage", "x")
    _user(sched_fn.replies)(garbage, actions)  # poison: dead-lettered at once, with its reason
    assert actions.calls[-1][:3] == ("deadletter", garbage, "InvalidJson")
    rt.clock.advance(31)

    class Timer:
        past_due = False

    _user(sup_fn.supervisor)(Timer())
    assert rt.store.read_row(oid, "state")["FailureCount"] == 1
    [m] = rt.bus.take("scheduler")  # the redrive's schedule message: the scheduler claims again
    msg = _sb(json.dumps(m.body).encode(), m.message_id, {"traceparent": m.application_properties["traceparent"]})
    _user(sched_fn.scheduler)(msg, actions)
    [again] = rt.bus.take("agent-payment")
    assert again.body["attempt"] == 2
