"""The chaos run's records (bench.chaos): its options, order records, approval plans, and the runner its parts use."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import requests

from local.host.keys import ADMIN
from local.procs import REPO_ROOT
from shared.core.workflows import DEFAULT_WORKFLOW

if TYPE_CHECKING:
    from local.stack import Stack

DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "chaos.json"


# ---- options and records ----------------------------------------------------------------------


def _opt(default: Any, help: str | None = None) -> Any:  # noqa: A002
    """A run option: its default, and what ``python -m bench.chaos --help`` says of it."""
    return field(default=default, metadata={"help": help})


@dataclass
class ChaosOptions:
    """The run's options; each but the last two is an option of ``python -m bench.chaos``."""

    orders: int = 2000
    seed: int | None = _opt(None, "default: random (printed)")
    instances: int = _opt(2, "host instances (>= 2)")
    rate: float = _opt(8.0, "orders posted per second")
    out: Path | None = _opt(DEFAULT_OUT, "JSON report ('' for none)")
    state_dir: Path | None = _opt(None, "stack state and logs (default .local/chaos/<time>-seed<S>)")
    step_timeout: int = _opt(4, "StepTimeoutSeconds")
    supervisor_schedule: str = "*/1 * * * * *"
    kills: int | None = _opt(None, "host instance SIGKILLs (default max(2, orders/200))")
    duplicate_submit_rate: float = _opt(0.05, "share of orders POSTed twice (same Idempotency-Key)")
    duplicate_delivery_rate: float = _opt(0.05, "share of orders whose request and reply get a copy")
    transient_rate: float = 0.2
    lost_response_rate: float = 0.05
    hang_rate: float = 0.05
    hang_seconds: float | None = _opt(None, "default step timeout + 3 (past CompleteBy)")
    reject_rate: float = _opt(0.02, "share of orders the remotes reject for good (half SKU, half amount)")
    outage_seconds: float = _opt(20.0, "one shipping outage window (0: none)")
    restart_servicebus: bool = True
    restart_azurite: bool = True
    settle_timeout: float = _opt(30.0, "after the last POST, with faults still on (s)")
    drain_timeout: float = _opt(300.0, "after faults are turned off (s)")
    operator_retry: bool = _opt(True, "at the end, retry orders held for an operator (POST /retry), as one would")
    terminate_rate: float = _opt(0.03, "share of orders the operator terminates (POST /orders/{id}/terminate)")
    terminate_within: float = _opt(4.0, "... at a random moment within this many seconds of acceptance")
    operator_restarts: bool = _opt(True, "restart the orders rejected for good once they failed (new generation)")
    fixable_rate: float = _opt(0.01, "share of orders with a cause of their own the operator fixes, then restarts")
    digital_share: float = _opt(0.0, 'share of orders that name "workflow": "digital" (licence, charge, delivery)')
    express_share: float = _opt(0.15, 'share of orders that name "workflow": "express" (reserve and charge at '
                                      'once, then ship)')
    approval_share: float = _opt(0.1, "share of orders made to wait for approval (on time, early, late, twice, "
                                      "declined, never)")
    approval_timeout: int = _opt(30, "every wait step's timeoutSeconds in the run's own copy of workflows/ (s)")
    bulk_orders: int = _opt(0, "orders failed on a cause of their own, then retried by ONE bulk operation (POST "
                               "/api/operations) while a host instance is killed (0: none)")
    bulk_per_tick: int = _opt(1, "BulkOrdersPerTick of the stack with --bulk-orders (the POST acts on 25 itself)")
    rate_limits: str = _opt("", "remotes' calls a second, e.g. delivery=4/s: told to the app (RemoteRateLimits) and "
                                "enforced by the simulator (429 above it)")
    burst_orders: int = _opt(0, "orders of one customer, besides --orders, posted at once mid-run (a bursting "
                                "customer)")
    customer_max_in_flight: int = _opt(0, "CustomerMaxInFlight of the stack (0: no cap)")
    echo: bool = _opt(False, "echo the stack's output to stderr")
    progress_every: float = 2.0
    post_retry_seconds: float = 120.0  # how long one POST is retried (restarts, killed instances)

    def rates(self) -> dict[str, float]:
        """--rate-limits as {remote: calls a second} (the app's own parser: ValueError if malformed)."""
        from shared.core.workflows.catalog import AGENTS
        from shared.core.workflows.ratelimits import parse_limits

        limits = parse_limits(self.rate_limits, tuple(a.name for a in AGENTS), "--rate-limits")
        return {name: limit.per_second for name, limit in limits.items() if limit is not None}

    def resolved(self) -> ChaosOptions:
        o = ChaosOptions(**asdict(self))
        if o.seed is None:
            o.seed = random.SystemRandom().randrange(1, 2**31)
        if o.kills is None:
            o.kills = max(2, o.orders // 200)
        if o.hang_seconds is None:
            o.hang_seconds = float(o.step_timeout + 3)
        if o.instances < 2:
            raise ValueError("--instances must be at least 2")
        if o.orders < 1 or o.rate <= 0:
            raise ValueError("--orders and --rate must be positive")
        if not (0 <= o.terminate_rate <= 1 and 0 <= o.fixable_rate <= 1) or o.terminate_within < 0:
            raise ValueError("--terminate-rate and --fixable-rate must be 0..1, --terminate-within >= 0")
        o.rates()  # a limit that is not NAME=N/s for an agent: refused here, naming the item
        if o.burst_orders < 0 or o.customer_max_in_flight < 0:
            raise ValueError("--burst-orders and --customer-max-in-flight must be >= 0")
        if not 0 <= o.digital_share <= 1:
            raise ValueError("--digital-share must be 0..1")
        if not 0 <= o.express_share <= 1 or o.digital_share + o.express_share > 1:
            raise ValueError("--express-share must be 0..1, and with --digital-share at most 1")
        if not 0 <= o.approval_share <= 1 or o.approval_timeout < 10:
            raise ValueError("--approval-share must be 0..1, --approval-timeout at least 10 (s)")
        if not 0 <= o.bulk_orders <= 10_000 or o.bulk_per_tick < 1:
            raise ValueError("--bulk-orders must be 0..10000, --bulk-per-tick at least 1")
        if o.state_dir is None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            o.state_dir = REPO_ROOT / ".local" / "chaos" / f"{stamp}-seed{o.seed}"
        return o


@dataclass
class OrderRec:
    index: int
    key: str  # Idempotency-Key
    body: dict[str, Any]
    reject: str | None  # "sku" | "amount" | None: designed to be rejected for good
    dup_submit: bool
    dup_delivery: bool
    workflow: str = DEFAULT_WORKFLOW  # the workflow the order's POST names (the default's is not named)
    burst: bool = False  # the bursting customer's: posted with the others of the burst, at once
    order_id: str | None = None
    post_status: int | None = None
    post_error: str | None = None
    accepted_at: float | None = None
    view: dict[str, Any] | None = None
    next_poll: float = 0.0  # monotonic time of this order's next GET
    held_retry_status: int | None = None  # the operator retry's answer, if the order was held
    poll_interval: float = 0.0
    dup_submit_done: bool = False
    dup_submit_status: int | None = None
    dup_submit_order_id: str | None = None
    request_copy_sent: bool = False
    reply_copy_sent: bool = False
    # the operator (bench.chaos_operator): what it planned for the order and what it did
    terminate_after: float | None = None  # seconds after acceptance; None: not terminated
    terminate_status: int | None = None  # the terminate's HTTP answer (None: none yet, or none at all)
    terminate_result: str | None = None  # 202: terminated | terminating | held; else the problem type
    terminate_state: str | None = None  # the processState the answer gave
    terminate_lost: int = 0  # terminate calls sent whose answer was lost
    terminate_gave_up: bool = False
    fix: str | None = None  # "restock" | "stall": a cause of the order's own, fixed by the operator
    fix_sku: str | None = None
    fixed: bool = False
    restarts_planned: int = 0
    restarts_tried: int = 0
    restarts_done: int = 0  # 202 "restarted"
    restarts_unanswered: int = 0  # restart calls whose answer was lost (each may have restarted it)
    redrives_tried: int = 0
    redrives_done: int = 0  # 202 "compensation-redriven"
    operator_actions: list[dict[str, Any]] = field(default_factory=list)
    approval: ApprovalPlan | None = None  # the order waits for an event: what the runner sends it (chaos_approvals)
    # express orders (bench.chaos_express): a designed path, and the SKU a remote hangs on for it
    express_plan: str | None = None  # "groupTerminate" | "pivotCancel"
    express_hold_sku: str | None = None
    cancel_status: int | None = None  # the operator's cancel (pivotCancel): its HTTP answer
    cancel_result: str | None = None
    cancel_lost: int = 0
    cancel_gave_up: bool = False
    request_copy_step: str | None = None  # the step whose request (or reply) the duplicate delivery copied
    reply_copy_step: str | None = None
    reply_copy_in_group: bool = False  # the reply copied was a branch's while another branch still ran
    bulk: bool = False  # retried by the run's bulk operation (bench.chaos_bulk)
    bulk_restarts: int = 0  # restarts the bulk operation was asked for (1 once it started)

    @property
    def state(self) -> str | None:
        return None if self.view is None else self.view.get("processState")

    def repoll(self) -> None:
        """Forget the last view and poll the order at once: an action may have changed it."""
        self.view, self.next_poll, self.poll_interval = None, 0.0, 0.0


def is_held(view: dict[str, Any] | None) -> bool:
    """Error, held for an operator (the on-failure policy ``hold``, or an unknown outcome that
    cannot be compensated): nothing is compensated until the operator retries or cancels."""
    return bool(view) and view.get("processState") == "Error" and view.get("outcome") == "held"  # type: ignore[union-attr]


def failed_and_undone(view: dict[str, Any] | None) -> bool:
    """Failed, every effect compensated (or none): what a retry restarts as a new generation."""
    if not view or view.get("processState") != "Error" or view.get("outcome") != "failed":
        return False
    comp = view.get("compensation") or {}
    return comp.get("state") in ("none", "completed") and not comp.get("pending")


def is_terminal(view: dict[str, Any] | None) -> bool:
    """Processed, or Error with no compensation still running (held, or compensations ended)."""
    if not view:
        return False
    ps = view.get("processState")
    if ps == "Processed":
        return True
    if ps == "Error":
        comp = view.get("compensation") or {}
        return comp.get("state") != "running" and not comp.get("pending")
    return False


# ---- an order's approval plan and what was sent (bench.chaos_approvals) -----------------------

# Expected answers (``result`` of a 202; a refusal is a 409 ``wrong-state``)
STEP_DONE, KEPT, DUPLICATE, COMPENSATING = "step-done", "event-kept", "event-duplicate", "compensating"
REFUSED = "409"
EXPECTED: dict[str, tuple[str, ...]] = {
    "approve": (STEP_DONE,), "early": (KEPT,), "decline": (COMPENSATING,), "copy": (DUPLICATE,),
    "different": (REFUSED,), "tooLate": (REFUSED,),
}
AT_ONCE = (STEP_DONE, DUPLICATE)  # an event and its copy sent at once: either may come first


@dataclass
class EventSend:
    """One event the runner sent (retried until it had an answer), and the answer."""

    what: str  # approve | early | decline | copy | different | tooLate
    generation: int
    key: str | None  # the Idempotency-Key (None: none sent)
    body: dict[str, Any]
    t: float = 0.0
    status: int | None = None
    result: str | None = None  # a 202's result, or "409"
    problem: str | None = None  # a refusal's problem type (its last path segment)
    lost: int = 0  # calls sent whose answer was lost (each may have been applied)
    pair: int | None = None  # sent at the same time as the send of this index (``twice``, concurrent)

    @property
    def expected(self) -> tuple[str, ...]:
        return AT_ONCE if self.pair is not None else EXPECTED[self.what]

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "generation": self.generation, "key": self.key, "t": self.t,
                "status": self.status, "result": self.result, "problem": self.problem, "lost": self.lost,
                "pair": self.pair, "expected": list(self.expected)}


@dataclass
class ApprovalPlan:
    kind: str  # one of bench.chaos_approvals.KINDS
    step: str  # the wait step's name
    event: str  # the event it waits for
    decision: str | None  # its decision field
    designed: bool = False  # waits because of a designed cause (a rejection, the operator's limit)
    unplanned: bool = False  # the run found it waiting with no plan (a check counts it)
    late_seconds: float = 0.0
    twice_by: str = "key"  # twice: "key" (same Idempotency-Key) or "body" (no key, same body)
    concurrent: bool = False  # twice: both copies at once
    hold_sku: str | None = None  # early: the SKU the inventory service hangs on until the event is answered
    sends: list[EventSend] = field(default_factory=list)
    handled: set[int] = field(default_factory=set)  # generations whose event was sent (or need none)
    seen: dict[int, float] = field(default_factory=dict)  # generation -> when the runner first saw it waiting

    def sent(self, what: str) -> bool:
        return any(s.what == what for s in self.sends)


# ---- the runner as its parts use it -------------------------------------------------------------


class ChaosRunner(Protocol):
    """What the run's parts (bench.chaos_operator, bench.chaos_approvals, bench.chaos_express,
    bench.chaos_bulk) use of the runner, bench.chaos.ChaosRun."""

    o: ChaosOptions
    lock: threading.Lock
    stop: threading.Event
    recs: list[OrderRec]
    faults: Counter[str]
    errors: list[str]  # infrastructure problems (the run is then not valid)
    stack: Stack | None

    def say(self, text: str) -> None: ...

    def elapsed(self) -> float: ...

    def event(self, kind: str, **info: Any) -> None: ...

    def session(self, level: str) -> requests.Session: ...

    def remove_remote_cause(self, cause: str, sku: str | None) -> None: ...

    def kill_instance(self) -> None: ...


# ---- calls to the API as an operator or a client, through kills and restarts --------------------


def answer_of(r: requests.Response) -> dict[str, Any]:
    """A response's JSON object; anything else as its ``detail``."""
    try:
        body = r.json()
    except ValueError:
        return {"detail": r.text[:300]}
    return body if isinstance(body, dict) else {"detail": str(body)[:300]}


def problem_of(body: dict[str, Any]) -> str | None:
    """A problem answer's type, its last path segment (``conflict``, ``wrong-state`` ...)."""
    return str(body.get("type") or "").rsplit("/", 1)[-1] or None


def changing(status: int, body: dict[str, Any]) -> bool:
    """409 "the order kept changing": no answer yet, asked again."""
    return status == 409 and problem_of(body) == "conflict"


def post_until_answered(run: ChaosRunner, url: str, level: str = ADMIN, *, timeout: float = 30,
                        again: Callable[[int, dict[str, Any]], bool] = changing,
                        **kw: Any) -> tuple[int | None, dict[str, Any], int]:
    """POST, retrying what is not an answer (no response from a killed instance, a 5xx or 429 from
    a restart, what ``again`` says) for ``post_retry_seconds``, backing off to 2 s. -> (status or
    None, its body, calls whose answer was lost: each may have been applied)."""
    lost, delay = 0, 0.25
    deadline = time.monotonic() + run.o.post_retry_seconds
    while time.monotonic() < deadline and not run.stop.is_set():
        try:
            r = run.session(level).post(url, timeout=timeout, **kw)
        except requests.RequestException:
            lost += 1
        else:
            body = answer_of(r)
            if r.status_code < 500 and r.status_code != 429 and not again(r.status_code, body):
                return r.status_code, body, lost
            lost += r.status_code >= 500
        run.stop.wait(delay)
        delay = min(delay * 2, 2.0)
    return None, {}, lost


class Actor:
    """A part of the run that owes orders actions (the operator, the approvals). ``due`` says what
    an order is owed now; ``loop`` takes it from a pool of 4 threads every 0.2 s until the run
    stops, one action at a time per order, then polls the order at once to see what it did."""

    name = "actor"  # (its threads' names, and its errors')

    def __init__(self, run: ChaosRunner) -> None:
        self.run = run
        self.busy: set[int] = set()  # the orders (by index) an action is being taken for

    def due(self, rec: OrderRec, now: float) -> str | None:
        raise NotImplementedError

    def act(self, rec: OrderRec, action: str) -> None:
        raise NotImplementedError

    def notice(self, rec: OrderRec, now: float) -> None:
        """What the part notes of an order each round, before asking what it is owed."""

    def pending(self, rec: OrderRec) -> bool:
        """Whether the part still owes ``rec`` something (the run is not settled)."""
        return rec.index in self.busy or self.due(rec, float("inf")) is not None

    def claim(self, rec: OrderRec, now: float) -> str | None:
        """(Under the run's lock.) The action ``rec`` is owed now, marked as being taken."""
        if not rec.order_id:
            return None
        self.notice(rec, now)
        if rec.index in self.busy:
            return None
        action = self.due(rec, now)
        if action is not None:
            self.busy.add(rec.index)
        return action

    def take(self, rec: OrderRec, action: str) -> None:
        try:
            self.act(rec, action)
        except Exception as e:  # noqa: BLE001
            self.run.errors.append(f"{self.name} {action} of {rec.order_id}: {type(e).__name__}: {e}")
        finally:
            with self.run.lock:
                self.busy.discard(rec.index)
                rec.next_poll = 0.0

    def loop(self) -> None:
        run = self.run
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix=self.name) as pool:
            while not run.stop.is_set():
                now = time.monotonic()
                with run.lock:
                    work = [(r, a) for r in run.recs if (a := self.claim(r, now)) is not None]
                for r, a in work:
                    pool.submit(self.take, r, a)
                run.stop.wait(0.2)
