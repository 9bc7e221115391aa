"""The Supervisor role, on timers: the sweep of due deadline rows (``sweep``: redrive, fail or
compensate an overdue step), the breakers' watches (``breakers``) and the purge of old orders
(``retention``)."""

from shared.supervisor.sweep import SweepReport, sweep

__all__ = ["SweepReport", "sweep"]
