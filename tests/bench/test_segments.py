"""The latency legs: consecutive status stamps of each processed order."""

from bench.load import OrderTimes
from bench.segments import legs, report_line, summarize


def _order(oid: str, offset: float, processed: bool = True) -> OrderTimes:
    o = OrderTimes(oid, "latency", submitted=100.0 + offset, accepted=100.020 + offset)
    o.events = {"received": 100.015 + offset, "step-done:pay": 100.050 + offset, "step-done:ship": 100.090 + offset}
    if processed:
        o.events["processed"] = 100.091 + offset
        o.processed = 100.091 + offset
    return o


def test_legs_follow_the_stamps_in_time_order() -> None:
    got = [(name, round(s * 1000, 3)) for name, s in legs(_order("a", 0))]
    # the status message came before the 202: the stamps are sorted, the 202 leg stays first
    assert got == [("post→202", 20.0), ("202→received", -5.0), ("received→step-done:pay", 35.0),
                   ("step-done:pay→step-done:ship", 40.0), ("step-done:ship→processed", 1.0)]


def test_summary_counts_processed_orders_only() -> None:
    out = summarize([_order("a", 0), _order("b", 5), _order("c", 9, processed=False)])
    assert out["received→step-done:pay"] == {"n": 2, "p50_ms": 35.0, "p99_ms": 35.0}
    assert "step-done:ship→processed" in out
    line = report_line(out)
    assert line.startswith("latency legs (p50 ms): ") and "step-done:pay→step-done:ship 40.0" in line


def test_no_orders() -> None:
    assert summarize([]) == {}
    assert report_line({}) == "latency legs: none"
