"""OpenTelemetry: one trace per order with the right parents, and the metrics, in one process.

An order runs through the real submission, scheduler handlers, agent runtime (against a local
HTTP remote) and Supervisor, over the in-memory store and
bus; spans go to the in-memory exporter (tests/telemetry_support.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from shared.agent import AgentRuntime, RetryPolicy
from shared.api.operator import terminate_order
from shared.core.messages import OutMessage
from shared.observability import telemetry
from shared.observability.logs import log_event
from shared.scheduler import handle_reply, handle_schedule
from shared.supervisor import sweep
from tests import telemetry_support
from tests.unit.harness import WORKFLOW, CrashRuntime, make_runtime, post, state

REQUEST_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
RECEIVED: list[str | None] = []  # the traceparent header of every call the remote got


class _Remote(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        RECEIVED.append(self.headers.get("traceparent"))
        body = json.dumps({"ok": True, "traceparent": self.headers.get("traceparent")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def remote() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Remote)
    server.daemon_threads = True
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def agents_for(rt: CrashRuntime, base: str) -> dict[str, AgentRuntime]:
    """One real agent runtime per agent queue, on the runtime's clock and bus."""
    return {rt.config.agent_queue(s): AgentRuntime(s.agent, base, rt.bus, now=rt.clock, sleep=lambda _s: None,
                                                   policy=RetryPolicy(max_attempts=1))
            for s in WORKFLOW}


def deliver(rt: CrashRuntime, agents: dict[str, AgentRuntime]) -> int:
    """Deliver every message in the agent, replies and scheduler queues once; how many."""
    delivered = 0
    for queue, agent in agents.items():
        for m in rt.bus.take(queue):
            agent.handle_message(m.encoded(), message_id=m.message_id, reply_to=m.reply_to,
                                 application_properties=m.application_properties)
            delivered += 1
    for m in rt.bus.take(rt.config.queues["RepliesQueue"]):
        handle_reply(rt, m.encoded(), message_id=m.message_id, traceparent=m.application_properties.get("traceparent"))
        delivered += 1
    for m in rt.bus.take(rt.config.queues["SchedulerQueue"]):
        handle_schedule(rt, m.encoded(), message_id=m.message_id,
                        traceparent=m.application_properties.get("traceparent"))
        delivered += 1
    return delivered


def run_to_end(rt: CrashRuntime, agents: dict[str, AgentRuntime], order_id: str) -> dict[str, Any]:
    for _ in range(50):
        if not deliver(rt, agents):
            break
    return state(rt, order_id)


def by_id(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def parent_of(span: ReadableSpan, spans: dict[int, ReadableSpan]) -> ReadableSpan | None:
    return spans.get(span.parent.span_id) if span.parent is not None else None


def test_one_order_is_one_trace_with_the_right_parents(remote: str) -> None:
    telemetry.setup({})  # CLIENT spans: one per remote call
    rt = make_runtime()
    agents = agents_for(rt, remote)
    with telemetry_support.capture() as exporter:
        r = post(rt, headers={"traceparent": REQUEST_TRACEPARENT})
        assert r.status == 202
        final = run_to_end(rt, agents, r.body["orderId"])
    assert final["ProcessState"] == "Processed"
    spans = list(exporter.get_finished_spans())
    ids = by_id(spans)
    assert {s.context.trace_id for s in spans} == {int("0af7651916cd43dd8448eb211c80319c", 16)}

    [server] = [s for s in spans if s.kind is SpanKind.SERVER]
    assert server.parent is not None and server.parent.span_id == int("b7ad6b7169203331", 16)
    stored = rt.store.read_row(r.body["orderId"], "order")["Traceparent"]
    assert stored == telemetry.format_traceparent(server.context)

    agent_spans = [s for s in spans if s.kind is SpanKind.CONSUMER and s.name.startswith("process ")
                   and s.name.split()[1] in {"inventory", "payment", "shipping"}]
    assert [s.attributes["orders.step"] for s in sorted(agent_spans, key=lambda s: s.start_time or 0)] == [
        s.name for s in WORKFLOW]
    # a send makes no span: a message's consumer is a child of the span that sent it
    assert not [s for s in spans if s.kind is SpanKind.PRODUCER]
    for agent in agent_spans:
        dispatcher = parent_of(agent, ids)  # the submission, or the previous reply's handling
        assert dispatcher is not None and (dispatcher is server or dispatcher.name == "process replies")
        clients = [s for s in spans if s.kind is SpanKind.CLIENT and parent_of(s, ids) is agent]
        assert len(clients) == 1 and clients[0].attributes["http.status_code"] == 200
        assert clients[0].name == "POST" and clients[0].attributes["http.method"] == "POST"
        operation = {s.name: s.operation for s in WORKFLOW}[str(agent.attributes["orders.step"])]
        assert clients[0].attributes["http.url"] == f"{remote}/{operation}"
        # the remote got this span's own traceparent (the remote's spans are its children)
        assert telemetry.format_traceparent(clients[0].context) in RECEIVED
        [reply_handling] = [s for s in spans if s.name == "process replies" and parent_of(s, ids) is agent]
        assert reply_handling.kind is SpanKind.CONSUMER
    # one CLIENT span per remote call, and none of the SDKs' calls (no HTTP instrumentation)
    assert len([s for s in spans if s.kind is SpanKind.CLIENT]) == len(agent_spans)
    assert parent_of(agent_spans[0], ids) is server


def test_metrics_of_a_processed_order(remote: str) -> None:
    rt = make_runtime()
    agents = agents_for(rt, remote)
    before = {name: telemetry_support.counter_total(name) for name in ("orders.submitted", "orders.processed")}
    durations = {s.name: telemetry_support.histogram_count("orders.step.duration", step=s.name, outcome="done")
                 for s in WORKFLOW}
    r = post(rt)
    assert run_to_end(rt, agents, r.body["orderId"])["ProcessState"] == "Processed"
    assert telemetry_support.counter_total("orders.submitted") == before["orders.submitted"] + 1
    assert telemetry_support.counter_total("orders.processed") == before["orders.processed"] + 1
    for s in WORKFLOW:
        assert telemetry_support.histogram_count("orders.step.duration", step=s.name, outcome="done") == (
            durations[s.name] + 1)


def test_a_redrive_is_in_the_order_trace_and_linked_to_the_sweep(remote: str) -> None:
    rt = make_runtime()
    first = WORKFLOW[0]
    redrives = telemetry_support.counter_total("orders.redrives", step=first.name)
    sweeps = telemetry_support.histogram_count("orders.supervisor.sweep.duration")
    r = post(rt)
    order_trace = telemetry.trace_id(rt.store.read_row(r.body["orderId"], "order")["Traceparent"])
    rt.bus.take(rt.config.agent_queue(first))  # the request is lost
    rt.clock.advance(first.timeout_seconds + 1)
    with telemetry_support.capture() as exporter:
        assert sweep(rt).acted == {"redriven": 1}
    spans = list(exporter.get_finished_spans())
    [sweep_span] = [s for s in spans if s.name == "supervisor.sweep"]
    [redrive] = [s for s in spans if s.name == "supervisor.redrive"]
    assert format(redrive.context.trace_id, "032x") == order_trace != format(sweep_span.context.trace_id, "032x")
    assert [link.context.span_id for link in redrive.links] == [sweep_span.context.span_id]
    # the redrive's effects run in a span kept whatever the sampling ratio (the order is overdue)
    [kept] = [s for s in spans if s.name == "orders.redriven"]
    assert kept.parent is not None and kept.parent.span_id == redrive.context.span_id
    assert kept.attributes is not None and kept.attributes[telemetry.KEEP] is True
    # the redriven request carries the kept span's context, sampled whatever the ratio
    sent = [m for m in rt.bus.all() if m.body.get("orderId") == r.body["orderId"]]
    carried = [telemetry.span_context_of(m.application_properties.get("traceparent")) for m in sent]
    assert carried and all(c is not None and c.span_id == kept.context.span_id and c.trace_flags.sampled
                           for c in carried), [m.queue for m in sent]
    assert telemetry_support.counter_total("orders.redrives", step=first.name) == redrives + 1
    assert telemetry_support.histogram_count("orders.supervisor.sweep.duration") == sweeps + 1


def test_a_webhook_try_is_in_the_order_trace_and_counted_by_outcome(remote: str) -> None:
    """The try's CONSUMER span is a child of the ending that sent it, its POST a CLIENT span whose
    ``http.url`` leaves out the receiver's token and whose traceparent the receiver gets; a try that
    cannot connect is an ERROR span and a ``retry``; a copy of a try is counted nowhere."""
    import socket

    from shared.runtime.webhooks import handle_delivery
    from shared.settings import WebhookTarget

    telemetry.setup({})
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/hooks"
    rt = make_runtime(webhooks=True, webhook_schedule=(5.0,))
    rt.webhook = WebhookTarget(closed, b"tests: webhook signing key 32 b!")
    r = post(rt)
    order_trace = telemetry.trace_id(rt.store.read_row(r.body["orderId"], "order")["Traceparent"])
    assert run_to_end(rt, agents_for(rt, remote), r.body["orderId"])["ProcessState"] == "Processed"
    counts = {o: telemetry_support.counter_total("orders.webhooks", outcome=o) for o in ("delivered", "retry")}

    tried = []

    def try_once() -> tuple[str, list[ReadableSpan]]:
        [m] = rt.bus.take(rt.config.queues["WebhooksQueue"])
        tried.append(m)
        with telemetry_support.capture() as exporter:
            outcome = handle_delivery(rt, m.encoded(), message_id=m.message_id,
                                      traceparent=m.application_properties.get("traceparent"))
        return outcome, list(exporter.get_finished_spans())

    outcome, spans = try_once()
    assert outcome == "retry"
    [consumer] = [s for s in spans if s.kind is SpanKind.CONSUMER]
    [client] = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert consumer.name == "process webhooks" and format(consumer.context.trace_id, "032x") == order_trace
    assert client.parent is not None and client.parent.span_id == consumer.context.span_id
    assert client.status.status_code.name == "ERROR" and client.attributes["http.url"] == closed
    rt.clock.advance(6)  # the next try is due
    rt.webhook = WebhookTarget(f"{remote.replace('//', '//user:pass@')}/hooks?token=s3cret#x",
                               b"tests: webhook signing key 32 b!")
    outcome, spans = try_once()
    assert outcome == "delivered"
    [client] = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert client.attributes["http.url"] == f"{remote}/hooks" and client.attributes["http.status_code"] == 200
    assert telemetry.format_traceparent(client.context) in RECEIVED
    assert handle_delivery(rt, tried[0].encoded()) == "stale"  # a copy of the first try
    assert {o: telemetry_support.counter_total("orders.webhooks", outcome=o) for o in counts} == {
        "delivered": counts["delivered"] + 1, "retry": counts["retry"] + 1}


def test_an_operator_action_is_in_the_order_trace(remote: str) -> None:
    rt = make_runtime()
    r = post(rt)
    order_trace = telemetry.trace_id(rt.store.read_row(r.body["orderId"], "order")["Traceparent"])
    with telemetry_support.capture() as exporter:
        with telemetry.tracer().start_as_current_span("POST /api/orders/{id}/terminate") as request_span:
            result = terminate_order(rt, r.body["orderId"])
    assert result.status == 202, result.body
    [action] = [s for s in exporter.get_finished_spans() if s.name == "operator.terminate"]
    assert format(action.context.trace_id, "032x") == order_trace
    assert [link.context.span_id for link in action.links] == [request_span.get_span_context().span_id]


def test_log_lines_carry_the_current_span_ids() -> None:
    with telemetry.tracer().start_as_current_span("x") as span:
        record = log_event(20, "test.event", order_id="o")
    ctx = span.get_span_context()
    assert record["traceId"] == format(ctx.trace_id, "032x") and record["spanId"] == format(ctx.span_id, "016x")


def test_a_message_without_a_span_passes_the_order_context_on() -> None:
    sent: list[OutMessage] = []

    class Bus:
        def send(self, message: OutMessage) -> None:
            sent.append(message)

    msg = OutMessage(queue="q", body={"orderId": "o"}, message_id="m",
                     application_properties={"traceparent": REQUEST_TRACEPARENT, "kind": "k"})
    telemetry.send(Bus(), msg)
    [out] = sent
    assert out.application_properties["kind"] == "k"
    assert telemetry.trace_id(out.application_properties["traceparent"]) == "0af7651916cd43dd8448eb211c80319c"


def test_setup_picks_one_exporter() -> None:
    assert telemetry.setup({"PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY": "true"}) in ("worker", "already")
    assert telemetry.valid_traceparent("00-" + "0" * 32 + "-" + "1" * 16 + "-01") is None
    assert telemetry.valid_traceparent(f" {REQUEST_TRACEPARENT} ".encode()) == REQUEST_TRACEPARENT


SETUP_CHILD = r'''
import sys, urllib3
from shared.observability import telemetry
if sys.argv[1] == "provider":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
env = {"ORDERS_SPANS_DIR": sys.argv[2]} if sys.argv[1] == "file" else {}
mode = telemetry.setup(env)
from opentelemetry.instrumentation.urllib3 import URLLib3Instrumentor
wrapped = hasattr(urllib3.connectionpool.HTTPConnectionPool.urlopen, "__wrapped__")
print(mode, URLLib3Instrumentor().is_instrumented_by_opentelemetry and wrapped, telemetry._client_spans)
'''


@pytest.mark.parametrize(("case", "expected"), [("none", "api False False"), ("provider", "api False True"),
                                                ("file", "file False True")])
def test_client_spans_unless_no_span_could_be_recorded(case: str, expected: str, tmp_path: Any) -> None:
    """No SDK and no exporter: the remote calls' CLIENT spans would only be discarded no-ops, so they
    stay off; with a provider installed (a test's) or an exporter they are on. urllib3 is never
    instrumented (the SDKs' calls make no span: docs/cost.md). In a fresh process: setup() runs once
    per process and this suite's conftest installs providers."""
    import subprocess
    import sys

    from local.procs import REPO_ROOT

    out = subprocess.run([sys.executable, "-c", SETUP_CHILD, case, str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected
