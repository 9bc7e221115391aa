"""A circuit breaker per remote service, shared by every instance, as pure decisions.

``state``: the breaker (row, event, now, policy) -> decision; ``watch``: its row in the deadline
index while the Supervisor may owe it anything; ``waiting``: the steps that wait on an open
breaker, and the resume that wakes one. Their rows are stored by ``shared.storage.breakers`` and
``shared.storage.waiting``; an agent admits every call through its gate (``shared.agent.gate``).
The design is in docs/breaker-design.md.
"""

from shared.core.breaker.state import (
    Admission,
    BreakerDecision,
    BreakerPolicy,
    BreakerRow,
    BreakerState,
    Effect,
    decide_admit,
    decide_failure,
    decide_success,
)

__all__ = [
    "Admission", "BreakerDecision", "BreakerPolicy", "BreakerRow", "BreakerState", "Effect", "decide_admit",
    "decide_failure", "decide_success",
]
