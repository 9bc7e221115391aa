"""``bench.cpu_account``: each system's CPU per order, accounted alike (the app's own processes,
the whole stack without the load generator, and with it), from hand-built phase figures."""

from __future__ import annotations

from bench.cpu_account import accounting, lines


def result() -> dict:
    ours = {"processed": 100,
            "cpu_seconds": {"host instance 1": 1.5, "host instance 2": 1.0, "host supervisor": 0.1,
                            "servicebus emulator": 0.6, "azurite": 1.6, "remotes": 0.2,
                            "bench (load + status consumer)": 0.4},
            "cpu_ms_per_order_split": {"app_code": 20.0, "host_loop": 4.0, "host_other_threads": 1.0}}
    peer = {"processed": 199, "failed": 1,
            "cpu_seconds": {"peer": 2.0, "postgres": 1.0, "remotes": 0.4, "bench (load + listener)": 0.6}}
    return {"phases": {"saturation": ours}, "peer": {"system_database": "postgres", "phases": {"saturation": peer}}}


def test_each_system_counts_its_own_processes_then_its_platform_then_the_client() -> None:
    acc = accounting(result())
    assert acc is not None
    o, d = acc["ours"], acc["dbos"]
    # ours: 2.5 s of host instances + 0.1 s supervisor over 100 orders; + emulator, Azurite, remotes; + the bench
    assert o["app_own_ms"] == 26.0 and o["app_own_parts_ms"]["function code (app_code)"] == 20.0
    assert o["stack_ms"] == 50.0 and o["with_load_generator_ms"] == 54.0
    # DBOS: its process over 200 orders; + Postgres and the remotes; + the bench
    assert d["app_own_ms"] == 10.0 and d["stack_ms"] == 17.0 and d["with_load_generator_ms"] == 20.0
    assert set(acc["includes"]) == {"app_own_ms", "stack_ms", "with_load_generator_ms"}
    assert len(lines(acc)) == 3


def test_a_system_not_measured_is_left_out() -> None:
    r = result()
    del r["peer"]
    acc = accounting(r)
    assert acc is not None and "dbos" not in acc and "ours" in acc
    assert accounting({"phases": {}}) is None and lines(None) == []
