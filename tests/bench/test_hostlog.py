"""bench.hostlog: a work item belongs to the window it started in, whenever its Executed line comes."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from bench.hostlog import HostLog


def test_an_invocation_counts_where_it_started_not_where_its_settlement_ended_it(tmp_path: Path) -> None:
    log = tmp_path / "host.log"
    log.write_text(
        "[instance 0] 2026-11-28 19:00:00,500 INFO local.host: Executed 'Functions.scheduler' "
        "(Succeeded, Id=a, Duration=400ms)\n"
        # started 19:00:00.900, ended 2.1 s later: its settlement waited for the receiver's turn
        "[instance 1] 2026-11-28 19:00:03,000 INFO local.host: Executed 'Functions.scheduler_replies' "
        "(Succeeded, Id=b, Duration=2100ms)\n"
        "[instance 1] 2026-11-28 19:00:04,000 INFO local.host: Executed 'Functions.agent_payment' "
        "(Succeeded, Id=c, Duration=100ms)\n", encoding="utf-8")
    host = HostLog(log)
    assert host.poll() == 3
    t0 = datetime(2026, 11, 28, 19, 0, 0).timestamp()
    assert host.work_items(t0, t0 + 1.0) == 2
    assert host.work_items(t0 + 1.0, t0 + 5.0) == 1
