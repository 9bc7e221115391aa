"""The agent request model (shared/core/messages/): the scheduler's body, the agent's reading.

The body ``AgentRequest(...).to_body()`` builds must be the one the scheduler sends (same dict,
same JSON bytes), for a step and for a compensation; and the agent must read it back whole.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from shared.agent.parsing import read_agent_request
from shared.core.jsonio import dumps, loads
from shared.core.messages import AgentRequest, CompensationTarget, PoisonMessage, RequestRoute
from shared.core.statemachine import Ctx, StepState, View
from shared.core.statemachine.dispatch import compensation_request, step_request
from tests.unit.harness import T0, make_runtime, post

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ORDER = {"customerId": "c-1", "currency": "EUR", "total": "19.98",
         "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}]}


def submitted() -> tuple[View, Ctx]:
    """A new order's view (its first step Running), and a decision context at T0."""
    rt = make_runtime()
    response = post(rt)
    assert response.status == 202, response.body
    view = View.from_entities(rt.store.read_partition(str(response.body["orderId"])))
    return view, Ctx(now=T0, config=rt.config)


def same_json(built: dict[str, Any], sent: dict[str, Any]) -> None:
    assert built == sent
    assert dumps(built) == dumps(sent)  # key order and money strings included


# --------------------------------------------------------------------------- the scheduler's body

def test_step_body_is_the_schedulers() -> None:
    view, ctx = submitted()
    first, second = view.steps[0], view.steps[1]
    done = replace(first, state=StepState.DONE, result={"reservationId": "r-1", "held": Decimal("19.98")})
    running = replace(second, state=StepState.RUNNING, attempt=2, complete_by=T0 + timedelta(seconds=45))
    view = view.with_steps(done, running)
    assert view.order is not None
    spec = ctx.config.spec(running.name)
    order_id = view.order_id

    sent = step_request(view, running, ctx).message.body
    built = AgentRequest(kind="step", order_id=order_id, step=running.name, operation=spec.operation, attempt=2,
                         idempotency_key=f"{order_id}:{running.name}", complete_by=T0 + timedelta(seconds=45),
                         order=view.order.payload(), context={first.name: done.result}).to_body()
    same_json(built, sent)
    assert "compensates" not in built


@pytest.mark.parametrize("result", [{"reservationId": "r-1"}, None], ids=["done", "outcome-unknown"])
def test_compensation_body_is_the_schedulers(result: dict[str, Any] | None) -> None:
    view, ctx = submitted()
    step = replace(view.steps[0], state=StepState.DONE, result=result, compensation_attempt=3,
                   compensation_complete_by=T0 + timedelta(seconds=60))
    view = view.with_steps(step)
    assert view.order is not None
    spec = ctx.config.spec(step.name)
    assert spec.compensation is not None
    order_id = view.order_id

    sent = compensation_request(view, step, ctx).message.body
    built = AgentRequest(kind="compensation", order_id=order_id, step=step.name, operation=spec.compensation,
                         attempt=3, idempotency_key=f"{order_id}:{step.name}:compensate",
                         complete_by=T0 + timedelta(seconds=60), order=view.order.payload(),
                         context={step.name: result} if result is not None else {},
                         compensates=CompensationTarget(step=step.name, idempotency_key=f"{order_id}:{step.name}"),
                         ).to_body()
    same_json(built, sent)


def test_the_contracts_example_body() -> None:
    """docs/contracts.md, "Agent messages": camelCase, completeBy in UTC with microseconds."""
    request = AgentRequest(kind="compensation", order_id="o-1", step="charge-payment", operation="refund", attempt=2,
                           idempotency_key="o-1:charge-payment:compensate",
                           complete_by=datetime(2026, 11, 22, 9, 30, tzinfo=timezone(timedelta(hours=2))),
                           order={**ORDER, "total": Decimal("19.98")}, context={"charge-payment": {"paymentId": "p"}},
                           compensates=CompensationTarget(step="charge-payment", idempotency_key="o-1:charge-payment"))
    assert json.loads(dumps(request.to_body())) == {
        "kind": "compensation", "orderId": "o-1", "step": "charge-payment", "operation": "refund", "attempt": 2,
        "idempotencyKey": "o-1:charge-payment:compensate", "completeBy": "2026-11-22T07:30:00.000000+00:00",
        "order": ORDER, "context": {"charge-payment": {"paymentId": "p"}},
        "compensates": {"step": "charge-payment", "idempotencyKey": "o-1:charge-payment"},
        "workflow": "order", "workflowVersion": 1,
    }


@pytest.mark.parametrize("change", [
    {"complete_by": datetime(2026, 11, 22, 8, 0)},  # naive
    {"attempt": 0},
    {"order_id": " "},
    {"kind": "compensation", "compensates": CompensationTarget(step="charge-payment", idempotency_key="k")},
    {"compensates": CompensationTarget(step="reserve-inventory", idempotency_key="k")},  # on a step
])
def test_the_scheduler_cannot_build_a_request_the_agent_would_refuse(change: dict[str, Any]) -> None:
    values: dict[str, Any] = {"kind": "step", "order_id": "o-1", "step": "reserve-inventory", "operation": "reserve",
                              "attempt": 1, "idempotency_key": "o-1:reserve-inventory", "complete_by": T0,
                              "order": ORDER}
    with pytest.raises(ValidationError):
        AgentRequest(**{**values, **change})


# --------------------------------------------------------------------------- the agent's reading

def test_the_agent_reads_what_the_scheduler_sent() -> None:
    view, ctx = submitted()
    step = replace(view.steps[0], state=StepState.DONE, result={"amount": Decimal("12345678901234567.89")},
                   compensation_attempt=1, compensation_complete_by=T0 + timedelta(seconds=60))
    message = compensation_request(view.with_steps(step), step, ctx).message
    request = read_agent_request(message.encoded(), message_id=message.message_id, reply_to=message.reply_to,
                                 application_properties={b"traceparent": TRACEPARENT.encode(), "tracestate": "a=1"})
    assert request.complete_by == T0 + timedelta(seconds=60) and request.complete_by.tzinfo is not None
    assert request.context[step.name]["amount"] == "12345678901234567.89"  # money travels as a string
    assert request.compensates == CompensationTarget(step=step.name, idempotency_key=f"{view.order_id}:{step.name}")
    assert (request.envelope.message_id, request.envelope.reply_to) == (message.message_id, message.reply_to)
    assert (request.envelope.traceparent, request.envelope.tracestate) == (TRACEPARENT, "a=1")
    assert dumps(request.to_body()) == dumps(message.body)  # the envelope is never part of the body


def test_the_envelope_never_comes_from_the_body() -> None:
    body = {"kind": "step", "orderId": "o-1", "step": "reserve-inventory", "operation": "reserve", "attempt": 1,
            "idempotencyKey": "o-1:reserve-inventory", "completeBy": "2026-11-22T08:00:30Z", "order": ORDER,
            "envelope": {"message_id": "forged", "reply_to": "elsewhere"}, "messageId": "forged", "replyTo": "x"}
    request = read_agent_request(json.dumps(body), message_id="m-1", reply_to="replies")
    assert (request.envelope.message_id, request.envelope.reply_to, request.envelope.traceparent) == (
        "m-1", "replies", None)
    assert request.complete_by == datetime(2026, 11, 22, 8, 0, 30, tzinfo=UTC)
    assert request.context == {}


def test_every_problem_is_named_the_route_check_included() -> None:
    body = {"kind": "compensation", "orderId": "", "step": "reserve-inventory", "operation": "refund", "attempt": 0,
            "idempotencyKey": "k", "completeBy": "2026-11-22T08:00:30", "order": [], "context": None,
            "compensates": {"step": "charge-payment"}}
    routes: list[RequestRoute] = []

    def route_check(route: RequestRoute) -> list[str]:
        routes.append(route)
        return ["operation: not this agent's"]

    with pytest.raises(PoisonMessage) as e:
        read_agent_request(json.dumps(body), message_id="", reply_to=None, route_check=route_check)
    named = {problem.split(":")[0] for problem in str(e.value).split("; ")}
    assert named == {"orderId", "attempt", "completeBy", "order", "compensates.step", "compensates.idempotencyKey",
                     "message_id", "reply_to", "operation"}
    assert routes == [RequestRoute(kind="compensation", step="reserve-inventory", operation="refund")]


def test_the_route_is_checked_only_when_it_is_valid() -> None:
    body = {"kind": "step", "step": "reserve-inventory", "operation": "../x"}
    with pytest.raises(PoisonMessage) as e:
        read_agent_request(json.dumps(body), message_id="m", reply_to="r",
                           route_check=lambda route: pytest.fail(f"route checked: {route}"))
    assert "operation: not a valid operation name" in str(e.value)


def test_money_is_never_a_float() -> None:
    raw = json.dumps({"kind": "step", "orderId": "o-1", "step": "s", "operation": "op", "attempt": 1,
                      "idempotencyKey": "k", "completeBy": "2026-11-22T08:00:30+00:00",
                      "order": {**ORDER, "items": [{"sku": "S", "quantity": 1, "unitPrice": 0}]}})
    raw = raw.replace('"unitPrice": 0', '"unitPrice": 1234567890123456.01')
    request = read_agent_request(raw, message_id="m", reply_to="r")
    assert request.order["items"][0]["unitPrice"] == Decimal("1234567890123456.01")
    assert loads(dumps(request.to_body()))["order"]["items"][0]["unitPrice"] == "1234567890123456.01"
