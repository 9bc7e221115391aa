"""Telemetry sampling by order: an order's telemetry is kept whole or not at all, and kept from
its failure on whatever the ratio.

* **One decision per order.** The submission's SERVER span decides by its trace id, with the
  algorithm of the Application Insights SDKs (``ApplicationInsightsSampler``: a hash of the trace
  id against ``TelemetrySamplingRatio``), whatever the caller's ``traceparent`` flag says. Every
  later span of the order follows its parent's sampled flag, which the order's messages and its
  stored ``traceparent`` carry: every process decides the same without asking anyone.
* **Kept from the failure on.** A span started with the attribute ``orders.keep`` (``kept()``) is
  recorded whatever the ratio; its flag is then "sampled", so everything after it in the order's
  flow (the compensations, the redrives, the replies) is kept too. The app starts one where a
  decision fails, holds or compensates an order, and for every redrive and operator action.
* **Logs follow their span** (``LogFilter``, on the exporter's handler only): a line at INFO or
  below inside an unsampled span is not exported; warnings and errors always are, and so is a line
  outside any trace (a sweep's summary). ``shared.observability.logs`` writes a line about an
  order outside its flow in the order's stored context, so the line follows the order's decision.
* **Metrics are never sampled** (they do not go through the sampler).

The sample rate goes with each kept span as ``_MS.sampleRate`` (the Application Insights
ingestion field its item counts are multiplied back from): the ratio's, or 100 for a span kept
only because its order failed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

RATIO_SETTING = "TelemetrySamplingRatio"
DEFAULT_RATIO = 0.05
KEEP = "orders.keep"  # a span attribute: record this span (and what follows it) whatever the ratio
SAMPLE_RATE = "_MS.sampleRate"  # Application Insights: the percentage a kept item stands for

log = logging.getLogger(__name__)


def ratio_from(environ: Mapping[str, str]) -> float:
    """``TelemetrySamplingRatio`` (0 to 1; unset: ``DEFAULT_RATIO``). Anything else is refused with
    an error line naming the setting, and the default is used: a typo costs no telemetry."""
    raw = environ.get(RATIO_SETTING, "").strip()
    if not raw:
        return DEFAULT_RATIO
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        log.error("%s=%r is not a number from 0 to 1: %s used", RATIO_SETTING, raw, DEFAULT_RATIO)
        return DEFAULT_RATIO
    return ratio


class OrderSampler(Sampler):
    """The decision above: by trace id at the order's root, by the parent's flag after, kept on
    ``orders.keep``."""

    def __init__(self, ratio: float) -> None:
        from azure.monitor.opentelemetry.exporter import ApplicationInsightsSampler

        self.ratio = ratio
        self._by_trace_id = ApplicationInsightsSampler(sampling_ratio=ratio)

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: TraceState | None = None) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        by_id = self._by_trace_id.should_sample(parent_context, trace_id, name, kind, attributes, links)
        by_ratio = by_id.decision is Decision.RECORD_AND_SAMPLE
        if attributes and attributes.get(KEEP):
            keep = True
        elif parent.is_valid and kind is not SpanKind.SERVER:
            keep = bool(parent.trace_flags.sampled)
        else:
            keep = by_ratio
        out: dict[str, Any] = dict(by_id.attributes or {})
        out[SAMPLE_RATE] = self.ratio * 100 if by_ratio else 100.0
        return SamplingResult(Decision.RECORD_AND_SAMPLE if keep else Decision.DROP, out,
                              parent.trace_state if parent.is_valid else None)

    def get_description(self) -> str:
        return f"OrderSampler({self.ratio})"


class LogFilter(logging.Filter):
    """For the exporter's handler: INFO and below only inside a sampled span (or outside any)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        span_context = trace.get_current_span().get_span_context()
        return not span_context.is_valid or bool(span_context.trace_flags.sampled)
