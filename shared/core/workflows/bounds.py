"""How large a workflow may be: every write of one decision is ONE entity-group transaction.

A transaction holds at most 100 entities. The largest ones are the submission (the order row,
the state row, every step row and its events) and an operator restart (the state row, every
step row rewritten, its events); a decision writes at most ``MAX_EVENTS_PER_WRITE`` events.
"""

from __future__ import annotations

TRANSACTION_ENTITIES = 100  # Azure Table Storage's limit for one entity-group transaction
MAX_EVENTS_PER_WRITE = 16  # history events one decision may append
ORDER_AND_STATE_ROWS = 2
MAX_STEPS = TRANSACTION_ENTITIES - ORDER_AND_STATE_ROWS - MAX_EVENTS_PER_WRITE


def largest_write(step_count: int) -> int:
    """The entities of the largest transaction an order of ``step_count`` steps may write."""
    return ORDER_AND_STATE_ROWS + step_count + MAX_EVENTS_PER_WRITE
