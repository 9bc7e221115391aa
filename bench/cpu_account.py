"""CPU per order at saturation, accounted the same way for each system (issue 31, deliverable 2).

Per system, from the CPU seconds each process used over its saturation phase (``bench.profiling``)
and, for ours, the host instances' per-thread split (``bench.cpu_split``):

* ``app_own``: the app's own processes. Ours: the Functions host instances (the function code,
  the host's receive/settle loop that the .NET host does for us in Azure, its other threads) and
  the Supervisor's host; the function code alone (``app_code``, the measure of the 24 ms target)
  and the loop are given apart. DBOS: its one process, which with SQLite holds its system
  database too (not separable); with Postgres, the database is in ``stack`` only.
* ``stack``: ``app_own`` and what stands for the platform it needs: ours, the Service Bus
  emulator and Azurite; DBOS, Postgres when it runs apart; both, the remotes' simulator.
* ``with_load_generator``: ``stack`` and the bench's own process (the load generator, and ours'
  status-queue consumer or the peer's listener): the client's side, so not in ``stack``.
"""

from __future__ import annotations

from typing import Any

OURS_PLATFORM = ("servicebus emulator", "azurite")


def _ms(seconds: float, orders: int) -> float:
    return round(1000 * seconds / orders, 1)


def ours(result: dict[str, Any]) -> dict[str, Any] | None:
    sat = (result.get("phases") or {}).get("saturation") or {}
    cpu, orders = sat.get("cpu_seconds") or {}, sat.get("processed") or 0
    if not cpu or not orders:
        return None
    hosts = sum(v for k, v in cpu.items() if k.startswith("host instance"))
    app = hosts + cpu.get("host supervisor", 0.0)
    platform = sum(cpu.get(k, 0.0) for k in OURS_PLATFORM)
    stack = app + platform + cpu.get("remotes", 0.0)
    client = sum(v for k, v in cpu.items() if k.startswith("bench"))
    split = sat.get("cpu_ms_per_order_split") or {}
    return {"orders": orders,
            "app_own_ms": _ms(app, orders),
            "app_own_parts_ms": {"function code (app_code)": split.get("app_code"),
                                 "host receive/settle loop": split.get("host_loop"),
                                 "host other threads": split.get("host_other_threads"),
                                 "supervisor host": _ms(cpu.get("host supervisor", 0.0), orders)},
            "stack_ms": _ms(stack, orders),
            "stack_parts_ms": {k: _ms(cpu.get(k, 0.0), orders) for k in (*OURS_PLATFORM, "remotes")},
            "with_load_generator_ms": _ms(stack + client, orders)}


def dbos(result: dict[str, Any]) -> dict[str, Any] | None:
    peer = result.get("peer") or {}
    sat = (peer.get("phases") or {}).get("saturation") or {}
    cpu = sat.get("cpu_seconds") or {}
    orders = (sat.get("processed") or 0) + (sat.get("failed") or 0)
    if not cpu or not orders:
        return None
    app = cpu.get("peer", 0.0)
    stack = app + cpu.get("postgres", 0.0) + cpu.get("remotes", 0.0)
    client = sum(v for k, v in cpu.items() if k.startswith("bench"))
    return {"orders": orders, "system_database": peer.get("system_database"),
            "app_own_ms": _ms(app, orders),
            "stack_ms": _ms(stack, orders),
            "stack_parts_ms": {k: _ms(cpu.get(k, 0.0), orders) for k in ("postgres", "remotes") if k in cpu},
            "with_load_generator_ms": _ms(stack + client, orders)}


def accounting(result: dict[str, Any]) -> dict[str, Any] | None:
    out = {k: v for k, v in (("ours", ours(result)), ("dbos", dbos(result))) if v is not None}
    if not out:
        return None
    out["includes"] = {
        "app_own_ms": "ours: the host instances (function code + receive/settle loop + other host threads) and "
                      "the Supervisor's host; DBOS: its process (with SQLite, its system database inside it)",
        "stack_ms": "app_own + ours: Service Bus emulator, Azurite; DBOS: Postgres when apart; both: the remotes",
        "with_load_generator_ms": "stack + the bench's process (load generator; status consumer / listener)"}
    return out


def lines(acc: dict[str, Any] | None) -> list[str]:
    if not acc:
        return []
    out = ["CPU ms per order at saturation, per system (bench.cpu_account):"]
    for name in ("ours", "dbos"):
        a = acc.get(name)
        if a:
            parts = a.get("app_own_parts_ms") or {}
            out.append(f"  {name}: app's own {a['app_own_ms']}{f' {parts}' if parts else ''}; whole stack "
                       f"{a['stack_ms']} {a['stack_parts_ms']}; with the load generator {a['with_load_generator_ms']}")
    return out
