"""OpenTelemetry for the app: set up once per worker; the order's trace; spans at the boundaries.

One trace per order. The submission's HTTP server span starts it (a child of the request's
``traceparent`` header, when one came); its W3C ``traceparent`` is stored on the order row and
every message for the order carries one in its application properties (the OpenTelemetry
TraceContext propagator writes and reads it). Spans are made at the boundaries only, never in the
pure core (``shared.core.statemachine``):

* ``server_span``: the submission (SERVER);
* ``send``: every message sent carries the order's context (the current span's when in the order's
  trace, else the order's stored one), and makes no span: a step's consumer span is a child of the
  span that sent its message;
* ``consumer_span``: an agent invocation, a schedule notice's or a reply's handling (CONSUMER);
* ``client_span``: the agents' remote HTTP call (CLIENT), made here rather than by an HTTP
  instrumentation: the same span and attributes for ~100-125 µs less CPU per call (measured).
  The Azure SDKs' calls (Table Storage, Service Bus) make no span: no HTTP instrumentation and no
  azure-core tracing. They were two thirds of a kept order's telemetry bytes (docs/cost.md, "Telemetry");
  their latency is in each step's duration (``orders.step.duration``) and in the request spans;
* ``order_span``: supervisor redrives and operator actions, in the order's trace, linked to the
  span that ran them (the sweep, the operator's request).

Without an SDK (no connection string, no test providers) the API is a no-op that still passes
the incoming context on, so the order's trace id still travels with its messages and logs.
Metrics: ``shared.observability.metrics``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.core.messages import OutMessage
from shared.core.once import once
from shared.observability import sampling

TRACER_NAME = "orders"
KEEP = sampling.KEEP
CONNECTION_STRING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
SPANS_DIR = "ORDERS_SPANS_DIR"  # local runs and tests: each process writes its spans to a JSON-lines file here
WORKER_TELEMETRY = "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY"  # the worker configures Azure Monitor itself
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
# the distro's instrumentations the app turns off (its names): the SDKs' calls and HTTP libraries
UNTRACED = ("azure_sdk", "requests", "urllib", "urllib3", "django", "fastapi", "flask", "psycopg2")

_propagator = TraceContextTextMapPropagator()
_setup_lock = threading.Lock()
_setup_done = False
_client_spans = False  # setup() decided: client_span makes spans (off when none could be recorded)


class _Sender(Protocol):
    def send(self, message: OutMessage) -> None: ...


@once
def tracer() -> trace.Tracer:
    """The app's tracer, got once: the SDK makes a new Tracer per ``get_tracer`` call (~12 µs, every
    span). Got before a provider is set, it is the API's proxy, which follows the provider set later."""
    return trace.get_tracer(TRACER_NAME)


# ----------------------------------------------------------------------------- setup


def setup(environ: Mapping[str, str] | None = None) -> str:
    """Configure OpenTelemetry once per worker; returns what was done.

    ``azure-monitor``: APPLICATIONINSIGHTS_CONNECTION_STRING is set and the worker's own
    PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY is not (both would export everything twice); the
    exporter authenticates with the managed identity of APPLICATIONINSIGHTS_AUTHENTICATION_STRING.
    ``worker``: the Python worker configures it. ``file``: ORDERS_SPANS_DIR is set (the local
    stack's end-to-end trace test): an SDK provider writes this process's spans there. ``api``: no
    SDK (a no-op unless a test installed providers). The remote calls' CLIENT spans
    (``client_span``) are on in every case but one: ``api`` with no SDK tracer provider installed,
    where each would be a discarded no-op (the remote calls carry their ``traceparent`` header
    themselves: ``shared.agent.remote``).
    """
    global _setup_done, _client_spans
    env = os.environ if environ is None else environ
    with _setup_lock:
        if _setup_done:
            return "already"
        mode = "api"
        if env.get(WORKER_TELEMETRY, "").lower() in ("1", "true"):
            mode = "worker"
        elif env.get(CONNECTION_STRING):
            _export_to_azure_monitor(env[CONNECTION_STRING], sampling.ratio_from(env))
            mode = "azure-monitor"
        elif env.get(SPANS_DIR):
            _export_to_file(env[SPANS_DIR], sampling.ratio_from(env))
            mode = "file"
        if mode != "api" or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            _client_spans = True
        _setup_done = True
        return mode


def _export_to_azure_monitor(connection_string: str, ratio: float) -> None:
    """Azure Monitor's distro for logs, metrics and the instrumentations; the traces' provider is
    the app's, with its sampler by order (``shared.observability.sampling``) in place of the distro's
    default (5 spans a second per process, kept by the clock, not by order).

    * Live metrics off: the distro feeds it from its own span processor, which a provider of the
      app's cannot add (a private name); it is not billed, but would cost CPU on every item and a
      request a second while watched. docs/cost.md, "Telemetry".
    * No HTTP instrumentation and no Azure SDK tracing (the module's docstring says why).
    * The exporter's log handler (on the root logger) gets the sampling's ``LogFilter``.
    * The exporter authenticates as the distro's does: with APPLICATIONINSIGHTS_AUTHENTICATION_STRING
      when it is set."""
    from azure.monitor.opentelemetry import configure_azure_monitor
    from azure.monitor.opentelemetry.exporter import AzureMonitorTraceExporter
    from opentelemetry._logs import get_logger_provider
    from opentelemetry.instrumentation.logging.handler import LoggingHandler
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # The distro's documented switch for its traces' provider: OTEL_TRACES_EXPORTER=none (its keyword
    # disable_tracing is overwritten by that variable's default, azure-monitor-opentelemetry 1.8.11,
    # _utils/configurations.py). Set for the call only, under the setup lock.
    previous = os.environ.get(TRACES_EXPORTER)
    os.environ[TRACES_EXPORTER] = "none"
    try:
        configure_azure_monitor(connection_string=connection_string, enable_live_metrics=False,
                                instrumentation_options={name: {"enabled": False} for name in UNTRACED})
    finally:
        if previous is None:
            os.environ.pop(TRACES_EXPORTER, None)
        else:
            os.environ[TRACES_EXPORTER] = previous
    resource = getattr(get_logger_provider(), "resource", None)  # the distro's, Azure's detectors included
    provider = TracerProvider(sampler=sampling.OrderSampler(ratio), resource=resource)
    provider.add_span_processor(BatchSpanProcessor(AzureMonitorTraceExporter(connection_string=connection_string)))
    trace.set_tracer_provider(provider)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, LoggingHandler):
            handler.addFilter(sampling.LogFilter())


def _export_to_file(directory: str, ratio: float) -> None:
    """An SDK tracer provider that appends every sampled span, when it ends, as one JSON line to a file
    of this process."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    path = os.path.join(directory, f"spans-{os.getpid()}.jsonl")
    lock = threading.Lock()

    class _JsonLines(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            lines = "".join(json.dumps(_span_record(s)) + "\n" for s in spans)
            with lock, open(path, "a", encoding="utf-8") as f:
                f.write(lines)
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=sampling.OrderSampler(ratio))
    provider.add_span_processor(SimpleSpanProcessor(_JsonLines()))
    trace.set_tracer_provider(provider)


def _span_record(span: Any) -> dict[str, Any]:
    return {"name": span.name, "kind": span.kind.name, "traceId": trace.format_trace_id(span.context.trace_id),
            "spanId": trace.format_span_id(span.context.span_id),
            "parentId": trace.format_span_id(span.parent.span_id) if span.parent is not None else None,
            "links": [trace.format_span_id(link.context.span_id) for link in span.links],
            "attributes": dict(span.attributes or {}), "pid": os.getpid()}


# ----------------------------------------------------------------------------- context


def context_of(traceparent: str | None, tracestate: str | None = None) -> otel_context.Context:
    """The OpenTelemetry context a W3C ``traceparent`` (and ``tracestate``) names (empty if invalid)."""
    carrier = {"traceparent": traceparent} if traceparent else {}
    if traceparent and tracestate:
        carrier["tracestate"] = tracestate
    return _propagator.extract(carrier, context=otel_context.Context())


@functools.lru_cache(maxsize=4096)
def span_context_of(traceparent: str | None) -> SpanContext | None:
    """The span context a W3C ``traceparent`` names, None if invalid. Cached: an order's
    traceparent is parsed for each of its log lines and sends, and a SpanContext is immutable."""
    span_context = trace.get_current_span(context_of(traceparent)).get_span_context()
    return span_context if span_context.is_valid else None


def valid_traceparent(value: object) -> str | None:
    """``value`` as a valid W3C traceparent (normalised), or None."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    span_context = span_context_of(value.strip())
    return format_traceparent(span_context) if span_context is not None else None


def format_traceparent(span_context: SpanContext) -> str:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(span_context)))
    return carrier["traceparent"]


def trace_id(traceparent: str | None) -> str | None:
    """The 32-hex trace id of a valid traceparent, else None."""
    span_context = span_context_of(traceparent)
    return trace.format_trace_id(span_context.trace_id) if span_context is not None else None


def current_ids() -> tuple[str, str] | None:
    """(traceId, spanId) of the current span, for log lines; None outside any trace."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return trace.format_trace_id(span_context.trace_id), trace.format_span_id(span_context.span_id)


def current_traceparent() -> str | None:
    span_context = trace.get_current_span().get_span_context()
    return format_traceparent(span_context) if span_context.is_valid else None


@contextmanager
def in_order(traceparent: str | None) -> Iterator[None]:
    """The context of the span ``traceparent`` names (an order's stored one) made current, for a
    log line about the order written outside its flow."""
    span_context = span_context_of(traceparent)
    if span_context is None:
        yield
        return
    with trace.use_span(NonRecordingSpan(span_context)):
        yield


def inject(carrier: dict[str, str]) -> dict[str, str]:
    """Write the current context (``traceparent``, ``tracestate``) into ``carrier``; returns it."""
    _propagator.inject(carrier)
    return carrier


def _new_root() -> otel_context.Context:
    """A fresh remote parent: only when there is no SDK to start a trace (the API would not)."""
    span_context = SpanContext(trace_id=random.getrandbits(128) or 1, span_id=random.getrandbits(64) or 1,
                               is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(span_context), otel_context.Context())


def _links_to_current(parent: otel_context.Context) -> list[Link]:
    """A link to the current span when it is in another trace than ``parent``."""
    current = trace.get_current_span().get_span_context()
    wanted = trace.get_current_span(parent).get_span_context()
    if current.is_valid and (not wanted.is_valid or current.trace_id != wanted.trace_id):
        return [Link(current)]
    return []


# ----------------------------------------------------------------------------- spans


@contextmanager
def server_span(name: str, headers: Mapping[str, str], **attributes: Any) -> Iterator[Span]:
    """An HTTP server span, a child of the request's ``traceparent`` when it sent a valid one."""
    lowered = {k.lower(): v for k, v in headers.items()}
    parent = context_of(lowered.get("traceparent"), lowered.get("tracestate"))
    with tracer().start_as_current_span(name, context=parent, kind=SpanKind.SERVER,
                                        attributes=_clean(attributes)) as span:
        if span.get_span_context().is_valid:
            yield span
            return
    with tracer().start_as_current_span(name, context=_new_root(), kind=SpanKind.SERVER) as span:
        yield span


@contextmanager
def consumer_span(name: str, traceparent: str | None, tracestate: str | None = None,
                  **attributes: Any) -> Iterator[Span]:
    """A message's handling (CONSUMER): a child of the context the message carries."""
    parent = context_of(traceparent, tracestate)
    with tracer().start_as_current_span(name, context=parent, kind=SpanKind.CONSUMER,
                                        links=_links_to_current(parent), attributes=_clean(attributes)) as span:
        yield span


class ClientCall:
    """One outgoing HTTP call in its CLIENT span: the headers to send (with the span's ``traceparent``)."""

    __slots__ = ("headers", "span")

    def __init__(self, headers: Mapping[str, str], span: Span | None) -> None:
        self.headers = headers
        self.span = span

    def answered(self, status: int) -> None:
        """The response's status: an attribute, and an error status from 400 on (as the instrumentations do)."""
        if self.span is not None:
            self.span.set_attribute("http.status_code", status)
            if status >= 400:
                self.span.set_status(trace.StatusCode.ERROR)


@contextmanager
def client_span(method: str, url: str, headers: Mapping[str, str]) -> Iterator[ClientCall]:
    """A CLIENT span ``method`` with the HTTP instrumentations' attributes (``http.method``, ``http.url``,
    then ``http.status_code``), a child of the current span; an exception in it is recorded. Its
    ``traceparent`` goes in a copy of ``headers``; any HTTP instrumentation is suppressed inside. Off (the
    headers as given, no span) when ``setup`` found that no span could be recorded."""
    if not _client_spans:
        yield ClientCall(headers, None)
        return
    from opentelemetry.instrumentation.utils import suppress_http_instrumentation

    with tracer().start_as_current_span(method, kind=SpanKind.CLIENT,
                                        attributes={"http.method": method, "http.url": url}) as span:
        call = ClientCall(inject(dict(headers)), span)
        with suppress_http_instrumentation():
            yield call


@contextmanager
def order_span(name: str, traceparent: str | None, **attributes: Any) -> Iterator[Span]:
    """An action on an order from outside its flow (a redrive, an operator's action): in the
    order's trace, linked to the span that ran it (recorded whatever the sampling ratio with the
    attribute ``KEEP``)."""
    parent = context_of(traceparent)
    if not trace.get_current_span(parent).get_span_context().is_valid:
        parent = otel_context.get_current()
    with tracer().start_as_current_span(name, context=parent, kind=SpanKind.INTERNAL,
                                        links=_links_to_current(parent), attributes=_clean(attributes)) as span:
        yield span


@contextmanager
def kept(verdict: str, keep: bool = True) -> Iterator[None]:
    """Where a decision fails, holds or compensates an order, or redrives it (``keep``): its effects
    run in a span recorded whatever the sampling ratio, a child of the current one, so the order's
    telemetry is kept from here on: the messages sent inside carry its sampled flag
    (``shared.observability.sampling``). Otherwise nothing is added."""
    if not keep:
        yield
        return
    with tracer().start_as_current_span(f"orders.{verdict}", kind=SpanKind.INTERNAL,
                                        attributes={sampling.KEEP: True, "orders.verdict": verdict}):
        yield


def send(bus: _Sender, message: OutMessage) -> None:
    """Send ``message`` carrying the order's context, with no span of its own.

    The context is the current span's when that is in the order's trace (a submission, an agent's
    or a reply's handling, a redrive, an operator action: the consumer's span is its child), else
    the one the message was built with (the order's stored ``traceparent``), else the current
    span's (a breaker alert). The sampled flag travels with it. A send makes no span: a PRODUCER
    span per send was a quarter of a kept order's telemetry (6 of its 24 items, docs/cost.md) and
    told an operator only the send's duration, which the invoking span and ``orders.step.duration``
    include; a failed send raises into the invoking span, which records it."""
    stored = message.application_properties.get("traceparent")
    wanted = span_context_of(stored)
    current = trace.get_current_span().get_span_context()
    properties = {k: v for k, v in message.application_properties.items() if k not in ("traceparent", "tracestate")}
    if current.is_valid and (wanted is None or current.trace_id == wanted.trace_id):
        carried = inject({})
    elif stored:
        carried = {k: v for k, v in message.application_properties.items() if k in ("traceparent", "tracestate")}
    else:
        carried = {}
    bus.send(replace(message, application_properties={**properties, **carried}))


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if isinstance(v, (str, bool, int, float))}
