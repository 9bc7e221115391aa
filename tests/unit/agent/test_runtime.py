"""Unit tests of the agent runtime (shared/agent/) and its adapter (functions/agents.py).

The remote service is a real HTTP server on a random loopback port, scripted per test
(statuses, hangs, bodies), recording every request it gets; replies go to a recording
ReplySender. Deadlines are short (about 1 s) so the file runs fast.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import azure.functions as func
import pytest
from azure.functions.servicebus import ServiceBusMessage

from functions.agents import process_message
from shared.agent import AgentRuntime, PoisonMessage, RetryPolicy, TransientFailure, loads, parse_request
from shared.core.fence import MAX_FENCE_LENGTH
from shared.core.messages import OutMessage, ReplyMessage
from shared.core.workflows import AGENTS_BY_NAME
from shared.messaging import MemoryBus
from shared.observability.telemetry import trace_id

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FAST = RetryPolicy(initial_backoff=0.05, max_backoff=0.2, jitter=0.02, max_call_timeout=5.0)


# --------------------------------------------------------------------------- a scripted remote

class Scripted(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.script: list[tuple[Any, ...]] = []  # consumed in order; the last one repeats
        self.requests: list[dict[str, Any]] = []
        self.stop_hangs = threading.Event()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/inventory"

    def next_action(self) -> tuple[Any, ...]:
        with self.lock:
            if not self.script:
                return (200, {"ok": True})
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]


class _Handler(BaseHTTPRequestHandler):
    server: Scripted
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        with self.server.lock:
            self.server.requests.append({
                "path": self.path, "headers": dict(self.headers.items()), "raw": raw, "at": time.monotonic(),
                "wall": datetime.now(UTC),
            })
        action = self.server.next_action()
        if action[0] == "hang":
            self.server.stop_hangs.wait(action[1])
            action = (503, {"error": "hung"})
        status, body = action[0], action[1]
        headers = action[2] if len(action) > 2 else {}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass


@pytest.fixture
def remote() -> Iterator[Scripted]:
    srv = Scripted()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.stop_hangs.set()
    srv.shutdown()
    srv.server_close()


class Replies(MemoryBus):
    """The app's in-memory bus, seen as the list of replies sent (OutMessage)."""

    @property
    def replies(self) -> list[OutMessage]:
        return self.all()


def RecordingSender(fail: bool = False) -> Replies:  # noqa: N802 - reads as a class in the tests
    bus = Replies()
    if fail:
        bus.fail.add("replies")
    return bus


# --------------------------------------------------------------------------- helpers

def request_body(*, seconds: float = 2.0, complete_by: datetime | None = None, kind: str = "step",
                 step: str = "reserve-inventory", operation: str = "reserve", attempt: int = 1,
                 order_id: str | None = None, **over: Any) -> dict[str, Any]:
    order_id = order_id or f"o-{uuid.uuid4().hex[:8]}"
    cb = complete_by or (datetime.now(UTC) + timedelta(seconds=seconds))
    key = f"{order_id}:{step}" + (":compensate" if kind == "compensation" else "")
    body = {
        "kind": kind, "orderId": order_id, "step": step, "operation": operation, "attempt": attempt,
        "idempotencyKey": key, "completeBy": cb.isoformat(),
        "order": {"customerId": "c-1", "currency": "EUR", "total": "19.98",
                  "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}]},
        "context": {},
    }
    body.update(over)
    return body


def mid_for(body: dict[str, Any]) -> str:
    extra = ":compensate" if body["kind"] == "compensation" else ""
    return f"{body['orderId']}:{body['step']}{extra}:{body['attempt']}"


def make_request(body: dict[str, Any] | bytes, agent: str = "inventory", traceparent: str | None = TRACEPARENT):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    mid = mid_for(body) if isinstance(body, dict) else "m-1"
    props = {"traceparent": traceparent} if traceparent else {}
    return parse_request(raw, message_id=mid, reply_to="replies", application_properties=props, agent=agent)


def runtime(remote: Scripted, sender: Replies, policy: RetryPolicy = FAST, **kw: Any) -> AgentRuntime:
    return AgentRuntime("inventory", remote.base, sender, policy=policy, **kw)


def sb_message(body: bytes, *, message_id: str = "m-1", reply_to: str | None = "replies",
               props: dict[str, Any] | None = None) -> ServiceBusMessage:
    return ServiceBusMessage(
        body=body, message_id=message_id, reply_to=reply_to, correlation_id=message_id,
        application_properties=props if props is not None else {"traceparent": TRACEPARENT},
        user_properties={}, delivery_count=1, content_type="application/json",
    )


# --------------------------------------------------------------------------- outcomes

def test_success_replies_with_result_per_contract(remote: Scripted) -> None:
    remote.script = [(200, {"reservationId": "r-42"})]
    sender = RecordingSender()
    body = request_body(attempt=2)
    req = make_request(body)

    result = runtime(remote, sender).handle(req)

    assert result.status == "replied" and result.outcome == "success" and result.calls == 1
    [call] = remote.requests
    assert call["path"] == "/inventory/reserve"
    assert json.loads(call["raw"]) == {"orderId": body["orderId"], "order": body["order"], "context": {}}
    [sent] = sender.replies
    assert sent.queue == "replies"
    assert sent.message_id == f"reply:{mid_for(body)}"
    assert sent.correlation_id == mid_for(body)
    assert set(sent.application_properties) == {"traceparent"}
    assert json.loads(sent.encoded()) == {
        "kind": "step", "orderId": body["orderId"], "step": "reserve-inventory", "attempt": 2,
        "outcome": "success", "result": {"reservationId": "r-42"}, "reason": None,
    }


def test_permanent_422_gets_error_reply_with_reason_and_no_retry(remote: Scripted) -> None:
    remote.script = [(422, {"error": "out of stock: SKU-1"})]
    sender = RecordingSender()
    result = runtime(remote, sender).handle(make_request(request_body()))

    assert result.status == "replied" and result.outcome == "error"
    assert len(remote.requests) == 1
    reply = json.loads(sender.replies[0].encoded())
    assert reply["outcome"] == "error" and reply["result"] is None
    assert reply["reason"] == "out of stock: SKU-1"


@pytest.mark.parametrize("status", [400, 404, 409])
def test_other_business_4xx_are_permanent(remote: Scripted, status: int) -> None:
    remote.script = [(status, {"error": f"nope {status}"})]
    sender = RecordingSender()
    result = runtime(remote, sender).handle(make_request(request_body()))
    assert (result.outcome, result.calls) == ("error", 1)
    assert json.loads(sender.replies[0].encoded())["reason"] == f"nope {status}"


def test_error_without_json_body_still_has_a_reason(remote: Scripted) -> None:
    remote.script = [(422, b"plain text rejection")]
    sender = RecordingSender()
    runtime(remote, sender).handle(make_request(request_body()))
    assert json.loads(sender.replies[0].encoded())["reason"] == "HTTP 422: plain text rejection"


def test_transient_then_success_is_retried_with_the_same_idempotency_key(remote: Scripted) -> None:
    remote.script = [(503, {"error": "busy"}), (429, {"error": "slow down"}), (500, b"oops"),
                     (408, b""), (200, {"reservationId": "r-1"})]
    sender = RecordingSender()
    body = request_body(seconds=5)
    result = runtime(remote, sender).handle(make_request(body))

    assert result.status == "replied" and result.outcome == "success"
    assert result.statuses == (503, 429, 500, 408, 200)
    assert len(remote.requests) == 5
    keys = {r["headers"]["Idempotency-Key"] for r in remote.requests}
    assert keys == {f"{body['orderId']}:reserve-inventory"}
    # Every attempt and the reply are in the request's trace, in spans of the agent's own: the calls
    # in the agent's consumer span (or a client span per call, when client spans are on), the reply
    # carrying the consumer span's context (a send makes no span).
    spans = {r["headers"]["traceparent"] for r in remote.requests}
    assert {trace_id(s) for s in spans} == {trace_id(TRACEPARENT)} and TRACEPARENT not in spans
    [sent] = sender.replies
    reply_span = sent.application_properties["traceparent"]
    assert trace_id(reply_span) == trace_id(TRACEPARENT) and reply_span != TRACEPARENT


def test_success_body_that_is_not_json_is_retried(remote: Scripted) -> None:
    remote.script = [(200, b"<html>proxy</html>"), (200, {"reservationId": "r-1"})]
    sender = RecordingSender()
    result = runtime(remote, sender).handle(make_request(request_body(seconds=5)))
    assert result.calls == 2 and result.outcome == "success"


def test_backoff_is_exponential_jittered_and_honours_retry_after(remote: Scripted) -> None:
    remote.script = [(503, {}), (503, {}), (503, {}), (429, {}, {"Retry-After": "1"}), (200, {"reservationId": "r"})]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)

    policy = RetryPolicy(initial_backoff=0.1, max_backoff=2.0, jitter=0.05)
    runtime(remote, RecordingSender(), policy, sleep=sleep).handle(make_request(request_body(seconds=30)))

    assert len(sleeps) == 4
    for s, base in zip(sleeps[:3], (0.1, 0.2, 0.4), strict=True):
        assert base <= s <= base + 0.05 + 1e-9
    assert sleeps[3] >= 1.0  # Retry-After beats the 0.8 s backoff


def test_waits_never_run_past_complete_by(remote: Scripted) -> None:
    remote.script = [(503, {"error": "down"})]
    sleeps: list[float] = []
    policy = RetryPolicy(initial_backoff=5.0, max_backoff=60.0, jitter=0.0)
    t0 = time.monotonic()
    result = runtime(remote, RecordingSender(), policy, sleep=lambda s: (sleeps.append(s), time.sleep(s))).handle(
        make_request(request_body(seconds=1.0)))
    # The first 5 s backoff cannot fit in the ~1 s left: no sleep at all, stop now.
    assert result.status == "expired" and result.calls == 1
    assert sleeps == []
    assert time.monotonic() - t0 < 0.8


# --------------------------------------------------------------------------- deadlines

def test_transient_forever_stops_at_complete_by_and_sends_nothing(remote: Scripted) -> None:
    remote.script = [(503, {"error": "busy"})]
    sender = RecordingSender()
    body = request_body(seconds=1.2)
    complete_by = datetime.fromisoformat(body["completeBy"])
    t0 = time.monotonic()

    result = runtime(remote, sender).handle(make_request(body))

    elapsed = time.monotonic() - t0
    assert result.status == "expired" and result.reply is None
    assert sender.replies == []
    assert result.calls >= 3  # it did retry
    assert all(r["wall"] < complete_by for r in remote.requests)  # never a call past completeBy
    assert 0.8 < elapsed < 1.6


def test_past_complete_by_on_arrival_sends_nothing_and_calls_nothing(remote: Scripted) -> None:
    sender = RecordingSender()
    body = request_body(complete_by=datetime.now(UTC) - timedelta(milliseconds=1))
    result = runtime(remote, sender).handle(make_request(body))
    assert (result.status, result.calls) == ("expired", 0)
    assert remote.requests == [] and sender.replies == []
    assert result.detail == "past completeBy on arrival"


def test_call_timeout_is_bounded_by_time_left(remote: Scripted) -> None:
    remote.script = [("hang", 10)]
    sender = RecordingSender()
    policy = RetryPolicy(initial_backoff=0.05, max_backoff=0.1, max_call_timeout=30.0)
    t0 = time.monotonic()
    result = runtime(remote, sender, policy).handle(make_request(request_body(seconds=1.0)))
    elapsed = time.monotonic() - t0
    assert result.status == "expired" and sender.replies == []
    assert result.statuses[0] == "timeout"
    assert elapsed < 1.5  # not 10 s (the hang), not 30 s (the per-call maximum)


def test_call_timeout_is_bounded_by_the_per_call_maximum(remote: Scripted) -> None:
    remote.script = [("hang", 10), (200, {"reservationId": "r-after-hang"})]
    sender = RecordingSender()
    policy = RetryPolicy(initial_backoff=0.05, max_backoff=0.1, max_call_timeout=0.3)
    result = runtime(remote, sender, policy).handle(make_request(request_body(seconds=3.0)))
    assert result.statuses == ("timeout", 200)
    assert result.outcome == "success"
    first, second = remote.requests
    assert 0.3 <= second["at"] - first["at"] < 1.0
    assert first["headers"]["Idempotency-Key"] == second["headers"]["Idempotency-Key"]


def test_connection_refused_is_transient_until_complete_by() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sender = RecordingSender()
    rt = AgentRuntime("inventory", f"http://127.0.0.1:{port}/inventory", sender, policy=FAST)
    result = rt.handle(make_request(request_body(seconds=0.8)))
    assert result.status == "expired" and sender.replies == []
    assert result.calls >= 2 and set(result.statuses) == {"connection-error"}


def test_response_arriving_after_complete_by_is_not_replied(remote: Scripted) -> None:
    remote.script = [(200, {"reservationId": "late"})]
    sender = RecordingSender()
    body = request_body(seconds=1.0)
    cb = datetime.fromisoformat(body["completeBy"])
    calls = {"n": 0}

    def clock() -> datetime:  # the clock jumps past completeBy while the call is in flight
        calls["n"] += 1
        return datetime.now(UTC) if calls["n"] <= 2 else cb + timedelta(milliseconds=1)

    result = runtime(remote, sender, now=clock).handle(make_request(body))
    assert len(remote.requests) == 1
    assert result.status == "expired" and sender.replies == []


# --------------------------------------------------------------------------- trace, money, compensation

def test_traceparent_absent_starts_a_trace_shared_by_call_and_reply(remote: Scripted) -> None:
    remote.script = [(200, {"reservationId": "r"})]
    sender = RecordingSender()
    runtime(remote, sender).handle(make_request(request_body(), traceparent=None))
    span = remote.requests[0]["headers"]["traceparent"]
    assert trace_id(span) is not None and trace_id(span) != trace_id(TRACEPARENT)
    reply_span = sender.replies[0].application_properties["traceparent"]
    assert set(sender.replies[0].application_properties) == {"traceparent"} and trace_id(reply_span) == trace_id(span)


def test_money_is_decimal_end_to_end(remote: Scripted) -> None:
    # Amounts a float cannot hold: 17 significant digits plus cents.
    remote.script = [(200, b'{"paymentId": "p-1", "amount": 12345678901234567.89, "fee": "0.10"}')]
    sender = RecordingSender()
    body = request_body(step="charge-payment", operation="charge")
    raw = json.dumps(body).replace('"unitPrice": "9.99"', '"unitPrice": 1234567890123456.01').encode()
    req = parse_request(raw, message_id="m-money", reply_to="replies", agent="payment")
    assert req.order["items"][0]["unitPrice"] == Decimal("1234567890123456.01")

    rt = AgentRuntime("payment", remote.base.replace("/inventory", "/payment"), sender, policy=FAST)
    result = rt.handle(req)

    sent_order = loads(remote.requests[0]["raw"])["order"]
    assert Decimal(sent_order["items"][0]["unitPrice"]) == Decimal("1234567890123456.01")
    assert sent_order["total"] == "19.98"
    assert result.reply is not None and result.reply.result["amount"] == Decimal("12345678901234567.89")
    reply = loads(sender.replies[0].encoded())
    assert Decimal(reply["result"]["amount"]) == Decimal("12345678901234567.89")
    assert reply["result"]["fee"] == "0.10"
    assert not any(isinstance(v, float) for v in reply["result"].values())


def test_compensation_request_calls_its_operation_with_its_own_key(remote: Scripted) -> None:
    remote.script = [(200, {"released": "r-1"})]
    sender = RecordingSender()
    body = request_body(kind="compensation", operation="release",
                        context={"reserve-inventory": {"reservationId": "r-1"}})
    result = runtime(remote, sender).handle(make_request(body))

    [call] = remote.requests
    assert call["path"] == "/inventory/release"
    assert call["headers"]["Idempotency-Key"] == f"{body['orderId']}:reserve-inventory:compensate"
    assert json.loads(call["raw"])["context"] == {"reserve-inventory": {"reservationId": "r-1"}}
    assert result.outcome == "success"
    sent = sender.replies[0]
    assert sent.message_id == f"reply:{body['orderId']}:reserve-inventory:compensate:1"
    assert json.loads(sent.encoded())["kind"] == "compensation"


def test_compensation_passes_compensates_through_to_the_remote(remote: Scripted) -> None:
    """A compensation of a step whose outcome is unknown: no result in context; the remote
    finds the effect by the original step's idempotency key."""
    remote.script = [(200, {"released": None, "nothingToUndo": True})]
    sender = RecordingSender()
    body = request_body(kind="compensation", operation="release", context={})
    target = {"step": "reserve-inventory", "idempotencyKey": f"{body['orderId']}:reserve-inventory"}
    body["compensates"] = target
    result = runtime(remote, sender).handle(make_request(body))
    [call] = remote.requests
    sent = json.loads(call["raw"])
    assert sent == {"orderId": body["orderId"], "order": body["order"], "context": {}, "compensates": target}
    assert call["headers"]["Idempotency-Key"] == f"{body['orderId']}:reserve-inventory:compensate"
    assert result.outcome == "success" and result.reply.result == {"released": None, "nothingToUndo": True}


def test_step_request_body_has_no_compensates(remote: Scripted) -> None:
    remote.script = [(200, {"reservationId": "r"})]
    runtime(remote, RecordingSender()).handle(make_request(request_body()))
    assert "compensates" not in json.loads(remote.requests[0]["raw"])


def test_409_compensated_is_an_error_reply_without_retry(remote: Scripted) -> None:
    """The original call arriving after its compensation tombstoned its key: refused for good."""
    remote.script = [(409, {"error": "compensated"})]
    sender = RecordingSender()
    result = runtime(remote, sender).handle(make_request(request_body()))
    assert (result.outcome, result.calls) == ("error", 1)
    assert json.loads(sender.replies[0].encoded())["reason"] == "compensated"


def test_reply_send_failure_propagates(remote: Scripted) -> None:
    remote.script = [(200, {"reservationId": "r"})]
    with pytest.raises(ConnectionError):  # -> the adapter raises -> abandon -> redelivery
        runtime(remote, RecordingSender(fail=True)).handle(make_request(request_body()))


# --------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("raw, needle", [
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
])
def test_parse_rejects_non_json(raw: bytes, needle: str) -> None:
    with pytest.raises(PoisonMessage, match=needle):
        parse_request(raw, message_id="m", reply_to="replies")


@pytest.mark.parametrize("change, needle", [
    ({"kind": "other"}, "kind"),
    ({"orderId": ""}, "orderId"),
    ({"attempt": 0}, "attempt"),
    ({"attempt": True}, "attempt"),
    ({"attempt": "1"}, "attempt"),
    ({"completeBy": "2026-11-22T07:30:00"}, "UTC offset"),
    ({"completeBy": "tomorrow"}, "completeBy"),
    ({"order": []}, "order"),
    ({"context": "x"}, "context"),
    ({"idempotencyKey": None}, "idempotencyKey"),
    ({"operation": "../_faults"}, "operation"),
    ({"step": "charge-payment", "operation": "charge"}, "served by agent 'payment'"),
    ({"operation": "release"}, "expects 'reserve'"),
    ({"kind": "compensation", "operation": "reserve"}, "expects 'release'"),
    ({"step": "nope"}, "not a workflow step"),
    ({"compensates": {"step": "reserve-inventory", "idempotencyKey": "k"}}, "only a compensation"),
    ({"kind": "compensation", "operation": "release", "compensates": "k"}, "compensates"),
    ({"kind": "compensation", "operation": "release", "compensates": {"step": "reserve-inventory"}},
     "compensates.idempotencyKey"),
    ({"kind": "compensation", "operation": "release",
      "compensates": {"step": "charge-payment", "idempotencyKey": "k"}}, "compensates.step"),
])
def test_parse_rejects_wrong_schema(change: dict[str, Any], needle: str) -> None:
    body = request_body(**change)
    with pytest.raises(PoisonMessage, match=needle):
        parse_request(json.dumps(body).encode(), message_id="m", reply_to="replies", agent="inventory")


def test_parse_names_every_bad_field_and_needs_reply_to() -> None:
    body = request_body()
    del body["completeBy"], body["order"]
    with pytest.raises(PoisonMessage) as e:
        parse_request(json.dumps(body).encode(), message_id="m", reply_to=None)
    assert {"completeBy", "order", "reply_to"} <= {p.split(":")[0] for p in str(e.value).split("; ")}


# --------------------------------------------------------------------------- the adapter

@pytest.mark.parametrize("raw, reply_to", [
    (b"definitely not json", "replies"),
    (json.dumps({"kind": "step", "orderId": "o-1"}).encode(), "replies"),
    (json.dumps(request_body(step="create-shipment", operation="ship")).encode(), "replies"),
    (json.dumps(request_body()).encode(), None),
])
def test_adapter_raises_poison_with_an_error_log_and_never_calls_the_remote(
        remote: Scripted, caplog: pytest.LogCaptureFixture, raw: bytes, reply_to: str | None) -> None:
    sender = RecordingSender()
    rt = runtime(remote, sender)
    with caplog.at_level(logging.INFO, logger="orders"), pytest.raises(PoisonMessage):
        process_message(AGENTS_BY_NAME["inventory"], sb_message(raw, message_id="poison-1", reply_to=reply_to), rt)
    assert remote.requests == [] and sender.replies == []
    [rec] = [r for r in caplog.records if r.name == "orders"]
    assert rec.levelno == logging.ERROR
    line = json.loads(rec.getMessage())
    assert line["event"] == "agent.poison" and line["messageId"] == "poison-1" and line["reason"]


def test_adapter_runs_a_good_message_end_to_end(remote: Scripted) -> None:
    remote.script = [(200, {"reservationId": "r-9"})]
    sender = RecordingSender()
    body = request_body()
    msg = sb_message(json.dumps(body).encode(), message_id=mid_for(body))
    result = process_message(AGENTS_BY_NAME["inventory"], msg, runtime(remote, sender))
    assert result is not None and result.outcome == "success"
    assert trace_id(remote.requests[0]["headers"]["traceparent"]) == trace_id(TRACEPARENT)
    assert sender.replies[0].correlation_id == mid_for(body)


def test_adapter_abandons_when_retries_are_exhausted_with_time_left(remote: Scripted) -> None:
    remote.script = [(503, {"error": "busy"})]
    sender = RecordingSender()
    policy = RetryPolicy(initial_backoff=0.01, max_backoff=0.02, jitter=0.0, max_attempts=3)
    body = request_body(seconds=30)
    with pytest.raises(TransientFailure, match="busy"):
        process_message(AGENTS_BY_NAME["inventory"], sb_message(json.dumps(body).encode(), message_id=mid_for(body)),
                        runtime(remote, sender, policy))
    assert len(remote.requests) == 3 and sender.replies == []


def test_adapter_expired_request_completes_quietly(remote: Scripted) -> None:
    sender = RecordingSender()
    body = request_body(complete_by=datetime.now(UTC) - timedelta(seconds=5))
    result = process_message(AGENTS_BY_NAME["inventory"], sb_message(json.dumps(body).encode()),
                             runtime(remote, sender))
    assert result is not None and result.status == "expired"
    assert remote.requests == [] and sender.replies == []


def test_one_function_per_agent_and_lane_with_queue_from_a_setting() -> None:
    from functions import agents
    from shared.core.workflows import AGENTS
    from shared.core.workflows.lanes import LANES

    app = func.FunctionApp()
    app.register_functions(agents.bp)
    fns = {f.get_function_name(): json.loads(f.get_function_json()) for f in app.get_functions()}
    assert set(fns) == {lane.function(f"agent_{a.name}") for a in AGENTS for lane in LANES}
    assert {"agent_inventory", "agent_inventory_high"} <= set(fns)
    for a in AGENTS:
        for lane in LANES:
            [binding] = fns[lane.function(f"agent_{a.name}")]["bindings"]
            assert binding["type"] == "serviceBusTrigger"
            assert binding["queueName"] == f"%{lane.setting(a.queue_setting)}%"
            assert binding["connection"] == "ServiceBusConnection"


# --------------------------------------------------------------------------- the fencing token

@pytest.mark.parametrize(("status", "payload", "outcome"), [(200, {"reservationId": "r-1"}, "success"),
                                                             (422, {"error": "out of stock"}, "error")])
def test_the_reply_echoes_the_requests_fencing_token_unchanged(remote: Scripted, status: int,
                                                               payload: dict[str, Any], outcome: str) -> None:
    remote.script = [(status, payload)]
    sender = RecordingSender()
    token = "opaque_TOKEN-" + "x" * 500
    result = runtime(remote, sender).handle(make_request(request_body(fence=token, order_id=uuid.uuid4().hex)))
    assert result.outcome == outcome
    [sent] = sender.replies
    assert json.loads(sent.encoded())["fence"] == token
    assert ReplyMessage.model_validate(json.loads(sent.encoded())).fence == token
    assert "fence" not in json.loads(remote.requests[0]["raw"])  # never sent to the remote


def test_a_request_without_a_token_gets_a_reply_without_one(remote: Scripted) -> None:
    remote.script = [(200, {"reservationId": "r-1"})]
    sender = RecordingSender()
    runtime(remote, sender).handle(make_request(request_body()))
    [sent] = sender.replies
    assert "fence" not in json.loads(sent.encoded())


@pytest.mark.parametrize("bad", ["", "x" * (MAX_FENCE_LENGTH + 1), 42])
def test_a_request_with_an_unusable_token_is_poison(bad: Any) -> None:
    with pytest.raises(PoisonMessage, match="fence"):
        make_request(request_body(fence=bad))
