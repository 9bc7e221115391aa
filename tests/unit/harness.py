"""Test harness for the core: a controllable clock, a runtime that can crash after k effects,
an agent simulator that plays the agents' side (idempotent remote effects, replies), and a
driver that delivers messages and runs the Supervisor until an order settles.

The store may be the in-memory twin (unit tests) or the real Table Storage on Azurite
(integration tests); the bus is the in-memory recorder unless a test passes another one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.api.orders import submit
from shared.core import fence
from shared.core.effects import Effect, Reindex, Send
from shared.core.messages import OutMessage
from shared.core.rows import ETAG, STATE_ROW
from shared.core.statemachine import Config
from shared.core.workflows import DEFAULT_WORKFLOW, LEGACY_VERSION, Registry, Step, load_registry
from shared.core.workflows.lanes import PRIORITIES
from shared.messaging import MemoryBus
from shared.runtime import Runtime
from shared.runtime.executor import Outcome, execute
from shared.scheduler import handle_reply, handle_schedule
from shared.settings import REQUIRED_SETTINGS, TOKEN_KEYS, Settings, parse_token_keys
from shared.storage.memory import MemoryStore
from shared.storage.store import Store
from shared.supervisor import sweep

T0 = datetime(2026, 11, 22, 8, 0, 0, tzinfo=UTC)
# The steps of workflow order v1 (workflows/order.v1.yaml): what most tests run.
WORKFLOW: tuple[Step, ...] = load_registry().get(DEFAULT_WORKFLOW, LEGACY_VERSION).steps

BODY = {"customerId": "c-1", "currency": "EUR",
        "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 9.99}], "priority": "normal", "statusQueue": None}
JSON_HEADERS = {"Content-Type": "application/json"}


class Crash(BaseException):  # BaseException: nothing in the app catches it, like a process kill
    pass


class Clock:
    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class DedupBus(MemoryBus):
    """MemoryBus with Service Bus duplicate detection on message_id (per queue)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()
        self.sent_count = 0

    def send(self, message: OutMessage) -> None:
        key = (message.queue, message.message_id)
        self.sent_count += 1
        if key in self.seen and message.queue != "order-status":
            return
        super().send(message)
        self.seen.add(key)


class CrashRuntime(Runtime):
    """``crash_at = k``: the next ``run`` executes only its first k effects, then 'the process dies'."""

    crash_at: int | None = None
    crash_exhausted: bool = False

    def run(self, effects: list[Effect], limit: int | None = None) -> Outcome:
        check_index_before_sends(effects)
        if self.crash_at is not None:
            k, self.crash_at = self.crash_at, None
            if k >= len(effects):
                self.crash_exhausted = True
            execute(effects, self.store, self.bus, keys=self.keys, limit=k)
            raise Crash(f"crashed after {k} of {len(effects)} effects")
        return super().run(effects, limit)


# The tests' fixed token key (TokenKeys, 32 bytes): known to every test, never given to a deployment.
TEST_TOKEN_KEYS = base64.b64encode(b"tests/unit/harness.py: token key").decode("ascii")
TEST_KEYS = parse_token_keys(TEST_TOKEN_KEYS)
# The required settings (no default) at values no test calls: the workflow tests need only a Config.
REQUIRED_VALUES = {s.name: TEST_TOKEN_KEYS if s.name == TOKEN_KEYS else f"http://{s.name.lower()}.invalid"
                   for s in REQUIRED_SETTINGS}


def config(workflow: tuple[Step, ...] = WORKFLOW, registry: Registry | None = None, **overrides: Any) -> Config:
    """The settings' config for ``workflow`` (as order v1, alone), or for every workflow of
    ``registry`` when one is given (e.g. ``shared.core.workflows.load_registry()``: order and digital)."""
    settings = Settings.from_env(REQUIRED_VALUES)
    base = Config.from_settings(settings, registry=registry) if registry else Config.from_settings(settings, workflow)
    return replace(base, **overrides)


def make_runtime(store: Store | None = None, bus: MemoryBus | None = None, clock: Clock | None = None,
                 workflow: tuple[Step, ...] = WORKFLOW, instance: str = "instance-a", registry: Registry | None = None,
                 **overrides: Any) -> CrashRuntime:
    return CrashRuntime(store=store or MemoryStore(), bus=bus if bus is not None else DedupBus(),
                        config=config(workflow, registry, **overrides), keys=TEST_KEYS, instance_id=instance,
                        clock=clock or Clock())


def post(rt: Runtime, body: Any = None, headers: dict[str, str] | None = None, max_bytes: int = 65536):  # type: ignore[no-untyped-def]
    raw = body if isinstance(body, bytes) else json.dumps(BODY if body is None else body).encode()
    return submit(rt, raw, {**JSON_HEADERS, **(headers or {})}, max_bytes=max_bytes)


def redriven(rt: Runtime, **post_kwargs: Any) -> str:
    """An order whose first request was lost, timed out and redriven by the Supervisor: Pending,
    unclaimed, its schedule message in the scheduler queue (a new order needs none: the
    submission claims it). Needs a bus with ``fail`` (MemoryBus)."""
    fail: set[str] = rt.bus.fail  # type: ignore[attr-defined]
    first = rt.config.agent_queue(rt.config.workflow[0])
    fail.add(first)
    try:
        r = post(rt, **post_kwargs)
    finally:
        fail.discard(first)
    assert r.status == 202, r.body
    oid = str(r.body["orderId"])
    rt.clock.advance(rt.config.timeout(rt.config.workflow[0]).total_seconds() + 1)  # type: ignore[attr-defined]
    assert sweep(rt).acted == {"redriven": 1}
    st = state(rt, oid)
    assert (st["ProcessState"], st["LeaseKey"], st.get("LockedBy")) == ("Pending", "unclaimed", None)
    return oid


def state(rt: Runtime, order_id: str) -> dict[str, Any]:
    row = rt.store.read_row(order_id, STATE_ROW)
    assert row is not None
    return row


def steps(rt: Runtime, order_id: str) -> dict[str, dict[str, Any]]:
    rows = rt.store.read_partition(order_id)
    return {r["Name"]: r for k, r in rows.items() if k.startswith("step-")}


# ---------------------------------------------------------------------------------------------
@dataclass
class AgentSim:
    """Plays the agents: reads requests off the agent queues, applies each idempotency key's
    effect once (like the remote services), replies. ``reject`` maps step name (or
    'step:compensate') to a reason for a permanent error; ``hang`` drops requests for those
    steps (a hung agent: no call, no reply); ``lost`` applies the effect but drops the reply
    (the response was lost, or the agent hung after the call).

    Compensations behave like the remote services (docs/contracts.md): the effect to undo is
    found by ``compensates.idempotencyKey``. If nothing was applied under that key, the answer
    is "nothing to undo" (recorded in ``tombstones``, not in ``calls``) and the key is
    tombstoned: a later original request with it gets an error reply and applies nothing."""

    rt: Runtime
    reject: dict[str, str] = field(default_factory=dict)
    hang: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    effects: dict[str, dict[str, Any]] = field(default_factory=dict)  # idempotency key -> result
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (orderId, step, operation) applied
    tombstones: list[tuple[str, str, str]] = field(default_factory=list)  # compensations of nothing
    tombstoned: set[str] = field(default_factory=set)  # original idempotency keys
    compensation_bodies: list[dict[str, Any]] = field(default_factory=list)
    pending_replies: list[OutMessage] = field(default_factory=list)
    # step name (or 'step:compensate') -> how many more requests find its remote's breaker open:
    # the agent makes no call and replies ``waiting`` (wake-up at now + 5 s, on the breaker's first
    # opening, as a gate tells it: without ``opening`` the reply would be a rate limit's).
    breaker_open: dict[str, int] = field(default_factory=dict)
    # Echo each request's fencing token in its reply, like the real agent (shared.agent.replies);
    # False plays an agent from before tokens: every reply is decided on a read.
    echo_fence: bool = True

    def queues(self) -> list[str]:
        """Every agent request queue, on every priority lane."""
        cfg = self.rt.config
        return sorted({cfg.agent_queue(s, p) for wf in cfg.registry.all() for s in wf.steps
                       if s.kind == "call" for p in PRIORITIES})

    def work(self, now: datetime) -> int:
        n = 0
        for q in self.queues():
            for req in self.rt.bus.take(q):  # type: ignore[attr-defined]
                n += 1
                self._handle(req, now)
        return n

    def _handle(self, req: OutMessage, now: datetime) -> None:
        body = req.body
        check_token(self.rt, body)
        complete_by = datetime.fromisoformat(body["completeBy"])
        if now > complete_by:
            return  # expired (TTL) or past completeBy: the agent sends nothing
        key = f"{body['step']}:compensate" if body["kind"] == "compensation" else body["step"]
        if key in self.hang:
            return
        if self.breaker_open.get(key, 0) > 0:
            self.breaker_open[key] -= 1
            self._reply(req, {"outcome": "waiting", "breaker": "remote-of-" + body["step"],
                              "until": (now + timedelta(seconds=5)).isoformat(), "wake": True, "opening": 1})
            return
        idem = body["idempotencyKey"]
        target = (body.get("compensates") or {}).get("idempotencyKey")
        if body["kind"] == "compensation":
            self.compensation_bodies.append(body)
        if key in self.reject:
            outcome, result, reason = "error", None, self.reject[key]
        elif body["kind"] == "step" and idem in self.tombstoned and idem not in self.effects:
            outcome, result, reason = "error", None, "compensated"  # 409: refused, nothing applied
        else:
            if idem not in self.effects:
                if target is not None and target not in self.effects:
                    self.effects[idem] = {"id": None, "nothingToUndo": True}
                    self.tombstoned.add(target)
                    self.tombstones.append((body["orderId"], body["step"], body["operation"]))
                else:
                    self.effects[idem] = {"id": f"{body['operation']}-{len(self.effects) + 1}"}
                    self.calls.append((body["orderId"], body["step"], body["operation"]))
            outcome, result, reason = "success", self.effects[idem], None
        if key in self.lost:
            return
        self._reply(req, {"outcome": outcome, "result": result, "reason": reason})

    def _reply(self, req: OutMessage, fields: dict[str, Any]) -> None:
        body = req.body
        reply = {"kind": body["kind"], "orderId": body["orderId"], "step": body["step"], "attempt": body["attempt"],
                 **fields}
        if self.echo_fence and "fence" in body:
            reply["fence"] = body["fence"]
        self.pending_replies.append(OutMessage(queue=req.reply_to or "replies", body=reply,
                                               message_id=f"reply:{req.message_id}",
                                               correlation_id=req.message_id))

    def reply_all(self) -> list[str]:
        out = []
        while self.pending_replies:
            msg = self.pending_replies.pop(0)
            out.append(handle_reply(self.rt, json.dumps(msg.body).encode(), message_id=msg.message_id))
        return out


def check_index_before_sends(effects: list[Effect]) -> None:
    """A decision writes the order's search index rows before any message that moves the order on
    (a request, a schedule notice, a wake-up; a status message does not). Else the transition those
    messages cause can write its own index rows first, and this decision's rows, landing after,
    undo them: an order Processed and still listed in flight. Checked on every decision a
    ``CrashRuntime`` runs."""
    moved = next((i for i, e in enumerate(effects) if isinstance(e, Send) and not e.what.startswith("status ")), None)
    late = [e for e in effects[len(effects) if moved is None else moved:] if isinstance(e, Reindex)]
    kinds = [f"{type(e).__name__}:{e.what}" if isinstance(e, Send) else type(e).__name__ for e in effects]
    assert not late, f"a search index write after a message that moves the order on: {kinds}"


def check_token(rt: Runtime, body: dict[str, Any]) -> None:
    """A request's fencing token holds the rows its write left: while the order's state row still
    has the token's ETag (nothing wrote since), they are exactly what a read would return. Checked
    on every request an ``AgentSim`` takes, in every test that uses one (in-memory store)."""
    if "fence" not in body or not isinstance(rt.store, MemoryStore):
        return
    rows = fence.decode(rt.keys, body["orderId"], body["fence"])
    now = rt.store.peek_partition(body["orderId"])
    if STATE_ROW in now and rows[STATE_ROW][ETAG] == now[STATE_ROW][ETAG]:
        assert rows == now, "a fencing token whose state ETag is current must hold the current rows"


def deliver_schedules(rt: Runtime) -> list[str]:
    """Handle the due messages of the scheduler queue of every priority lane."""
    now = rt.clock()
    out = []
    for q in sorted({rt.config.lane_queue("SchedulerQueue", p) for p in PRIORITIES}):
        msgs = rt.bus.take(q)  # type: ignore[attr-defined]
        later = []
        for m in msgs:
            if m.scheduled_enqueue_time and m.scheduled_enqueue_time > now:
                later.append(m)
                continue
            out.append(handle_schedule(rt, json.dumps(m.body).encode(), message_id=m.message_id))
        for m in later:
            rt.bus.sent[q].append(m)  # type: ignore[attr-defined]
    return out


TERMINAL = ("Processed",)


def settled(st: dict[str, Any]) -> bool:
    return st.get("Mode") in ("finished", "held") and not st.get("LockedBy")


def drive(rt: Runtime, order_id: str, agents: AgentSim, *, max_rounds: int = 200, tick: float = 10.0,
          until: Callable[[dict[str, Any]], bool] = settled) -> dict[str, Any]:
    """Deliver messages, let the agents work, sweep; advance time when idle. Returns the state."""
    clock = rt.clock
    for _ in range(max_rounds):
        st = state(rt, order_id)
        if until(st):
            return st
        busy = bool(deliver_schedules(rt))
        busy |= bool(agents.work(clock()))
        busy |= bool(agents.reply_all())
        if not busy:
            clock.advance(tick)  # type: ignore[attr-defined]
            sweep(rt)
    raise AssertionError(f"order {order_id} did not settle: {state(rt, order_id)}")
