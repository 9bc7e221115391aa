"""One order's partition, read in one query, as typed rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from shared.core.rows import ORDER_ROW, STATE_ROW, Op, OrderRow, StateRow, StepRow
from shared.core.states import StepState


@dataclass(frozen=True)
class View:
    order: OrderRow | None
    state: StateRow | None
    steps: tuple[StepRow, ...]  # in workflow order

    @classmethod
    def from_entities(cls, entities: Mapping[str, Mapping[str, Any]]) -> View:
        """The store's entities of one partition (RowKey -> entity), converted."""
        order = entities.get(ORDER_ROW)
        state = entities.get(STATE_ROW)
        steps = (StepRow.from_entity(e) for key, e in entities.items() if key.startswith("step-"))
        return cls(OrderRow.from_entity(order) if order is not None else None,
                   StateRow.from_entity(state) if state is not None else None,
                   tuple(sorted(steps, key=lambda s: s.index)))

    @property
    def order_id(self) -> str:
        assert self.state is not None
        return self.state.order_id

    @property
    def traceparent(self) -> str | None:
        return self.order.traceparent if self.order is not None else None

    @property
    def trace_id(self) -> str | None:
        """The trace id field of the order's stored traceparent (validated when it was stored): 32
        hex digits, the operation id of the order's telemetry in Application Insights."""
        fields = self.traceparent.split("-") if self.traceparent else []
        return fields[1] if len(fields) == 4 else None

    def step(self, name: str) -> StepRow | None:
        return next((s for s in self.steps if s.name == name), None)

    def step_at(self, index: int) -> StepRow | None:
        return next((s for s in self.steps if s.index == index), None)

    def after(self, index: int) -> StepRow | None:
        """The step that runs after step ``index``, if any (a Skipped step never runs)."""
        return next((s for s in self.steps if s.index > index and s.state is not StepState.SKIPPED), None)

    def with_steps(self, *changed: StepRow) -> View:
        """This view with some step rows replaced by their new versions (same index)."""
        by_index = {s.index: s for s in self.steps} | {s.index: s for s in changed}
        return replace(self, steps=tuple(by_index[i] for i in sorted(by_index)))

    def replacing(self, rows: Iterable[StepRow]) -> list[Op]:
        """The ops that write ``rows`` over this view's rows of the same index (their ETags)."""
        out = []
        for row in rows:
            old = self.step_at(row.index)
            assert old is not None
            out.append(row.replacing(old))
        return out

    def with_state(self, state: StateRow) -> View:
        return replace(self, state=state)
