"""What an order costs in Azure (issue 43): every meter, its units counted in the run, priced by
``bench/prices.json``; docs/cost.md explains the arithmetic. ``python -m bench.azure_cost [bench.json]``
prints a run's again.

Counted over the saturation window when there is one (else the load phases): **functions**, the
executions that started in it and GB-seconds by Flex Consumption's rule (:func:`flex_billed_seconds`,
on each instance's measured execution intervals, ``bench.hostlog``); **servicebus**, the operations
counted at the emulator (``bench.report.per_order``), the status consumer's receives left to the
caller and the status sends apart (the default order names no ``statusQueue``: the target is judged
on ``default_order_usd_per_million_orders``); **tables**, requests with a batch once
(``bench.opcount``); **telemetry**, the bytes the app's exporter sent to the local receiver at the
run's sampling ratio, plus an estimate of the Functions host's own request items.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PRICES = Path(__file__).with_name("prices.json")
MB_PER_GB = 1024
TARGET_USD_PER_MILLION = 20.0
TELEMETRY_SHARE_TARGET = 0.25


def prices() -> dict[str, Any]:
    return dict(json.loads(PRICES.read_text(encoding="utf-8")))


def flex_billed_seconds(intervals: Iterable[tuple[float, float]], minimum_s: float = 1.0,
                        step_s: float = 0.1) -> tuple[float, float, int]:
    """One instance's executions as (start, end) seconds: (busy seconds, billed seconds, periods).
    Overlapping executions make one activity period; each is billed at least ``minimum_s``, past that
    rounded up to the next ``step_s``."""
    busy = billed = 0.0
    periods = 0
    start = end = None
    for s, e in sorted(intervals):
        if start is not None and end is not None and s <= end:
            end = max(end, e)
            continue
        if start is not None and end is not None:
            busy, billed, periods = busy + end - start, billed + _bill(end - start, minimum_s, step_s), periods + 1
        start, end = s, e
    if start is not None and end is not None:
        busy, billed, periods = busy + end - start, billed + _bill(end - start, minimum_s, step_s), periods + 1
    return busy, billed, periods


def _bill(seconds: float, minimum_s: float, step_s: float) -> float:
    return max(minimum_s, math.ceil(round(seconds / step_s, 6)) * step_s)


def functions_meter(invocations: Iterable[Any], since: float, until: float, orders: int,
                    price: dict[str, Any]) -> dict[str, Any]:
    """``invocations``: ``bench.hostlog.Invocation`` (instance, ``at`` = its end, duration_ms)."""
    by_instance: dict[int, list[tuple[float, float]]] = defaultdict(list)
    executions = 0
    for inv in invocations:
        start = inv.at - inv.duration_ms / 1000
        if since <= start < until:
            by_instance[inv.instance].append((start, inv.at))
            executions += 1
    minimum, step = price["minimum_billable_period_ms"] / 1000, price["billable_period_rounded_up_to_ms"] / 1000
    busy = billed = 0.0
    periods = 0
    for intervals in by_instance.values():
        b, bl, p = flex_billed_seconds(intervals, minimum, step)
        busy, billed, periods = busy + b, billed + bl, periods + p
    gb = price["instance_memory_mb"] / MB_PER_GB
    per_order = {"executions": executions / orders, "busy_instance_seconds": busy / orders,
                 "billed_instance_seconds": billed / orders, "gb_seconds": gb * billed / orders}
    usd = (per_order["executions"] * price["usd_per_million_executions"]
           + per_order["gb_seconds"] * price["usd_per_gb_second"] * 1e6)
    return {"per_order": _rounded(per_order), "usd_per_million_orders": round(usd, 2),
            "instances": len(by_instance), "activity_periods": periods, "memory_mb": price["instance_memory_mb"],
            "rule": price["rule"]}


def servicebus_meter(bus: dict[str, Any], price: dict[str, Any]) -> dict[str, Any]:
    """``bus``: ``per_order(...)["bus"]``."""
    ops = bus["azure_ops_per_order"]
    tiers = {tier: round(ops * usd, 2) for tier, usd in price["usd_per_million_operations"].items()}
    by_queue = bus.get("per_queue_per_order", {})
    status_receives = by_queue.get("order-status", {}).get("delivered", 0)
    return {"per_order": {"operations": ops, "messages_on_work_queues": bus["work_queue_messages_per_order"],
                          "settlements": bus["settlements_per_order"], "management": bus["management_ops_per_order"],
                          "status_sends": bus["status_sends_per_order"],
                          "status_consumer_receives_not_the_apps": status_receives},
            "usd_per_million_orders": tiers[price["priced_tier"]], "tier": price["priced_tier"],
            "usd_per_million_orders_by_tier": tiers, "fixed_usd_per_month": price["base_usd_per_month"],
            "rule": price["rule"]}


def tables_meter(table: dict[str, Any], price: dict[str, Any]) -> dict[str, Any]:
    """``table``: ``per_order(...)["table"]`` (the Supervisor's sweep reads apart)."""
    req, ent = table["requests_per_order"], table["entities_per_order"]
    per_10k = price["usd_per_10k_transactions"]
    return {"per_order": {"transactions": req, "entities_upper_bound": ent},
            "usd_per_million_orders": round(req * per_10k * 100, 4),
            "usd_per_million_orders_if_each_entity_counts": round(ent * per_10k * 100, 4), "rule": price["rule"]}


def telemetry_meter(window: dict[str, Any] | None, orders: int, executions_per_order: float, ratio: float,
                    price: dict[str, Any]) -> dict[str, Any] | None:
    """``window``: the receiver's counts over the window (``Bench.window``'s ``telemetry``)."""
    if not window:
        return None
    app_bytes = window["app"]["bytes"] / orders
    requests = window["request"]
    request_bytes = requests["bytes"] / requests["items"] if requests["items"] else 0.0
    host = executions_per_order * request_bytes * ratio
    total = app_bytes + host
    usd = total / 1e9 * price["usd_per_gb"] * 1e6
    return {"per_order": {"items": round(window["app"]["items"] / orders, 2)},
            "bytes_per_order": round(total), "app_bytes_per_order": round(app_bytes),
            "host_bytes_per_order_estimate": round(host),
            "sampling_ratio": ratio, "orders_sampled_in_window": window.get("orders_sampled"),
            "mean_request_item_bytes": round(request_bytes),
            "by_type_bytes_per_order": {k: round(v / orders) for k, v in window.get("by_type_bytes", {}).items() if v},
            "usd_per_million_orders": round(usd, 2), "usd_per_gb": price["usd_per_gb"], "rule": price["rule"],
            "estimate": "host_bytes_per_order_estimate: one request item per invocation (the OpenTelemetry mode), "
                        "sampled at the same ratio, sized as the app's request items measured here"}


def azure_cost(orders: int, invocations: Iterable[Any], since: float, until: float, po: dict[str, Any],
               telemetry_window: dict[str, Any] | None, ratio: float, counted_over: str) -> dict[str, Any] | None:
    if not orders or "bus" not in po:
        return None
    p = prices()
    meters: dict[str, Any] = {
        "functions": functions_meter(invocations, since, until, orders, p["functions_flex"]),
        "servicebus": servicebus_meter(po["bus"], p["service_bus_standard"]),
        "tables": tables_meter(po["table"], p["table_storage"]),
    }
    tel = telemetry_meter(telemetry_window, orders, meters["functions"]["per_order"]["executions"], ratio,
                          p["log_analytics"])
    if tel is not None:
        meters["telemetry"] = tel
    return {"meters": meters, **totals(meters, p), "orders": orders, "counted_over": counted_over,
            "prices_read_on": p["read_on"], "region": p["region"]}


def totals(meters: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """The sums of the meters: the run's total, the default order's, by Service Bus tier, the
    telemetry's share, and the targets. Arithmetic only: ``python -m bench.azure_cost`` derives them
    again from a run's stored meters."""
    total = sum(m["usd_per_million_orders"] for m in meters.values())
    sb, tel = meters["servicebus"], meters.get("telemetry")
    tier_prices = p["service_bus_standard"]["usd_per_million_operations"]
    # the bench's orders name a statusQueue (it learns of their end from it); an order names none by
    # default and then gets no status sends: those are counted apart and left out of the default's figure
    status = sb["per_order"]["status_sends"]
    default = total - status * tier_prices[sb["tier"]]
    by_tier = {tier: total - sb["usd_per_million_orders"] + usd
               for tier, usd in sb["usd_per_million_orders_by_tier"].items()}
    out: dict[str, Any] = {
        "total_usd_per_million_orders": round(total, 2),
        "default_order_usd_per_million_orders": round(default, 2),
        "status_sends_usd_per_million_orders": round(status * tier_prices[sb["tier"]], 2),
        "total_usd_per_million_orders_by_service_bus_tier": {tier: round(usd, 2) for tier, usd in by_tier.items()},
        "default_order_usd_per_million_orders_by_service_bus_tier": {
            tier: round(usd - status * tier_prices[tier], 2) for tier, usd in by_tier.items()},
    }
    if tel is not None:
        out["telemetry_share"] = round(tel["usd_per_million_orders"] / default, 3) if default else None
    out["targets"] = [
        {"target": f"<= ${TARGET_USD_PER_MILLION:g} per million orders, every meter, the default order (Service "
                   f"Bus at {sb['tier']}, Flex at {meters['functions']['memory_mb']} MB)",
         "value": f"${out['default_order_usd_per_million_orders']}", "met": default <= TARGET_USD_PER_MILLION}]
    if tel is not None:
        out["targets"].append({"target": f"telemetry <= {TELEMETRY_SHARE_TARGET:.0%} of the total",
                               "value": f"{out['telemetry_share']:.0%}",
                               "met": out["telemetry_share"] is not None
                               and out["telemetry_share"] <= TELEMETRY_SHARE_TARGET})
    return out


def telemetry_diff(after: dict[str, Any] | None, before: dict[str, Any] | None) -> dict[str, Any] | None:
    """The receiver's ``/_stats`` counts between two snapshots (None when there is no receiver)."""
    if not after or not before:
        return None
    def d(path: tuple[str, ...]) -> int:
        a: Any = after
        b: Any = before
        for key in path:
            a, b = (a or {}).get(key, 0), (b or {}).get(key, 0)
        return int(a or 0) - int(b or 0)
    return {"app": {"items": d(("byOrigin", "app", "items")), "bytes": d(("byOrigin", "app", "bytes"))},
            "host_local": {"items": d(("byOrigin", "host", "items")), "bytes": d(("byOrigin", "host", "bytes"))},
            "request": {"items": d(("byType", "request", "items")), "bytes": d(("byType", "request", "bytes"))},
            "by_type_bytes": {k: d(("byType", k, "bytes")) for k in (after.get("byType") or {})},
            "orders_sampled": d(("requestsByName", "POST /api/orders"))}


def summary_lines(cost: dict[str, Any]) -> list[str]:
    m = cost["meters"]
    f, sb, t = m["functions"], m["servicebus"], m["tables"]
    lines = [
        f"Azure cost per million orders (counted over {cost['counted_over']}, {cost['orders']} orders; prices of "
        f"{cost['prices_read_on']}): ${cost['default_order_usd_per_million_orders']} the default order"
        + (f", telemetry {cost['telemetry_share']:.0%} of it" if "telemetry_share" in cost else "")
        + f"; ${cost['total_usd_per_million_orders']} with the {sb['per_order']['status_sends']} status sends of "
          f"an order naming a statusQueue (${cost['status_sends_usd_per_million_orders']}), as the bench's do",
        f"  functions ${f['usd_per_million_orders']}: {f['per_order']['executions']} executions, "
        f"{f['per_order']['gb_seconds']} GB-s ({f['per_order']['billed_instance_seconds']} s billed of "
        f"{f['per_order']['busy_instance_seconds']} s busy per order, {f['memory_mb']} MB)",
        f"  service bus ${sb['usd_per_million_orders']} ({sb['tier']}): {sb['per_order']['operations']} operations "
        f"({sb['per_order']['status_sends']} status sends); by tier {sb['usd_per_million_orders_by_tier']}; the "
        f"default order's total by tier {cost['default_order_usd_per_million_orders_by_service_bus_tier']}",
        f"  tables ${t['usd_per_million_orders']}: {t['per_order']['transactions']} transactions "
        f"(${t['usd_per_million_orders_if_each_entity_counts']} if each entity counted)",
    ]
    tel = m.get("telemetry")
    if tel:
        lines.append(f"  telemetry ${tel['usd_per_million_orders']}: {tel['bytes_per_order']} bytes per order at ratio "
                     f"{tel['sampling_ratio']} ({tel['app_bytes_per_order']} the app's, measured; "
                     f"{tel['host_bytes_per_order_estimate']} the host's, estimated)")
    lines += [f"  target {x['target']}: {x['value']} {'met' if x['met'] else 'NOT MET'}" for x in cost["targets"]]
    return lines


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in d.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.azure_cost [bench.json]``: a run's cost per million orders, meter by meter."""
    import argparse

    from bench.args import RESULTS

    ap = argparse.ArgumentParser(prog="python -m bench.azure_cost", description=main.__doc__)
    ap.add_argument("bench_json", nargs="?", default=str(RESULTS / "bench.json"),
                    help="a bench run's bench.json (default: the latest full run's)")
    args = ap.parse_args(argv)
    path = Path(args.bench_json)
    if not path.is_file():
        ap.error(f"no bench.json at {path}: run `make bench` (or `python -m bench --smoke --out-dir DIR`) first")
    cost = json.loads(path.read_text(encoding="utf-8")).get("azure_cost")
    if not cost:
        ap.error(f"{path} has no azure_cost (a run from before issue 43, or one without bus stats)")
    print("\n".join(summary_lines({**cost, **totals(cost["meters"], prices())})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
