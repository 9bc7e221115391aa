"""The telemetry receiver (local.telemetry): it takes what Azure Monitor's exporter posts, answers as
the ingestion service does, and counts items and bytes by type; the stack sends the app's telemetry
to it with ``telemetry=True`` (``local.stack --telemetry``)."""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from local.telemetry import TelemetryReceiver, connection_string, origin_of


@pytest.fixture
def receiver() -> Iterator[TelemetryReceiver]:
    srv = TelemetryReceiver()
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def envelope(base_type: str, name: str = "x") -> dict[str, Any]:
    return {"name": f"Microsoft.ApplicationInsights.{name}", "time": "2026-12-06T00:00:00.000Z",
            "iKey": "00000000-0000-0000-0000-000000000000", "tags": {"ai.operation.id": "ab" * 16},
            "data": {"baseType": base_type, "baseData": {"ver": 2, "message": "hello"}}}


def test_a_track_request_is_answered_as_the_service_does_and_counted_by_type(receiver: TelemetryReceiver) -> None:
    items = [envelope("MessageData"), envelope("RequestData"), envelope("RemoteDependencyData"),
             envelope("MetricData"), envelope("SomethingElse")]
    body = gzip.compress(json.dumps(items).encode())
    r = requests.post(f"{receiver.url}/v2.1/track", data=body, timeout=10,
                      headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert (r.status_code, r.json()) == (200, {"itemsReceived": 5, "itemsAccepted": 5, "errors": []})
    ndjson = "\n".join(json.dumps(e) for e in (envelope("ExceptionData"), envelope("EventData"))).encode()
    assert requests.post(f"{receiver.url}/v2/track", data=ndjson, timeout=10).json()["itemsAccepted"] == 2
    got = requests.get(f"{receiver.url}/_items", timeout=10).json()["items"]
    assert [i["data"]["baseType"] for i in got] == [*(e["data"]["baseType"] for e in items), "ExceptionData",
                                                     "EventData"]
    assert got[0] == items[0]  # as received: name, time, tags, data
    stats = requests.get(f"{receiver.url}/_stats", timeout=10).json()
    size = len(json.dumps(items[0], separators=(",", ":")))
    assert stats["byType"]["message"] == {"items": 1, "bytes": size}
    assert {k: v["items"] for k, v in stats["byType"].items()} == {
        "request": 1, "dependency": 1, "message": 1, "exception": 1, "metric": 1, "event": 1, "other": 1}
    assert stats["items"] == 7 and stats["trackRequests"] == 2 and stats["wireBytes"] == len(body) + len(ndjson)
    assert stats["byOrigin"]["app"]["items"] == 7 and stats["byOrigin"]["host"]["items"] == 0
    assert requests.delete(f"{receiver.url}/_items", timeout=10).status_code == 200
    assert requests.get(f"{receiver.url}/_stats", timeout=10).json()["items"] == 0


def test_the_local_hosts_own_log_lines_are_told_apart(receiver: TelemetryReceiver) -> None:
    """In Azure the Functions host sends its own telemetry; here it runs in the worker and its lines
    (logger ``local.*``) come through the app's exporter: counted as ``host``, not ``app``."""
    host_line, app_line = envelope("MessageData"), envelope("MessageData")
    host_line["data"]["baseData"]["properties"] = {"logger_name": "local.host.app"}
    app_line["data"]["baseData"]["properties"] = {"logger_name": "orders"}
    requests.post(f"{receiver.url}/v2.1/track", json=[host_line, app_line, envelope("RequestData")], timeout=10)
    by_origin = receiver.received.stats()["byOrigin"]
    assert (by_origin["host"]["items"], by_origin["app"]["items"]) == (1, 2)
    assert by_origin["host"]["bytes"] == len(json.dumps(host_line, separators=(",", ":")))


@pytest.mark.parametrize("body, encoding, why", [
    (b"", None, "no envelope"),
    (b"[]", None, "no envelope"),
    (b"not json", None, "neither a JSON array"),
    (b'[{"name": "x"}]', None, "item 0 is not an envelope"),
    (b"\xff\xfe", None, "not UTF-8"),
    (b"[1, 2]", "gzip", "not"),  # says gzip, is not
])
def test_a_body_that_is_not_envelopes_is_400_and_nothing_is_kept(receiver: TelemetryReceiver, body: bytes,
                                                                  encoding: str | None, why: str) -> None:
    headers = {"Content-Encoding": encoding} if encoding else {}
    r = requests.post(f"{receiver.url}/v2.1/track", data=body, headers=headers, timeout=10)
    assert r.status_code == 400 and why in r.json()["errors"][0]["message"], r.text
    assert r.json()["itemsAccepted"] == 0 and receiver.received.stats()["items"] == 0


def test_live_metrics_are_told_no_one_watches_and_counted(receiver: TelemetryReceiver) -> None:
    r = requests.post(f"{receiver.url}/QuickPulseService.svc/ping", data=b"{}", timeout=10)
    assert r.status_code == 200 and r.headers["x-ms-qps-subscribed"] == "false"
    assert receiver.received.stats()["liveMetrics"] == {"calls": 1, "bytes": 2, "ping": 1, "post": 0}
    assert requests.post(f"{receiver.url}/elsewhere", data=b"{}", timeout=10).status_code == 404


def test_the_real_exporter_sends_its_spans_and_logs_here(receiver: TelemetryReceiver,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """azure-monitor-opentelemetry-exporter, as the app's distro uses it, pointed here by the
    connection string alone: a SERVER span is a request, a PRODUCER span a dependency, a log line a
    message, a logged exception an exception."""
    from azure.monitor.opentelemetry.exporter import AzureMonitorLogExporter, AzureMonitorTraceExporter
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    monkeypatch.setenv("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "true")  # nothing leaves the machine
    cs = connection_string(receiver.url)
    spans = TracerProvider()
    spans.add_span_processor(SimpleSpanProcessor(AzureMonitorTraceExporter(connection_string=cs,
                                                                           disable_offline_storage=True)))
    tracer = spans.get_tracer("test")
    with tracer.start_as_current_span("POST /api/orders", kind=SpanKind.SERVER), \
            tracer.start_as_current_span("send", kind=SpanKind.PRODUCER):
        pass
    logs = LoggerProvider()
    logs.add_log_record_processor(SimpleLogRecordProcessor(AzureMonitorLogExporter(connection_string=cs,
                                                                                   disable_offline_storage=True)))
    log = logging.getLogger("orders.telemetry-test")
    handler = LoggingHandler(logger_provider=logs)
    log.addHandler(handler)
    try:
        log.warning("an order line")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
    finally:
        log.removeHandler(handler)
        spans.shutdown()
        logs.shutdown()
    by_type = {k: v["items"] for k, v in receiver.received.stats()["byType"].items() if v["items"]}
    metrics = by_type.pop("metric", 0)  # (the exporter's own counts of what it sent, when it keeps them)
    assert by_type == {"request": 1, "dependency": 1, "message": 1, "exception": 1}, metrics
    names = {i["name"] for i in receiver.received.items() if i["data"]["baseType"] != "MetricData"}
    assert names == {f"Microsoft.ApplicationInsights.{n}" for n in ("Request", "RemoteDependency", "Message",
                                                                      "Exception")}


@pytest.mark.integration
def test_the_stack_sends_the_apps_telemetry_to_the_receiver_sampled_by_order(tmp_path: Path) -> None:
    """``Stack(telemetry=True)``: stack.json names the receiver, the app's connection string points
    at it, and an order's telemetry arrives there through the app's own exporter (the app's
    ``telemetry.setup``, as in Azure): all of it for an order the ratio keeps (its request, its log
    lines, its sends and remote calls, no SDK call), none for one the ratio drops.
    ``TelemetrySamplingRatio`` 0.5, the trace ids picked."""
    import random

    from local.stack import Stack
    from shared.observability.sampling import RATIO_SETTING
    from tests.e2e.test_trace import post_traced
    from tests.telemetry_support import sampled_trace_id

    rng = random.Random(1)
    kept, dropped = sampled_trace_id(0.5, True, rng), sampled_trace_id(0.5, False, rng)
    body = {"customerId": "c-1", "currency": "EUR", "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 9.99}]}
    # as the Bicep sets them for the host's own spans: the app's sampler is still its own
    host_sampler = {"OTEL_TRACES_SAMPLER": "microsoft.fixed_percentage", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    with Stack(tmp_path / "stack", persistent=False, instances=1, telemetry=True,
               settings_overrides={RATIO_SETTING: "0.5", **host_sampler}) as stack:
        described = json.loads(stack.stack_json_path.read_text())["telemetry"]
        assert described["baseUrl"] == stack.telemetry_url and stack.telemetry_url.startswith("http://127.0.0.1:")
        assert stack.settings["APPLICATIONINSIGHTS_CONNECTION_STRING"] == connection_string(stack.telemetry_url)
        orders = {trace: post_traced(stack, body, trace) for trace in (kept, dropped)}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                stack.get_order(o)["processState"] != "Processed" for o in orders.values()):
            time.sleep(0.5)

        def of(trace: str) -> dict[str, int]:
            items = requests.get(described["items"], timeout=10).json()["items"]
            kinds: dict[str, int] = {}
            for i in items:
                # the app's items (not the local host's own lines: in Azure the host exports none of
                # those) of the order's trace, and its log lines naming it (a client's reads of the
                # order are spans of their own, each sampled by its own trace id)
                if origin_of(i) == "app" and (i["tags"].get("ai.operation.id") == trace or (
                        i["data"]["baseType"] == "MessageData" and orders[trace] in json.dumps(i["data"]))):
                    kinds[i["data"]["baseType"]] = kinds.get(i["data"]["baseType"], 0) + 1
            return kinds

        # the exporter sends every few seconds: the last reply's items come after the order is Processed
        while of(kept).get("MessageData", 0) < 3 and time.monotonic() < deadline + 30:
            time.sleep(1)
        time.sleep(6)  # one more export interval: anything of the dropped order would be here by now
        assert of(kept).get("RequestData", 0) >= 4 and of(kept).get("MessageData", 0) >= 3, of(kept)
        assert of(dropped) == {}, of(dropped)
        # the kept order's dependencies are its remote calls: a send makes none, nor do the Azure
        # SDKs' calls (not the storage's, not Service Bus's: docs/cost.md)
        items = requests.get(described["items"], timeout=10).json()["items"]
        # the local host's own lines (Executing, Executed) stay on its console, as in Azure
        assert not [i for i in items if origin_of(i) == "host"]
        assert not [i for i in items if "invocation" in i["data"]["baseData"].get("properties", {})]
        dependencies = {i["data"]["baseData"]["name"] for i in items if i["tags"].get("ai.operation.id") == kept
                        and i["data"]["baseType"] == "RemoteDependencyData"}
        assert dependencies and all(n.startswith(("POST /inventory/", "POST /payment/", "POST /shipping/"))
                                    for n in dependencies), dependencies
    assert "telemetry" in stack.components and not stack.alive()["telemetry"]
