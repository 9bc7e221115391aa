"""The recovery phase: SIGKILL the host instance running a step, mid-call, and time the redrive.

The payment remote is made to hang for ``--recovery-hang`` seconds; once ``agent_payment`` is
executing an order's charge, its instance is killed. The Supervisor must redrive the step within
its CompleteBy plus one Supervisor period plus 1 s, and the local host restarts the instance.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bench.logline import log
from bench.poll import wait_for

if TYPE_CHECKING:
    from bench.bench_state import BenchState


def _kill_mid_call(bench: BenchState, oid: str, t0: float) -> tuple[int, int, float, float, int]:
    """Once ``agent_payment`` runs the order's charge: SIGKILL its instance, mid-call.
    (instance, pid, kill time, the step's CompleteBy, its attempt)."""
    hostlog = bench.hostlog
    assert hostlog is not None

    def executing() -> list[tuple[int, float, str]]:
        hostlog.poll()
        return hostlog.executing_of("agent_payment", since=t0 - 1)

    ex = wait_for(executing, 30, every=0.05)
    if not ex:
        raise RuntimeError("agent_payment never started")
    instance = ex[0][0]
    time.sleep(min(1.0, bench.args.recovery_hang / 3))  # in the middle of the remote call
    order = bench.stack.get_order(oid)
    step = next(s for s in order["steps"] if s["name"] == "charge-payment")
    complete_by = datetime.fromisoformat(step["completeBy"]).timestamp()
    pid = bench.host_instances()[instance]
    os.kill(pid, signal.SIGKILL)
    return instance, pid, time.time(), complete_by, int(step["attempt"])


def _step_done_at(bench: BenchState, oid: str, wait_s: float) -> float | None:
    """When the status queue said the order's charge-payment step was done (None: not in time)."""
    watcher = bench.watcher
    assert watcher is not None
    at = wait_for(lambda: watcher.events.get(oid, {}).get("step-done:charge-payment"), wait_s, every=0.05)
    return None if at is None else float(at)


def _measure(bench: BenchState, oid: str, t0: float, r: Any) -> dict[str, Any]:
    k, pid, t_kill, complete_by, attempt = _kill_mid_call(bench, oid, t0)
    bench.stack.remotes.reset_faults()
    log(f"  killed host instance {k} (pid {pid}) running charge-payment attempt {attempt}; "
        f"CompleteBy in {complete_by - t_kill:.1f}s")
    bound = complete_by + bench.args.supervisor_period + 1.0
    done_at = _step_done_at(bench, oid, (bound - t_kill) + 60)
    r.wait_all(60)
    final = bench.stack.get_order(oid)
    st = next(s for s in final["steps"] if s["name"] == "charge-payment")
    res = {"order_id": oid, "killed_instance": k, "killed_pid": pid,
           "complete_by_after_kill_s": round(complete_by - t_kill, 2),
           "supervisor_period_s": bench.args.supervisor_period,
           "bound_s": round(bound - t_kill, 2),
           "recovered_s": round(done_at - t_kill, 2) if done_at else None,
           "within_bound": bool(done_at and done_at <= bound),
           "attempts": st["attempt"], "final_state": final["processState"],
           "failure_count": final["failureCount"]}
    try:
        bench.stack.wait_host_instance_replaced(k, pid, timeout=30)
    except Exception as e:  # noqa: BLE001
        res["instance_restart"] = repr(e)
    return res


def run(bench: BenchState) -> None:
    """The phase: one order, its payment call hung, its instance killed; the result in ``recovery``."""
    assert bench.hostlog is not None and bench.watcher is not None
    log("phase: recovery (SIGKILL the host instance running charge-payment, mid-call)")
    remotes = bench.stack.remotes
    remotes.set_faults("payment", latencyMs=int(bench.args.recovery_hang * 1000))
    t0 = time.time()
    r = bench.new_run("recovery")
    res: dict[str, Any] = {}
    try:
        oid = r._post_one()
        if oid is None:
            raise RuntimeError("recovery order was not accepted")
        res = _measure(bench, oid, t0, r)
    except Exception as e:  # noqa: BLE001
        res["error"] = repr(e)
    finally:
        try:
            remotes.reset_faults()
        except Exception:  # noqa: BLE001,S110
            pass
    bench.result["recovery"] = res
    bench.phase_windows.append(("recovery", t0, time.time()))
    log(f"  recovery: step succeeded {res.get('recovered_s')}s after the kill (bound {res.get('bound_s')}s; "
        f"attempts {res.get('attempts')}) {res.get('error', '')}")
