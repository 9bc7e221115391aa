"""The benchmark's summary: operations per order and per step, the Azure cost, targets met or not
(with the figures), where the time goes, and the plots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench import busstats
from bench.azure_cost import azure_cost
from bench.calibrate import calibrate
from bench.cost import IDLE_SWEEP_KINDS, SWEEP_KINDS, consistency, saturation_cost, work_queues
from bench.figures import pyplot, save

LOAD_PHASES = ("saturation", "latency", "sustained")
SEARCH_TABLE = "orderindex"  # OrderIndexTable as the stack names it (the default)


def _summed(windows: list[dict[str, Any]], part: str) -> dict[str, dict[str, Any]]:
    """The windows' ``table`` (by ``table|kind``) or ``bus`` (by queue) counts, added up."""
    out: dict[str, dict[str, Any]] = {}
    for w in windows:
        for k, row in w[part].items():
            acc = out.setdefault(k, {})
            for f, v in row.items():
                acc[f] = acc.get(f, 0) + v
    return out


def per_order(result: dict[str, Any]) -> dict[str, Any] | None:
    phases = result.get("phases", {})
    used = [p for p in LOAD_PHASES if p in phases]
    if not used:
        return None
    orders = sum(phases[p]["processed"] for p in used)
    if not orders:
        return None
    windows = [phases[p]["window"] for p in used]
    table = _summed(windows, "table")
    bus = _summed(windows, "bus")
    work = {k: v for k, v in table.items() if k not in SWEEP_KINDS}
    t_req = sum(v["requests"] for v in work.values())
    t_ent = sum(v["entities"] for v in work.values())
    by_kind = {k: round(v["requests"] / orders, 3) for k, v in sorted(table.items())}
    ent_by_kind = {k: round(v["entities"] / orders, 3) for k, v in sorted(table.items())}
    mean_ms = {k: round(1000 * v["seconds"] / v["requests"], 2) for k, v in sorted(table.items()) if v["requests"]}
    index_entities = sum(v["entities"] for k, v in work.items() if k.startswith("deadlines|"))
    by_table: dict[str, dict[str, float]] = {}
    for k, v in work.items():
        acc = by_table.setdefault(k.split("|", 1)[0], {"requests": 0, "entities": 0})
        acc["requests"] += v["requests"]
        acc["entities"] += v["entities"]
    res: dict[str, Any] = {
        "orders": orders, "phases": used,
        "table": {"requests_per_order": round(t_req / orders, 3), "requests_per_step": round(t_req / orders / 3, 3),
                  "entities_per_order": round(t_ent / orders, 3),
                  "requests_per_order_by_kind": by_kind, "entities_per_order_by_kind": ent_by_kind,
                  "mean_request_ms_by_kind": mean_ms,
                  "requests_per_step_by_table": {t: round(v["requests"] / orders / 3, 3)
                                                 for t, v in sorted(by_table.items())},
                  "entities_per_order_by_table": {t: round(v["entities"] / orders, 3)
                                                  for t, v in sorted(by_table.items())},
                  "sweep_requests_in_windows": {k: table[k]["requests"] for k in SWEEP_KINDS if k in table},
                  "index_entities_per_order": round(index_entities / orders, 3),
                  "search_index_entities_per_order": round(by_table.get(SEARCH_TABLE, {}).get("entities", 0)
                                                           / orders, 3)},
    }
    if bus:
        work_q = work_queues(bus)  # every lane's
        wt = busstats.totals(work_q)
        status = bus.get("order-status", {})
        alerts = bus.get("alerts", {})
        msgs = wt.get("sent", 0) + wt.get("delivered", 0)
        settle = sum(wt.get(k, 0) for k in busstats.SETTLEMENTS)
        mgmt = wt.get("management", 0)
        app_sends_other = status.get("sent", 0) + alerts.get("sent", 0)
        azure_ops = msgs + settle + mgmt + app_sends_other
        res["bus"] = {
            "per_queue_per_order": {q: {k: round(v / orders, 3) for k, v in r.items()} for q, r in sorted(bus.items())},
            "work_queue_messages_per_order": round(msgs / orders, 3),
            "work_queue_messages_per_step": round(msgs / orders / 3, 3),
            "messages_per_step_incl_status_sends": round((msgs + status.get("sent", 0)) / orders / 3, 3),
            "settlements_per_order": round(settle / orders, 3),
            "management_ops_per_order": round(mgmt / orders, 3),
            "status_sends_per_order": round(status.get("sent", 0) / orders, 3),
            "azure_ops_per_order": round(azure_ops / orders, 3),
            "consistency": {q: {"sent": r.get("sent", 0), "delivered": r.get("delivered", 0),
                                "completed": r.get("completed", 0), "duplicates": r.get("duplicates", 0)}
                            for q, r in sorted(work_q.items())},
        }
    return res


def targets(result: dict[str, Any], po: dict[str, Any] | None) -> list[dict[str, Any]]:
    t: list[dict[str, Any]] = []
    phases = result.get("phases", {})
    cost = result.get("cost_at_saturation")
    if cost:
        t.append(cost["target"])
    if po:
        if "bus" in po:
            v = po["bus"]["work_queue_messages_per_step"]
            t.append({"target": "<= 4 bus messages per step (sent + received)",
                      "value": f"{v} on the work queues ({po['bus']['messages_per_step_incl_status_sends']} with "
                               f"the status sends)", "met": v <= 4})
    t += (result.get("azure_cost") or {}).get("targets", [])
    idle = result.get("idle")
    if idle:
        work_idle = {k: v for k, v in idle["window"]["table"].items() if k not in IDLE_SWEEP_KINDS}
        bus_idle = busstats.totals(idle["window"]["bus"])
        polled = sum(v["requests"] for v in work_idle.values()) + sum(
            v for k, v in bus_idle.items() if k in ("sent", "delivered", "management", *busstats.SETTLEMENTS))
        t.append({"target": "no operation from idle polling",
                  "value": f"{polled} non-sweep operations in {idle['window']['seconds']}s idle; "
                           f"{idle['table_requests_per_sweep']} table requests per sweep",
                  "met": polled == 0})
        # With nothing in flight no deadline row falls due: an idle sweep is its index query alone.
        # A state read there is a row left behind (say, reserved ids' rows falling due as orphans).
        state_reads = sum(v["requests"] for k, v in idle["window"]["table"].items()
                          if k.startswith("orders|") and "breakers" not in k)
        t.append({"target": "an idle sweep reads no state row (no deadline row falls due with nothing in flight)",
                  "value": f"{state_reads} state reads in {idle['sweeps']} sweeps",
                  "met": state_reads == 0})
    sw = result.get("sweep", {})
    for label in ("small", "large"):
        s = sw.get(label)
        if s:
            w = s["sweep_with_due_rows"]
            t.append({"target": f"sweep reads <= due rows + 10 ({s['finished_orders_in_store']:,} finished orders)",
                      "value": f"{w['index_entities_read']} index rows read for {s['due_rows']} due (+ "
                               f"{w.get('state_read_requests', '?')} state reads of {w['state_entities_read']} "
                               f"entities: a point read per due row and, for an ended order, its partition to "
                               f"rewrite its search index rows; the breakers' pass, "
                               f"{w.get('breaker_pass_read_requests', 0)} reads, apart); steady sweep "
                               f"{s['sweep_steady']['entities_read']} read",
                      "met": bool(s["reads_within_bound"])})
    t += _search_targets(result.get("search"))
    lat = phases.get("latency")
    if lat:
        p99 = lat["latency_ms"]["p99"]
        t.append({"target": "p99 submit->Processed <= 500 ms at 20% of saturation",
                  "value": f"p99 {p99} ms (p50 {lat['latency_ms']['p50']}, p95 {lat['latency_ms']['p95']}) "
                           f"at {lat['arrival_rate']} orders/s",
                  "met": p99 is not None and p99 <= 500})
    rec = result.get("recovery")
    if rec and "recovered_s" in rec:
        t.append({"target": "recovery within CompleteBy + one supervisor period + 1 s",
                  "value": f"{rec['recovered_s']} s after the kill (bound {rec['bound_s']} s)",
                  "met": bool(rec["within_bound"])})
    return t


def _search_targets(search: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not search:
        return []
    if "error" in search:
        return [{"target": "search page of 50 reads <= its bound of entities",
                 "value": f"not measured: {search['error']}", "met": False}]
    out = []
    for size in search.get("sizes", {}).values():
        name, worst = max(size["pages"].items(), key=lambda kv: kv[1]["entities_read"])
        out.append({"target": f"search page of {size['page']} reads <= ~{search['bound_entities']} entities "
                              f"({size['finished_orders']:,} finished orders; the index in "
                              f"{search.get('search_shards', 1)} partition(s))",
                    "value": f"at most {worst['entities_read']} entities read ({name}: {worst['index_entities_read']} "
                             f"index + {worst['state_point_reads']} state point reads), at most "
                             f"{size['max_table_requests']} requests, over {len(size['pages'])} filters",
                    "met": bool(size["within_bound"])})
    return out


def where_time_goes(result: dict[str, Any], profiles: dict[str, Any]) -> dict[str, Any]:
    """What bounds saturation: the profiles, CPU per order by process group (the host instances as
    one), the share of the machine used, and Azurite's CPU per table request. The saturation
    phase holds the CPU seconds, the wall time and the probe's latencies themselves."""
    sat = result.get("phases", {}).get("saturation", {})
    cpu = sat.get("cpu_seconds") or {}
    wall = sat.get("cpu_wall_seconds") or 0
    orders = sat.get("processed") or 0
    out: dict[str, Any] = {"profiles": profiles}
    if orders and cpu:
        hosts = sum(v for k, v in cpu.items() if k.startswith("host instance"))
        out["cpu_ms_per_order"] = {"host instances (the app)": round(1000 * hosts / orders, 1),
                                   **{k: round(1000 * v / orders, 1) for k, v in cpu.items()
                                      if not k.startswith("host instance")}}
        avail = wall * (result["machine"]["nproc"] or 1)
        out["machine_cpu_used_share"] = round(sum(cpu.values()) / avail, 3) if avail else None
    reqs = sum(v["requests"] for v in ((sat.get("window") or {}).get("table") or {}).values())
    if reqs and cpu.get("azurite"):
        out["azurite_cpu_ms_per_app_request"] = round(1000 * cpu["azurite"] / reqs, 3)
    return out


def summarize(bench: Any) -> None:
    r = bench.result
    r["machine"] |= {"loadavg_at_end": list(os.getloadavg()), "calibration_at_end": calibrate()}
    po = per_order(r)
    r["per_order"] = po
    r["cost_at_saturation"] = saturation_cost(r)
    sat_po = per_order({"phases": {"saturation": r["phases"]["saturation"]}}) if "saturation" in r.get("phases", {}) \
        else None
    r["azure_cost"] = _azure_cost(bench, r, sat_po or po, "saturation" if sat_po else "load phases")
    r["consistency"] = consistency(po, r["cost_at_saturation"])
    sw = r.get("sweep", {})
    if "small" in sw and "large" in sw:
        a, b = sw["small"]["sweep_with_due_rows"]["duration_ms"], sw["large"]["sweep_with_due_rows"]["duration_ms"]
        c, d = sw["small"]["sweep_steady"]["duration_ms"], sw["large"]["sweep_steady"]["duration_ms"]
        sw["time_ratio_large_over_small"] = round(b / a, 2) if a else None
        sw["steady_time_ratio_large_over_small"] = round(d / c, 2) if c else None
    r["where_time_goes"] = where_time_goes(r, bench.profiles)
    r["targets"] = targets(r, po)
    if not bench.args.no_plots:
        try:
            r["plots"] = plots(bench)
            if (r.get("search") or {}).get("sizes"):
                from bench.search_cost import plot as search_plot

                r["plots"]["search"] = search_plot(r["search"], bench.out_dir / "search.png")
        except Exception as e:  # noqa: BLE001
            r["plots"] = {"error": repr(e)}


def _azure_cost(bench: Any, r: dict[str, Any], po: dict[str, Any] | None, counted_over: str) -> dict[str, Any] | None:
    """bench.azure_cost over the saturation window (else the load phases): its orders, its
    invocations (started in it), its bus and table counts, the telemetry receiver's counts."""
    if po is None or bench.hostlog is None:
        return None
    names = ("saturation",) if counted_over == "saturation" else LOAD_PHASES
    windows = [(t0, t1) for name, t0, t1 in bench.phase_windows if name in names]
    phases = [r["phases"][n] for n in names if n in r.get("phases", {})]
    if not windows or not phases:
        return None
    telemetry = [p["window"].get("telemetry") for p in phases]
    summed = None
    if all(telemetry):
        summed = {k: {f: sum(t[k][f] for t in telemetry) for f in ("items", "bytes")}
                  for k in ("app", "host_local", "request")}
        summed["orders_sampled"] = sum(t["orders_sampled"] for t in telemetry)
        summed["by_type_bytes"] = {k: sum(t["by_type_bytes"].get(k, 0) for t in telemetry)
                                   for k in telemetry[0]["by_type_bytes"]}
    bench.hostlog.poll()
    invocations = [i for i in bench.hostlog.invocations
                   if any(t0 <= i.at - i.duration_ms / 1000 < t1 for t0, t1 in windows)]
    since, until = min(t0 for t0, _ in windows), max(t1 for _, t1 in windows)
    return azure_cost(po["orders"], invocations, since, until, po, summed, bench.args.telemetry_ratio, counted_over)


def plots(bench: Any) -> dict[str, str]:
    plt = pyplot()
    out_dir: Path = bench.out_dir
    orders = [o for run in bench.runs for o in run.collect()]
    if not orders:
        return {}
    t0 = min(o.submitted for o in orders)
    t_end = max([o.processed for o in orders if o.processed] + [o.submitted for o in orders])
    n = int(t_end - t0) + 2
    posted = [0] * n
    done = [0] * n
    for o in orders:
        posted[int(o.submitted - t0)] += 1
        if o.processed:
            done[int(o.processed - t0)] += 1
    work = [0] * n
    for inv in bench.hostlog.invocations if bench.hostlog else []:
        if inv.function.startswith(("scheduler", "agent_")):  # every lane's
            k = int(inv.at - t0)
            if 0 <= k < n:
                work[k] += 1
    xs = list(range(n))
    fig, ax = plt.subplots(figsize=(9, 4), dpi=90)
    ax.plot(xs, work, label="work items/s (scheduler + agent invocations)", lw=1, color="tab:gray")
    ax.plot(xs, done, label="orders Processed/s", lw=1.5, color="tab:green")
    ax.plot(xs, posted, label="orders posted/s", lw=1, color="tab:blue", ls="--")
    colors = ["#fde2e2", "#e2f0fd", "#e8fde2", "#fdf6e2", "#efe2fd", "#e2fdf8"]
    for i, (name, a, b) in enumerate(w for w in bench.phase_windows if w[2] >= t0 and w[1] <= t_end):
        ax.axvspan(max(0, a - t0), min(n, b - t0), color=colors[i % len(colors)], alpha=0.6, lw=0)
        ax.text(max(0, a - t0) + 0.5, ax.get_ylim()[1] * 0.95 if ax.get_ylim()[1] else 1, name, fontsize=7,
                va="top")
    ax.set_xlabel("seconds since the first order")
    ax.set_ylabel("per second")
    ax.set_title("Throughput over time")
    ax.legend(fontsize=7, loc="upper right")
    throughput = save(fig, out_dir / "throughput.png")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    from bench.phase_bulk import ALONE, BESIDE

    for phase, color in (("latency", "tab:green"), ("sustained", "tab:orange"), ("saturation", "tab:red"),
                         (ALONE, "tab:blue"), (BESIDE, "tab:purple")):
        lat = sorted(1000 * (o.processed - o.submitted) for o in orders if o.phase == phase and o.processed)
        if not lat:
            continue
        ax1.hist(lat, bins=40, alpha=0.5, color=color, label=f"{phase} (n={len(lat)})")
        ax2.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], color=color, label=phase)
    ax1.set_xlabel("submit -> Processed (ms)")
    ax1.set_ylabel("orders")
    ax1.legend(fontsize=7)
    ax2.set_xscale("log")
    ax2.set_xlabel("submit -> Processed (ms, log)")
    ax2.set_ylabel("fraction")
    ax2.axvline(500, color="k", lw=0.8, ls=":")
    ax2.axhline(0.99, color="k", lw=0.5, ls=":")
    ax2.legend(fontsize=7)
    fig.suptitle("Latency distribution", fontsize=10)
    return {"throughput": throughput, "latency": save(fig, out_dir / "latency.png")}
