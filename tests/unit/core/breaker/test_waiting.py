"""The index of steps waiting on an open breaker (``shared.core.breaker.waiting``), and ``hold``'s
register-then-recheck: a close at any point of it leaves no waiting step unseen."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.agent.gate import BreakerGate
from shared.agent.guard import hold
from shared.core.breaker.state import BreakerPolicy, BreakerState, decide_admit, decide_success
from shared.core.breaker.waiting import WaitingStep, waiting_partition
from shared.core.rows import Op
from shared.messaging import MemoryBus
from shared.storage.breakers import apply, read_breaker
from shared.storage.memory import MemoryStore
from shared.storage.waiting import forget_waiting, register_waiting, waiting_steps

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
POLICY = BreakerPolicy(threshold=1, cool_down=timedelta(seconds=5), probe_lease=timedelta(seconds=10))
ORDER = "0123456789abcdef0123456789abcdef"
STEP = WaitingStep(ORDER, 2, "ship")


def opened(store: Any) -> BreakerGate:
    gate = BreakerGate(store, "shipping", POLICY, "a", MemoryBus(), "alerts", now=lambda: T0)
    gate.record(503)
    assert read_breaker(store, "shipping").state is BreakerState.OPEN
    return gate


def close_now(store: Any) -> list[WaitingStep]:
    """What the closing instance does: its probe, its close write (the probe's success), then its listing."""
    later = T0 + POLICY.cool_down
    probe = apply(store, "shipping", lambda row: decide_admit(row, later, POLICY, "closer"))
    assert probe.admission == "probe"
    assert apply(store, "shipping", lambda row: decide_success(row, later, probe.probe_id)).row is not None
    return waiting_steps(store, "shipping")


def test_the_row_key_names_the_step_attempt() -> None:
    assert STEP.row_key == f"{ORDER}:000002:ship"
    assert WaitingStep.from_row_key(STEP.row_key) == STEP
    # Step names never hold ':' (shared/core/workflows/schema.py NAME): a fourth part marks a compensation.
    undo = WaitingStep(ORDER, 3, "ship", "compensation")
    assert undo.row_key == f"{ORDER}:000003:ship:compensation"
    assert WaitingStep.from_row_key(undo.row_key) == undo


def test_register_list_and_forget_are_idempotent() -> None:
    store = MemoryStore()
    register_waiting(store, "shipping", STEP, T0)
    register_waiting(store, "shipping", STEP, T0)  # a redelivered request
    other = WaitingStep("f" * 32, 1, "ship")
    register_waiting(store, "shipping", other, T0)
    assert waiting_steps(store, "shipping") == [STEP, other]
    assert waiting_steps(store, "payment") == []
    forget_waiting(store, "shipping", [STEP, STEP, WaitingStep("e" * 32, 1, "ship")])  # one never registered
    assert waiting_steps(store, "shipping") == [other]
    assert store.read_row(waiting_partition("shipping"), other.row_key) is not None


def test_forgetting_more_than_a_transaction_holds_goes_in_chunks() -> None:
    store = MemoryStore()
    steps = [WaitingStep(f"{i:032x}", 1, "ship") for i in range(250)]
    for step in steps:
        register_waiting(store, "shipping", step, T0)
    forget_waiting(store, "shipping", steps[:240] + [WaitingStep("f" * 32, 9, "gone")])
    assert waiting_steps(store, "shipping") == steps[240:]


def test_hold_while_closed_calls_and_registers_nothing() -> None:
    store = MemoryStore()
    gate = BreakerGate(store, "shipping", POLICY, "a", MemoryBus(), "alerts", now=lambda: T0)
    assert hold(gate, STEP).admission == "call"
    assert waiting_steps(store, "shipping") == []


def test_hold_while_open_registers_the_step_for_the_closer() -> None:
    store = MemoryStore()
    gate = opened(store)
    decision = hold(gate, STEP)
    assert decision.admission == "wait" and decision.until == T0 + POLICY.cool_down
    assert close_now(store) == [STEP]


class BeforeRegistering(MemoryStore):
    """Runs ``hook`` once, just before (or after) the waiting row is written."""

    def __init__(self, hook: Callable[[MemoryStore], None], after: bool = False) -> None:
        super().__init__()
        self.hook: Callable[[MemoryStore], None] | None = hook
        self.after = after

    def transact(self, order_id: str, ops: Sequence[Op]) -> None:
        hook = self.hook if order_id == waiting_partition("shipping") and ops[0].kind == "create" else None
        if hook is not None and not self.after:
            self.hook = None
            hook(self)
        super().transact(order_id, ops)
        if hook is not None and self.after:
            self.hook = None
            hook(self)


def test_a_close_before_the_step_registers_is_seen_by_its_second_read() -> None:
    seen: list[list[WaitingStep]] = []
    store = BeforeRegistering(lambda s: seen.append(close_now(s)))
    gate = opened(store)
    decision = hold(gate, STEP)
    assert seen == [[]]  # the closer listed nothing...
    assert decision.admission == "call"  # ...and the step goes on by itself
    assert waiting_steps(store, "shipping") == []


def test_a_close_after_the_step_registers_is_seen_by_the_closer() -> None:
    seen: list[list[WaitingStep]] = []
    store = BeforeRegistering(lambda s: seen.append(close_now(s)), after=True)
    gate = opened(store)
    decision = hold(gate, STEP)
    assert seen == [[STEP]]  # the closer resumes it (and the scheduler's fencing drops the second go)
    assert decision.admission == "call"
    assert waiting_steps(store, "shipping") == []
