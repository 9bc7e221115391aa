"""The demo ``make run`` posts: ordinary orders and, unless ``--no-failing-orders``, a few that fail
on purpose, so that history, search and the attention list have something to show.

Each failing order trips a fault the remote services simulator is given before the demo
(``DEMO_FAULTS``; ordinary orders never trip them, and they stay set after the demo). All of
them are customer ``c-failing``'s and end in ``GET /api/orders?state=attention`` with an alert:

* ``payment-declined``: 10 x SKU-5 (1299.50 EUR), over the payment service's limit of 1000.
  Over 1000, it waits for an approval (``order`` v2); the demo approves it as soon as it is
  posted (``POST /api/orders/{id}/events/approval``: kept until the wait starts). Then payment
  answers 422, the reservation is released, the order fails (compensated).
* ``shipment-hangs``: holds SKU-SLOW-SHIP, whose shipment never answers. Every attempt times
  out; the Supervisor redrives it until MaxFailureCount, then holds the order (a shipment has
  no compensation). That takes minutes, so the demo does not wait for it: the live line after
  the demo shows it move from inFlight to attention, and its alert is printed then.
* ``out-of-stock``: holds SKU-SOLD-OUT, which inventory rejects: 422, nothing to undo, failed.

With fewer orders than failing kinds, the first kinds only. The failing orders take evenly
spaced places among the ordinary ones, whose bodies stay those of ``demo_order`` draws.

The demo counts its orders by search category (``inFlight``, ``attention``, ``processed``,
``error``: the ``category`` of ``GET /api/orders/{id}``), the vocabulary of the live line that
follows it (``local.watch``), of the search and of the console, not by ``processState``: an
order that failed is in ``Error`` there, but ``attention`` here (an operator may retry it), and
``error`` is only for an order that ended with nothing left to do (cancelled, terminated).
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TextIO

import requests

from local.remotes.client import RemotesClient
from local.stackclient import DemoStack, StackError, demo_order
from local.watch import CATEGORIES

FAILING_CUSTOMER = "c-failing"
SOLD_OUT_SKU = "SKU-SOLD-OUT"
SLOW_SHIP_SKU = "SKU-SLOW-SHIP"
PAYMENT_LIMIT = "1000"
DIGITAL_EVERY = 4  # a quarter of the demo orders are digital goods
IN_FLIGHT = "inFlight"  # the one category that still moves by itself: the demo waits for its orders to leave it

# Per service, the faults the failing orders trip (a PUT replaces only the services named here).
DEMO_FAULTS: dict[str, dict[str, Any]] = {
    "inventory": {"rejectSkus": [SOLD_OUT_SKU]},
    "payment": {"rejectAmountOver": PAYMENT_LIMIT},
    "shipping": {"hangSkus": [SLOW_SHIP_SKU]},
}


@dataclass(frozen=True)
class FailingKind:
    name: str
    items: tuple[tuple[str, int, str], ...]  # (sku, quantity, unitPrice)
    story: str  # what happens to it, printed next to its order id
    awaited: bool = True  # the demo waits for it to end
    approve: bool = False  # the demo sends its approval event (order v2 waits for one over 1000)


FAILING_KINDS: tuple[FailingKind, ...] = (
    FailingKind("payment-declined", (("SKU-5", 10, "129.95"),),
                f"approved (over 1000), then payment declines 1299.50 EUR (limit {PAYMENT_LIMIT}): "
                "reservation released, failed (attention)", approve=True),
    FailingKind("shipment-hangs", (("SKU-1", 1, "9.99"), (SLOW_SHIP_SKU, 1, "24.00")),
                "its shipment never answers: timed out and redriven, then held (attention; takes minutes)",
                awaited=False),
    FailingKind("out-of-stock", ((SOLD_OUT_SKU, 2, "5.00"),), f"inventory rejects {SOLD_OUT_SKU}: failed (attention)"),
)


@dataclass(frozen=True)
class DemoOrder:
    body: dict[str, Any]
    failing: FailingKind | None = None

    @property
    def awaited(self) -> bool:
        return self.failing is None or self.failing.awaited


def failing_body(kind: FailingKind) -> dict[str, Any]:
    items = [{"sku": sku, "quantity": qty, "unitPrice": price} for sku, qty, price in kind.items]
    return {"customerId": FAILING_CUSTOMER, "currency": "EUR", "items": items, "priority": "normal",
            "statusQueue": None}


def failing_slots(kinds: int, orders: int) -> list[int]:
    """Evenly spaced, distinct places for ``kinds`` failing orders among ``orders`` (kinds <= orders)."""
    return [(i + 1) * orders // (kinds + 1) for i in range(kinds)]


def demo_plan(orders: int, rng: random.Random, failing: bool = True) -> list[DemoOrder]:
    """``orders`` demo orders; with ``failing``, up to one of each failing kind among them."""
    plan = [DemoOrder(_with_workflow(demo_order(rng), i)) for i in range(orders)]
    if failing:
        kinds = FAILING_KINDS[:orders]
        for kind, slot in zip(kinds, failing_slots(len(kinds), orders), strict=True):
            plan[slot] = DemoOrder(failing_body(kind), kind)
    return plan


def _with_workflow(body: dict[str, Any], i: int) -> dict[str, Any]:
    """Every ``DIGITAL_EVERY``-th demo order runs the ``digital`` workflow (a licence, a charge, a
    delivery), so the demo shows both; the others the default ``order`` workflow."""
    return {**body, "workflow": "digital"} if i % DIGITAL_EVERY == DIGITAL_EVERY - 1 else body


def set_demo_faults(remotes: RemotesClient) -> None:
    """Give the simulator the faults the failing orders trip."""
    for service, faults in DEMO_FAULTS.items():
        remotes.set_faults(service, **faults)


# ---- posting and progress ----------------------------------------------------------------------


class OrderTracker:
    """Polls orders' search categories over HTTP; thread-safe counts for a progress display."""

    def __init__(self, stack: DemoStack, workers: int = 8) -> None:
        self.stack = stack
        self.categories: dict[str, str] = {}
        self.unawaited: set[str] = set()  # orders the demo does not wait for
        self.post_errors: list[str] = []
        self.poll_errors = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="poll")
        self._local = threading.local()

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def add(self, order_id: str, category: str = IN_FLIGHT, awaited: bool = True) -> None:
        with self._lock:
            self.categories.setdefault(order_id, category)
            if not awaited:
                self.unawaited.add(order_id)

    def _poll_one(self, order_id: str) -> None:
        try:
            category = str(self.stack.get_order(order_id, session=self._session(), timeout=10)["category"])
        except (requests.RequestException, StackError, KeyError, ValueError):
            with self._lock:
                self.poll_errors += 1
            return
        with self._lock:
            self.categories[order_id] = category

    def poll(self) -> None:
        with self._lock:
            moving = [o for o, c in self.categories.items() if c == IN_FLIGHT]
        list(self._pool.map(self._poll_one, moving))

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self.categories.values())

    def done(self, total: int) -> bool:
        """Every awaited order left ``inFlight`` (or failed to post); the others were posted."""
        with self._lock:
            settled = sum(1 for o, c in self.categories.items() if c != IN_FLIGHT or o in self.unawaited)
        return settled + len(self.post_errors) >= total

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def by_category(counts: Counter[str]) -> str:
    """``inFlight 20 · attention 1 · processed 11 · error 0``, as the live line writes them (a
    category this module does not know, after them)."""
    extra = [f"{c} {n}" for c, n in sorted(counts.items()) if c not in CATEGORIES]
    return " · ".join([f"{c} {counts[c]}" for c in CATEGORIES] + extra)


def render_progress(counts: Counter[str], total: int, posted: int, failed_posts: int, elapsed: float,
                    columns: int | None = None) -> str:
    """``[#####-----] 12/50  inFlight 20 · attention 1 · processed 11 · error 0  posted 35/50  4.2s``:
    the bar and the count before the counts are of the orders no longer in flight.

    With ``columns``, the bar shrinks (down to 10) so that the line fits a terminal line."""
    finished = sum(n for c, n in counts.items() if c != IN_FLIGHT)
    tail = (f" {finished}/{total}  {by_category(counts)}"
            + (f"  posted {posted}/{total}" if posted < total else "")
            + (f"  {failed_posts} posts failed" if failed_posts else "")
            + f"  {elapsed:.1f}s")
    width = 30 if columns is None else max(10, min(30, columns - 3 - len(tail)))
    filled = int(width * finished / total) if total else width
    text = "[" + "#" * filled + "-" * (width - filled) + "]" + tail
    return text if columns is None else text[: columns - 1]


@dataclass
class _Poster:
    """Posts the plan at ``rate`` per second on a thread; remembers which failing order got which id."""

    stack: DemoStack
    plan: list[DemoOrder]
    rate: float
    tracker: OrderTracker
    posted: int = 0
    failing: list[tuple[str, FailingKind]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="demo-poster", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        session = requests.Session()
        start = time.monotonic()
        for i, order in enumerate(self.plan):
            wait = start + i / self.rate - time.monotonic() if self.rate > 0 else 0
            if self.stop.is_set() or (wait > 0 and self.stop.wait(wait)):
                return
            self._post(order, session)
            self.posted += 1

    def _post(self, order: DemoOrder, session: requests.Session) -> None:
        try:
            order_id = self.stack.post_order(order.body, session=session)
        except (requests.RequestException, StackError) as e:
            self.tracker.post_errors.append(str(e))
            return
        self.tracker.add(order_id, awaited=order.awaited)
        if order.failing is not None:
            self.failing.append((order_id, order.failing))
            if order.failing.approve:
                try:
                    self.stack.send_event(order_id, "approval", {"approved": True, "by": "demo"}, session=session)
                except (requests.RequestException, StackError) as e:
                    self.tracker.post_errors.append(str(e))


def _show_progress(tracker: OrderTracker, poster: _Poster, thread: threading.Thread, out: TextIO) -> None:
    """Redraw (terminal) or print every 2 s (otherwise) the progress line until the demo is done."""
    tty = out.isatty() if hasattr(out, "isatty") else False
    total, started, last_line = len(poster.plan), time.monotonic(), 0.0
    while True:
        tracker.poll()
        columns = shutil.get_terminal_size().columns if tty else None  # one line, or \r redraw scrolls
        line = render_progress(tracker.counts(), total, poster.posted, len(tracker.post_errors),
                               time.monotonic() - started, columns)
        finished = not thread.is_alive() and tracker.done(total)
        if tty:
            out.write("\r" + line + "\x1b[K")
        elif finished or time.monotonic() - last_line >= 2.0:
            out.write(line + "\n")
            last_line = time.monotonic()
        out.flush()
        if finished:
            return
        time.sleep(0.5)


def run_demo(stack: DemoStack, plan: list[DemoOrder], rate: float, out: TextIO) -> tuple[Counter[str], list[str]]:
    """Post ``plan`` at ``rate`` per second, show progress until every awaited order finished.

    Returns the counts by search category and a line per failing order (its id and story)."""
    tracker = OrderTracker(stack)
    poster = _Poster(stack, plan, rate, tracker)
    thread = poster.start()
    try:
        _show_progress(tracker, poster, thread, out)
    finally:
        poster.stop.set()
        tracker.close()
        if out.isatty():
            out.write("\n")
    for err in tracker.post_errors[:5]:
        out.write(f"post failed: {err}\n")
    return tracker.counts(), [failing_line(order_id, kind) for order_id, kind in poster.failing]


def failing_line(order_id: str, kind: FailingKind) -> str:
    return f"  {order_id}  {kind.name}: {kind.story}"


def demo(stack: DemoStack, orders: int, rate: float, failing: bool, out: TextIO, seed: int | None = None) -> None:
    """The demo as ``make run`` shows it: faults set, orders posted, a summary printed."""
    plan = demo_plan(orders, random.Random(seed), failing)
    failing_count = sum(1 for o in plan if o.failing)
    if failing_count:
        with stack.remotes as remotes:
            set_demo_faults(remotes)
    note = f", {failing_count} of them failing on purpose" if failing_count else ""
    out.write(f"posting {orders} demo orders at {rate:g}/s{note} ...\n")
    out.flush()
    counts, failing_lines = run_demo(stack, plan, rate, out)
    out.write(f"demo done: {summary(counts)}\n")
    if failing_lines:
        out.write(f"failing on purpose (customer {FAILING_CUSTOMER}; --no-failing-orders leaves them out):\n")
        out.write("".join(line + "\n" for line in failing_lines))
    out.flush()


def summary(counts: Counter[str]) -> str:
    """``100 orders by search category: inFlight 1 · attention 2 · processed 97 · error 0``: the
    demo's orders (those posted), in the words of the live line that follows (every order in the
    store, earlier runs' too) and of the search."""
    return f"{sum(counts.values())} orders by search category: {by_category(counts)}"
