"""The chaos run's reading of the remote services' ledger, generation by generation.

An operator's restart of a failed and compensated order runs it as generation 1, 2 ... with fresh
idempotency keys: ``{orderId}:{step}`` (generation 0), ``{orderId}:g{n}:{step}``, and
``{stepKey}:compensate`` for a compensation. Every generation before an order's last must be
undone (each effect compensated exactly once, nothing that cannot be undone applied); the last is
judged as an order that never restarted (Processed: every step once; Error: compensated, or held).
A key that names no step or generation of its order is an error of its own. Each order is read
against its own workflow's steps (``StepEffects``, from ``effects_for(name, version)``; a parallel
step's branches have keys of their own, the group none).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from local.stack import SERVICE_PATHS
from shared.core.workflows import AGENTS_BY_NAME, DEFAULT_WORKFLOW, LEGACY_VERSION, Workflow, load_registry

COMPENSATE_SUFFIX = ":compensate"
_GENERATION = re.compile(r"g(\d+):(.+)")

# Step -> (service, forward operation, compensation operation or None), from a workflow.
StepEffects = dict[str, tuple[str, str, str | None]]
Effect = tuple[str, str]  # (service, operation)


def step_effects(workflow: Workflow) -> StepEffects:
    """What each step of ``workflow`` does to the remote services (the simulator's ledger)."""
    return {s.name: (SERVICE_PATHS[AGENTS_BY_NAME[s.agent].service_url_setting], s.operation, s.compensation)
            for s in workflow.steps if s.kind == "call"}


# Every loaded workflow version's effects; an order that names none ran order v1.
WORKFLOW_EFFECTS: dict[tuple[str, int], StepEffects] = {wf.key: step_effects(wf) for wf in load_registry().all()}
STEP_EFFECTS: StepEffects = WORKFLOW_EFFECTS[(DEFAULT_WORKFLOW, LEGACY_VERSION)]


def effects_for(name: str | None = None, version: int | None = None) -> StepEffects:
    """The step effects of workflow ``name`` ``version`` (none: order v1; no version: its highest)."""
    name = name or DEFAULT_WORKFLOW
    if version is None:
        version = max(v for n, v in WORKFLOW_EFFECTS if n == name)
    return WORKFLOW_EFFECTS[(name, version)]


def view_effects(view: Mapping[str, Any] | None) -> StepEffects:
    """The step effects of the workflow an order's view names (``"workflow": {"name", "version"}``)."""
    named = (view or {}).get("workflow") or {}
    return effects_for(named.get("name"), named.get("version") or (LEGACY_VERSION if not named else None))


def step_key(order_id: str, step: str, generation: int) -> str:
    """The idempotency key every attempt of ``step`` is sent with in ``generation``."""
    return f"{order_id}:{step}" if generation == 0 else f"{order_id}:g{generation}:{step}"


@dataclass(frozen=True)
class KeyInfo:
    generation: int
    step: str
    compensation: bool


def parse_key(order_id: str, key: str, effects: StepEffects = STEP_EFFECTS) -> KeyInfo | None:
    """What an idempotency key of ``order_id`` addresses (a step of ``effects``), or None if it is
    not one of its keys."""
    if not key.startswith(order_id + ":"):
        return None
    rest = key[len(order_id) + 1:]
    compensation = rest.endswith(COMPENSATE_SUFFIX)
    if compensation:
        rest = rest[: -len(COMPENSATE_SUFFIX)]
    generation = 0
    m = _GENERATION.fullmatch(rest)
    if m:
        generation, rest = int(m.group(1)), m.group(2)
        if generation == 0 or m.group(1) != str(generation):
            return None  # generation 0 has no prefix; no leading zeros
    if rest not in effects:
        return None
    return KeyInfo(generation, rest, compensation)


def _entry_problem(entry: dict[str, Any], info: KeyInfo | None, effects: StepEffects) -> str | None:
    """Why a ledger entry's key does not fit its service and operation (None: it fits)."""
    if info is None:
        return "not a key of its order (orderId[:g<n>]:step[:compensate] of its workflow)"
    svc, forward, comp = effects[info.step]
    op = comp if info.compensation else forward
    if (entry.get("service"), entry.get("operation")) != (svc, op):
        return f"the key is for {svc}/{op}"
    target = entry.get("compensates")
    if info.compensation and target is not None and target != step_key(entry["orderId"], info.step, info.generation):
        return f"compensates {target!r}, not the step of its own key"
    return None


@dataclass
class OrderEffects:
    """One order's ledger entries: effects and tombstones per generation, where each (generation,
    effect) was first applied (its ledger ``seq``), and its workflow's steps to read them by."""

    effects: dict[int, Counter[Effect]] = field(default_factory=lambda: defaultdict(Counter))
    tombstones: dict[int, Counter[Effect]] = field(default_factory=lambda: defaultdict(Counter))
    first_seq: dict[tuple[int, Effect], int] = field(default_factory=dict)
    steps: StepEffects = field(default_factory=lambda: STEP_EFFECTS)

    def generations(self) -> set[int]:
        return {g for g, c in self.effects.items() if c} | {g for g, c in self.tombstones.items() if c}

    def applied(self, g: int, step: str) -> int:
        svc, op, _ = self.steps[step]
        return self.effects[g][(svc, op)]

    def undone(self, g: int, step: str) -> int:
        svc, _, comp = self.steps[step]
        return self.effects[g][(svc, comp)] if comp else 0

    def tombstoned(self, g: int, step: str) -> int:
        svc, _, comp = self.steps[step]
        return self.tombstones[g][(svc, comp)] if comp else 0

    def compensated_once(self, g: int, step: str) -> bool:
        """The step's effect in generation g undone exactly once by its key: a compensation if it
        was applied, a tombstone if not."""
        return self.undone(g, step) + self.tombstoned(g, step) == 1 and self.undone(g, step) == self.applied(g, step)

    def undone_at(self, g: int, step: str) -> int | None:
        """The ledger ``seq`` of the step's compensation in generation g (None: not applied)."""
        svc, _, comp = self.steps[step]
        return self.first_seq.get((g, (svc, comp))) if comp else None


def split_ledger(ledger: Iterable[dict[str, Any]], effects_of: Mapping[str, StepEffects] | None = None,
                 ) -> tuple[dict[str, OrderEffects], list[dict[str, Any]]]:
    """Ledger entries by order and generation, and the entries whose key is unexpected; each
    order's keys are read against its workflow's steps (``effects_of[orderId]``, else order v1).

    An entry with an unexpected key still counts (as generation 0, or its parsed generation),
    so no other check is weakened by it."""
    orders: dict[str, OrderEffects] = defaultdict(OrderEffects)
    orders.update({oid: OrderEffects(steps=steps) for oid, steps in (effects_of or {}).items()})
    unexpected: list[dict[str, Any]] = []
    for pos, e in enumerate(ledger):
        oid, key = e["orderId"], str(e.get("idempotencyKey"))
        effects = (effects_of or {}).get(oid, STEP_EFFECTS)
        info = parse_key(oid, key, effects)
        problem = _entry_problem(e, info, effects)
        if problem:
            unexpected.append({"orderId": oid, "service": e.get("service"), "operation": e.get("operation"),
                               "idempotencyKey": key, "problem": problem})
        generation, effect = info.generation if info else 0, (e["service"], e["operation"])
        if e.get("kind") == "tombstone":
            orders[oid].tombstones[generation][effect] += 1
            continue
        orders[oid].effects[generation][effect] += 1
        seq = e.get("seq")
        orders[oid].first_seq.setdefault((generation, effect), seq if isinstance(seq, int) else pos + 1)
    return orders, unexpected


@dataclass
class UndoTally:
    """Generations that had to be undone, and how their compensations went."""

    needed: int = 0
    applied: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)
    shipped: list[dict[str, Any]] = field(default_factory=list)  # an effect with no compensation
    orders_with_effects: set[str] = field(default_factory=set)

    def check_undone(self, oid: str, fx: OrderEffects, generation: int) -> None:
        """Every effect ``generation`` applied (a step of the order's) must be compensated exactly once."""
        for name, (_, _, comp) in fx.steps.items():
            if not fx.applied(generation, name):
                continue
            if comp is None:
                self.shipped.append({"orderId": oid, "step": name, "generation": generation})
                continue
            self.needed += 1
            self.orders_with_effects.add(oid)
            if fx.undone(generation, name) == 1:
                self.applied += 1
            else:
                self.missing.append({"orderId": oid, "step": name, "generation": generation,
                                     "compensation": f"{fx.steps[name][0]}/{comp}",
                                     "applied": fx.undone(generation, name),
                                     "tombstones": fx.tombstoned(generation, name)})


def compensations_repeated(oid: str, fx: OrderEffects) -> list[dict[str, Any]]:
    """A compensation applied (or tombstoned) more than once in one generation."""
    return [{"orderId": oid, "effect": f"{svc}/{comp}", "generation": g, "times": n}
            for g in sorted(fx.generations()) for name, (svc, _, comp) in fx.steps.items()
            if (n := fx.undone(g, name) + fx.tombstoned(g, name)) > 1]


def expected_run(steps: StepEffects = STEP_EFFECTS) -> Counter[Effect]:
    """The effects of one successful run: each step's forward operation once."""
    return Counter({(svc, op): 1 for svc, op, _ in steps.values()})


def compact_history(view: dict[str, Any] | None, limit: int = 60) -> list[str]:
    """An order's history (from its view) as short lines, for a report's notes."""
    lines = []
    for ev in (view or {}).get("history") or []:
        parts = [str(ev.get("seq", "?")), str(ev.get("at", ""))[11:23], str(ev.get("event"))]
        if ev.get("step"):
            parts.append(f"{ev['step']}#{ev.get('attempt', '')}")
        if ev.get("detail"):
            parts.append(str(ev["detail"]))
        lines.append(" ".join(parts))
    return lines[-limit:]


def parse_time(value: Any) -> datetime | None:
    """An ISO time (``Z`` or an offset; naive: UTC), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def generations(history: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """An order's history cut at each ``restarted`` event: one list per generation."""
    out: list[list[Mapping[str, Any]]] = [[]]
    for ev in history:
        if ev.get("event") == "restarted":
            out.append([])
        out[-1].append(ev)
    return out
