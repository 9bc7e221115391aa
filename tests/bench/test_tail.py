"""The slowest orders of a phase, with what overlapped them."""

from bench.hostlog import Invocation
from bench.load import OrderTimes
from bench.tail import LONG_INVOCATION_MS, report_lines, slowest


def _order(oid: str, start: float, ms: float) -> OrderTimes:
    o = OrderTimes(oid, "latency", submitted=start, accepted=start + 0.010)
    o.events = {"received": start + 0.005, "processed": start + ms / 1000}
    o.processed = start + ms / 1000
    return o


def test_the_slowest_come_first_with_the_long_invocations_and_slow_reads_inside_them() -> None:
    orders = [_order("fast", 100.0, 50), _order("slow", 200.0, 250), _order("middle", 300.0, 120),
              OrderTimes("unfinished", "latency", submitted=400.0)]
    invocations = [
        Invocation(1, 200.230, "agent_shipping", "Succeeded", 200),  # from +30 to +230: inside "slow"
        Invocation(2, 200.100, "submit_order", "Succeeded", LONG_INVOCATION_MS - 1),  # short: left out
        Invocation(1, 250.0, "scheduler_replies", "Succeeded", 300),  # long, but in no slow order
    ]
    probe = [[200.1, 180.0], [350.0, 90.0]]
    rows = slowest(orders, invocations, probe, n=2)
    assert [r["order_id"] for r in rows] == ["slow", "middle"]
    assert rows[0]["ms"] == 250.0
    assert rows[0]["long_invocations"] == [{"function": "agent_shipping", "instance": 1, "started": 30.0, "ms": 200}]
    assert rows[0]["azurite_slow_reads"] == [{"started": 100.0, "ms": 180.0}]
    assert rows[1]["long_invocations"] == [] and rows[1]["azurite_slow_reads"] == []
    lines = report_lines(rows)
    assert "slow order 250.0 ms" in lines[0] and "agent_shipping@1 200 ms from +30.0" in lines[0]
    assert "azurite read 180.0 ms at +100.0" in lines[0]
    assert lines[1].endswith("beside it: nothing long")


def test_no_processed_orders() -> None:
    assert slowest([OrderTimes("a", "latency", submitted=1.0)], [], []) == []
