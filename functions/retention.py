"""Retention timer (schedule from the RetentionSchedule setting). Thin adapter over
``shared.supervisor.retention.purge``: finished orders older than RetentionDays go, with their history."""

from __future__ import annotations

import azure.functions as func

from shared.runtime import get_runtime
from shared.supervisor.retention import purge

bp = func.Blueprint()


@bp.function_name("retention")
@bp.timer_trigger(arg_name="timer", schedule="%RetentionSchedule%", run_on_startup=False, use_monitor=True)
def retention(timer: func.TimerRequest) -> None:
    purge(get_runtime())
