"""A circuit breaker per remote service, shared by every instance (issue 14).

``state``: the pure state machine (row, event, now, policy) -> decision; ``store``: its row in
the state table (partition ``breakers``) and the read-decide-write loop that settles races;
``gate``: admit/record for one agent instance, with the alerts on open and close and the metrics;
``cache``: the gate's short-lived copy of a closed row with nothing counted (issue 15: no read per call);
``board``: an instance's gates, whose copies one query of the partition refreshes (not one read per remote).
The agent admits every call through it (``shared.agent.breaker``); the design is in docs/issue14-breaker-design.md.
"""

from shared.breaker.state import (
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
from shared.breaker.store import BREAKER_PARTITION, BreakerBusy, apply, read_breaker, write_breaker

__all__ = [
    "BREAKER_PARTITION", "Admission", "BreakerBusy", "BreakerDecision", "BreakerPolicy", "BreakerRow",
    "BreakerState", "Effect", "apply", "decide_admit", "decide_failure", "decide_success", "read_breaker",
    "write_breaker",
]
