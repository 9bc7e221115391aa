"""The chaos run's bulk retry (bench/chaos_bulk.py; issue 30, deliverable 3's proof): a batch of
orders of a customer of their own fails on a SKU the inventory refuses, the operator restocks it and
retries them all with ONE ``POST /api/operations``, and a host instance is killed while the POST
acts on its first slice and again while the Supervisor's ticks carry the rest, amid the run's usual
faults (duplicate submissions and deliveries, transient errors, hangs, lost responses) and live
orders. A quarter of the batch keeps a second cause of its own: retried, each fails again at
once, so a second pass of the operation over it would restart it twice.

It asserts correctness only, never speed: the operation done, matched == succeeded + failed, 0
orders acted on twice, each retried order restarted exactly once and ending where it should, and
the run's own checks (no double effect at the remotes, every generation undone). Its checks on
made-up outcomes are in tests/bench/test_chaos_bulk.py. Replay a failure with the seed it prints.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from bench.chaos import run_chaos
from bench.chaos_records import ChaosOptions
from tests.e2e.test_chaos import CI_SEED, _failed, _print_evidence


@pytest.mark.integration
@pytest.mark.slow
def test_a_bulk_retry_while_an_instance_is_killed_acts_on_no_order_twice(tmp_path: Path) -> None:
    opts = ChaosOptions(
        orders=60, seed=CI_SEED, instances=2, rate=8.0, out=tmp_path / "chaos.json",
        state_dir=tmp_path / "stack", step_timeout=4, supervisor_schedule="*/1 * * * * *",
        kills=1, duplicate_submit_rate=0.08, duplicate_delivery_rate=0.08,
        transient_rate=0.2, lost_response_rate=0.05, hang_rate=0.05, reject_rate=0.02,
        outage_seconds=0.0, restart_servicebus=False, restart_azurite=False,  # the main chaos test's
        settle_timeout=30.0, drain_timeout=120.0,
        bulk_orders=40, bulk_per_tick=2,  # the POST acts on 25, then 2 per tick (a tick a second)
    )
    out = io.StringIO()
    try:
        report = run_chaos(opts, out=out)
    except BaseException:  # pytest-timeout's signal raises here too
        _print_evidence(out.getvalue(), tmp_path / "stack")
        raise
    if not report["ok"]:
        _print_evidence(out.getvalue(), tmp_path / "stack")
    checks = report["checks"]
    assert report["ok"], _failed(report)

    bulk = report["bulk"]["summary"]
    assert bulk["orders"] == 40 and bulk["keptCause"] == 10, bulk
    assert bulk["matched"] == 40 and bulk["succeeded"] + bulk["failed"] == 40, bulk
    assert bulk["succeeded"] == bulk["actedOn"] == 40, bulk  # every one failed and undone when it started
    assert checks["bulkOrdersActedOnTwice"]["value"] == 0, checks["bulkOrdersActedOnTwice"]
    assert checks["bulkSucceededNotRestartedOnce"]["value"] == 0
    assert checks["bulkOrdersEndedWrongly"]["value"] == 0
    assert [k["during"] for k in bulk["kills"]][:1] == ["post"], bulk["kills"]  # killed while the POST acted
    # ... and the ledger's own checks held over the batch's two generations
    for name in ("doubleEffects", "compensationsAppliedMoreThanOnce", "processedOrdersWithWrongEffects",
                 "generationsNotFromAnOperatorRestart", "effectsWithUnexpectedKeys", "lostOrders", "stuckOrders"):
        assert checks[name]["value"] == 0, (name, checks[name])
    assert report["orders"]["operator"]["restartedOrders"] >= 40, report["orders"]["operator"]
