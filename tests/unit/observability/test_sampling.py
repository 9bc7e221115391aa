"""Sampling by order (shared.observability.sampling): one decision per trace id at the order's root,
followed by every later span through its parent's flag, and kept from a failure on."""

from __future__ import annotations

import logging
import random

import pytest
from azure.monitor.opentelemetry.exporter import ApplicationInsightsSampler
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from shared.observability import sampling


def provider(ratio: float) -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    p = TracerProvider(sampler=sampling.OrderSampler(ratio))
    p.add_span_processor(SimpleSpanProcessor(exporter))
    return p.get_tracer("test"), exporter


def remote(trace_id: int, sampled: bool) -> Context:
    """The context a message (or a caller's header) carries."""
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return trace.set_span_in_context(NonRecordingSpan(SpanContext(trace_id, 0x1234, True, flags)), Context())


def trace_ids(ratio: float, want: bool, n: int = 1) -> list[int]:
    """Trace ids the ratio keeps (``want``) or drops, as Application Insights' algorithm decides."""
    by_id = ApplicationInsightsSampler(ratio)
    rng = random.Random(5)
    out: list[int] = []
    while len(out) < n:
        t = rng.getrandbits(128)
        if (by_id.should_sample(None, t, "x").decision is Decision.RECORD_AND_SAMPLE) is want:
            out.append(t)
    return out


@pytest.mark.parametrize("raw, ratio", [("", sampling.DEFAULT_RATIO), ("0.25", 0.25), ("0", 0.0), ("1", 1.0),
                                        (" 0.5 ", 0.5)])
def test_the_ratio_setting(raw: str, ratio: float) -> None:
    assert sampling.ratio_from({sampling.RATIO_SETTING: raw}) == ratio


@pytest.mark.parametrize("raw", ["ten percent", "1.5", "-0.1", "nan"])
def test_a_bad_ratio_is_refused_by_name_and_the_default_used(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert sampling.ratio_from({sampling.RATIO_SETTING: raw}) == sampling.DEFAULT_RATIO
    assert sampling.RATIO_SETTING in caplog.text and repr(raw) in caplog.text


def test_the_root_decides_by_trace_id_whatever_the_callers_flag() -> None:
    """The submission's SERVER span: Application Insights' decision for its trace id, over 400 ids,
    whether the caller's traceparent said sampled or not; the kept spans carry the sample rate."""
    tracer, exporter = provider(0.3)
    by_id = ApplicationInsightsSampler(0.3)
    rng = random.Random(1)
    expected = []
    for i in range(400):
        t = rng.getrandbits(128)
        expected.append(t)
        with tracer.start_as_current_span("POST /api/orders", context=remote(t, sampled=i % 2 == 0),
                                          kind=SpanKind.SERVER):
            pass
    kept = {s.context.trace_id for s in exporter.get_finished_spans()}
    assert kept == {t for t in expected if by_id.should_sample(None, t, "x").decision is Decision.RECORD_AND_SAMPLE}
    assert 60 < len(kept) < 180  # about 30%
    assert {(s.attributes or {}).get(sampling.SAMPLE_RATE) for s in exporter.get_finished_spans()} == {30.0}


def test_every_later_span_follows_the_orders_flag() -> None:
    """A CONSUMER span of a message (another process) follows the flag it carries, not a decision
    of its own: a sampled order's handling is kept at any ratio, an unsampled one's never."""
    tracer, exporter = provider(0.5)
    [dropped_by_ratio] = trace_ids(0.5, want=False)
    [kept_by_ratio] = trace_ids(0.5, want=True)
    for t, flag in ((kept_by_ratio, True), (dropped_by_ratio, False)):
        with tracer.start_as_current_span("process replies", context=remote(t, flag), kind=SpanKind.CONSUMER):
            with tracer.start_as_current_span("send replies", kind=SpanKind.PRODUCER):
                pass
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["process replies", "send replies"]
    assert {s.context.trace_id for s in spans} == {kept_by_ratio}


def test_a_failure_keeps_the_order_from_there_on() -> None:
    """In an order the ratio drops: its handling is not recorded, the span marked ``orders.keep``
    (a failure's effects) is, with sample rate 100 (it stands for itself), and so is everything
    after it: the message sent inside, and the next process's handling of that message."""
    tracer, exporter = provider(0.0)
    [t] = trace_ids(0.5, want=False)
    with tracer.start_as_current_span("process replies", context=remote(t, False), kind=SpanKind.CONSUMER):
        with tracer.start_as_current_span("orders.compensating", attributes={sampling.KEEP: True}):
            with tracer.start_as_current_span("send agent-inventory", kind=SpanKind.PRODUCER) as send:
                carried = send.get_span_context()
    next_process = trace.set_span_in_context(NonRecordingSpan(SpanContext(
        carried.trace_id, carried.span_id, True, carried.trace_flags)), Context())
    with tracer.start_as_current_span("process inventory", context=next_process, kind=SpanKind.CONSUMER):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"orders.compensating", "send agent-inventory", "process inventory"}
    assert all((s.attributes or {}).get(sampling.SAMPLE_RATE) == 100.0 for s in spans.values())
    parent = spans["process inventory"].parent
    carried_on = spans["send agent-inventory"].context
    assert parent is not None and carried_on is not None and parent.span_id == carried_on.span_id


@pytest.mark.parametrize("ratio, recorded", [(1.0, True), (0.0, False)])
def test_the_ends_of_the_range(ratio: float, recorded: bool) -> None:
    tracer, exporter = provider(ratio)
    for t in trace_ids(0.5, want=True, n=5) + trace_ids(0.5, want=False, n=5):
        with tracer.start_as_current_span("POST /api/orders", context=remote(t, True), kind=SpanKind.SERVER):
            with tracer.start_as_current_span("send scheduler", kind=SpanKind.PRODUCER):
                pass
    assert len(exporter.get_finished_spans()) == (20 if recorded else 0)


def test_log_lines_follow_their_span_except_warnings_and_errors() -> None:
    tracer, _exporter = provider(0.5)
    [unsampled] = trace_ids(0.5, want=False)
    [sampled] = trace_ids(0.5, want=True)
    keep = sampling.LogFilter()

    def passes(level: int) -> bool:
        return keep.filter(logging.LogRecord("orders", level, __file__, 1, "{}", None, None))

    assert passes(logging.INFO)  # outside any trace (a sweep's summary)
    with tracer.start_as_current_span("POST /api/orders", context=remote(unsampled, True), kind=SpanKind.SERVER):
        assert [passes(lv) for lv in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)] == [
            False, False, True, True]
    with tracer.start_as_current_span("POST /api/orders", context=remote(sampled, False), kind=SpanKind.SERVER):
        assert passes(logging.INFO) and passes(logging.DEBUG)


def test_a_line_about_an_order_outside_its_flow_is_written_in_the_orders_context() -> None:
    """A Supervisor's line about an order (no span of the order current): the exporter's handler sees
    the order's stored context, so the line goes with the order's telemetry, or not, as the order's."""
    from shared.observability.logs import log, log_event

    stored = f"00-{'ab' * 16}-{'cd' * 8}-00"  # an order the ratio dropped
    seen: list[tuple[SpanContext, bool]] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((trace.get_current_span().get_span_context(), sampling.LogFilter().filter(record)))

    handler = Handler(logging.DEBUG)
    log.addHandler(handler)
    old = log.level
    log.setLevel(logging.DEBUG)
    try:
        log_event(logging.INFO, "supervisor.note", order_id="o-1", traceparent=stored)
        log_event(logging.WARNING, "supervisor.redrive", order_id="o-1", traceparent=stored)
    finally:
        log.removeHandler(handler)
        log.setLevel(old)
    assert [(format(c.trace_id, "032x"), c.span_id, kept) for c, kept in seen] == [
        ("ab" * 16, int("cd" * 8, 16), False), ("ab" * 16, int("cd" * 8, 16), True)]
