"""Supervisor timer (schedule from the SupervisorSchedule setting). Thin adapter over
``shared.supervisor.sweep``; the host runs one timer invocation at a time across the app."""

from __future__ import annotations

import azure.functions as func

from shared.runtime import get_runtime
from shared.supervisor import sweep

bp = func.Blueprint()


@bp.function_name("supervisor")
@bp.timer_trigger(arg_name="timer", schedule="%SupervisorSchedule%", run_on_startup=False, use_monitor=True)
def supervisor(timer: func.TimerRequest) -> None:
    sweep(get_runtime())
