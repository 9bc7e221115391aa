"""In-memory OpenTelemetry providers for the tests (installed once per test process).

``install()`` sets the global tracer and meter providers of the SDK: spans go to an
``InMemorySpanExporter`` while a ``capture()`` is open (so that the rest of the suite does not pile
them up), metrics to an ``InMemoryMetricReader``. Every test then runs with real span ids, as the app
does in Azure with Azure Monitor configured.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_lock = threading.Lock()
_installed: tuple[InMemorySpanExporter, InMemoryMetricReader, _Gate] | None = None


class _Gate(SpanProcessor):
    """Exports ended spans only while a capture is open."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.open = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.open:
            self.exporter.export([span])


def install() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    global _installed
    with _lock:
        if _installed is None:
            exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
            gate = _Gate(exporter)
            provider = TracerProvider()
            provider.add_span_processor(gate)
            trace.set_tracer_provider(provider)
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            _installed = (exporter, reader, gate)
        return _installed[0], _installed[1]


@contextmanager
def capture() -> Iterator[InMemorySpanExporter]:
    """The spans ended inside the block (``exporter.get_finished_spans()``)."""
    exporter, _reader = install()
    assert _installed is not None
    gate = _installed[2]
    exporter.clear()
    gate.open += 1
    try:
        yield exporter
    finally:
        gate.open -= 1


def metric_points(name: str) -> list[Any]:
    """The current (cumulative) data points of the metric ``name``."""
    _exporter, reader = install()
    data = reader.get_metrics_data()
    points: list[Any] = []
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    points.extend(metric.data.data_points)
    return points


def counter_total(name: str, **attributes: Any) -> float:
    return sum(p.value for p in metric_points(name) if all(p.attributes.get(k) == v for k, v in attributes.items()))


def histogram_count(name: str, **attributes: Any) -> int:
    return sum(p.count for p in metric_points(name) if all(p.attributes.get(k) == v for k, v in attributes.items()))


def sampled_trace_id(ratio: float, kept: bool, rng: Any) -> str:
    """A 32-hex trace id that Application Insights' sampling algorithm keeps (``kept``) or drops at
    ``ratio`` (shared.observability.sampling decides an order by it)."""
    from azure.monitor.opentelemetry.exporter import ApplicationInsightsSampler
    from opentelemetry.sdk.trace.sampling import Decision

    by_id = ApplicationInsightsSampler(ratio)
    while True:
        t = rng.getrandbits(128)
        if (by_id.should_sample(None, t, "order").decision is Decision.RECORD_AND_SAMPLE) is kept:
            return format(t, "032x")
