"""bench.azure_cost: Flex Consumption's billing rule, and the meters' arithmetic from counted units
and bench/prices.json (no machine figure: the inputs are given)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bench import azure_cost
from bench.azure_cost import flex_billed_seconds


@dataclass
class Inv:
    instance: int
    at: float  # the end, as bench.hostlog gives it
    duration_ms: int


@pytest.mark.parametrize(("intervals", "busy", "billed", "periods"), [
    ([], 0.0, 0.0, 0),
    ([(0.0, 0.05)], 0.05, 1.0, 1),  # a short execution alone: the 1,000 ms minimum
    ([(0.0, 1.23)], 1.23, 1.3, 1),  # past it: rounded up to the next 100 ms
    ([(0.0, 0.6), (0.5, 1.45)], 1.45, 1.5, 1),  # overlapping executions: one period, billed once
    ([(0.0, 0.6), (0.6, 0.7)], 0.7, 1.0, 1),  # touching: one period
    ([(0.0, 0.1), (5.0, 5.1), (2.0, 2.2)], 0.4, 3.0, 3),  # apart: each its own minimum
])
def test_the_flex_rule(intervals: list[tuple[float, float]], busy: float, billed: float, periods: int) -> None:
    b, bl, p = flex_billed_seconds(intervals)
    assert (round(b, 6), round(bl, 6), p) == (busy, billed, periods)


def test_the_functions_meter_counts_each_instance_apart_and_only_the_window() -> None:
    price = azure_cost.prices()["functions_flex"]
    invocations = [Inv(0, 10.5, 500), Inv(0, 10.8, 500), Inv(1, 10.5, 500),  # 0: one period 10.0-10.8
                   Inv(0, 30.0, 100)]  # outside the window
    m = azure_cost.functions_meter(invocations, 9.0, 20.0, orders=2, price=price)
    assert m["instances"] == 2 and m["activity_periods"] == 2
    assert m["per_order"]["executions"] == 1.5
    assert m["per_order"]["billed_instance_seconds"] == 1.0  # (1.0 + 1.0) s over 2 orders
    assert m["per_order"]["gb_seconds"] == 2.0  # 2,048 MB
    assert m["usd_per_million_orders"] == round(1.5 * 0.40 + 2.0 * 0.000026 * 1e6, 2)


def test_the_total_is_the_meters_and_the_targets_say_whether_they_are_met() -> None:
    po = {"orders": 10,
          "bus": {"azure_ops_per_order": 20.0, "work_queue_messages_per_order": 12.0, "settlements_per_order": 6.0,
                  "management_ops_per_order": 0.0, "status_sends_per_order": 2.0, "per_queue_per_order": {}},
          "table": {"requests_per_order": 10.0, "entities_per_order": 20.0}}
    telemetry = {"app": {"items": 20, "bytes": 20_000}, "host_local": {"items": 0, "bytes": 0},
                 "request": {"items": 10, "bytes": 8_000}, "orders_sampled": 1, "by_type_bytes": {"request": 8_000}}
    cost = azure_cost.azure_cost(10, [Inv(0, 1.0, 100)], 0.0, 5.0, po, telemetry, 0.05, "saturation")
    assert cost is not None
    m = cost["meters"]
    assert cost["total_usd_per_million_orders"] == round(sum(v["usd_per_million_orders"] for v in m.values()), 2)
    assert m["servicebus"]["usd_per_million_orders"] == 20 * 0.50
    assert m["tables"]["usd_per_million_orders"] == round(10 * 0.00036 * 100, 4)
    # the app's 2,000 bytes an order, and the host's estimate: 0.1 executions x 800 bytes x 0.05
    assert m["telemetry"]["app_bytes_per_order"] == 2000 and m["telemetry"]["host_bytes_per_order_estimate"] == 4
    assert m["telemetry"]["usd_per_million_orders"] == round(2004 / 1e9 * 2.30 * 1e6, 2)
    # the default order names no statusQueue: the run's 2 status sends an order are left out of its figure
    assert cost["status_sends_usd_per_million_orders"] == 2 * 0.50
    assert cost["default_order_usd_per_million_orders"] == round(cost["total_usd_per_million_orders"] - 1.0, 2)
    assert cost["telemetry_share"] == round(
        m["telemetry"]["usd_per_million_orders"] / cost["default_order_usd_per_million_orders"], 3)
    assert [t["met"] for t in cost["targets"]] == [cost["default_order_usd_per_million_orders"] <= 20,
                                                   cost["telemetry_share"] <= 0.25]
    assert cost["targets"][0]["value"] == f"${cost['default_order_usd_per_million_orders']}"
    assert cost["total_usd_per_million_orders_by_service_bus_tier"]["13M-100M"] == round(
        cost["total_usd_per_million_orders"] + 20 * (0.80 - 0.50), 2)
    assert cost["default_order_usd_per_million_orders_by_service_bus_tier"]["13M-100M"] == round(
        cost["default_order_usd_per_million_orders"] + 18 * (0.80 - 0.50), 2)


def test_every_price_names_its_source_and_the_date() -> None:
    p = azure_cost.prices()
    assert p["read_on"] and p["region"]
    for meter in ("functions_flex", "service_bus_standard", "table_storage", "log_analytics"):
        assert p[meter]["sources"] and p[meter]["rule"], meter
    assert all(peer["source"] for peer in p["peers"].values())


def test_the_commands_docs_cost_shows_print_the_figures_it_quotes() -> None:
    """docs/cost.md quotes committed runs through ``python -m bench.azure_cost``: each command runs as
    written and its figures (the total, each meter) are the page's."""
    import re
    import subprocess
    import sys

    from local.procs import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "cost.md").read_text(encoding="utf-8")
    commands = sorted(set(re.findall(r"\.venv/bin/python (-m bench\.azure_cost [\w/.-]+\.json)", doc)))
    assert len(commands) == 2, commands  # the smoke run and the full run
    for command in commands:
        out = subprocess.run([sys.executable, *command.split()], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        total = re.search(r"\): \$([\d.]+)", out)
        assert total is not None and f"**{total.group(1)}**" in doc, (command, out)
        for meter in ("functions", "service bus", "tables", "telemetry"):
            usd = re.search(rf"^  {meter} \$([\d.]+)", out, re.M)
            assert usd is not None, (meter, out)
            assert f"{float(usd.group(1)):.2f}" in doc, (command, meter, usd.group(1))
