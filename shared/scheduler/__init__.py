"""The Scheduler role: it claims orders (schedule messages), resumes steps that waited on a
breaker, and records the agents' replies (``handlers``). Each handler reads the order, asks the
core (``shared.core.statemachine``) and runs the decision's effects (``shared.runtime.executor``)."""

from shared.scheduler.handlers import handle_reply, handle_schedule

__all__ = ["handle_reply", "handle_schedule"]
