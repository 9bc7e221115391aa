"""Load generation: POST orders (open loop at a fixed rate, or closed loop at saturation) and
timestamp their progress from the status queue, without polling the API.

Every order names the status queue (``statusQueue``); the submission sends ``received`` and
the scheduler ``step-done``, ``processed`` and ``failed`` messages there, each carrying the orderId. One
SDK receiver (receive-and-delete, prefetch) consumes them and stamps their arrival.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from local.host.receiving import without_keep_alive_reads

TERMINAL_EVENTS = ("processed", "failed", "cancelled", "compensated")

_SKUS = [("SKU-1", 9.99), ("SKU-2", 4.5), ("SKU-3", 19.0), ("SKU-4", 0.1), ("SKU-5", 129.95)]


def order_body(rng: random.Random, status_queue: str, priority: str = "normal") -> bytes:
    items = [{"sku": sku, "quantity": rng.randint(1, 3), "unitPrice": price}
             for sku, price in rng.sample(_SKUS, rng.randint(1, 3))]
    return json.dumps({"customerId": f"c-{rng.randint(1, 50)}", "currency": "EUR", "items": items,
                       "priority": priority, "statusQueue": status_queue}).encode()


class PriorityMix:
    """The priority of each next order: ``shares`` of high/low (the rest normal), drawn from a
    seeded generator, so that a run's orders are the same from one run to the next."""

    def __init__(self, shares: dict[str, float], seed: int = 0) -> None:
        self.shares = dict(shares)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            x = self._rng.random()
        for priority, share in self.shares.items():
            if x < share:
                return priority
            x -= share
        return "normal"


@dataclass
class OrderTimes:
    order_id: str
    phase: str
    submitted: float  # epoch seconds, just before the POST
    accepted: float = 0.0  # 202 received
    priority: str = "normal"
    processed: float = 0.0  # 'processed' status message received
    failed: float = 0.0
    events: dict[str, float] = field(default_factory=dict)


class StatusEvents:
    """The status events of orders, stamped on arrival; ``on_terminal(order_id)`` is called once
    per order that ends. What LoadRun reads, whatever carries the events (a queue, HTTP)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: dict[str, dict[str, float]] = {}
        self.terminal: dict[str, tuple[str, float]] = {}
        self.received = 0
        self.on_terminal: Callable[[str], None] | None = None

    def record(self, raw: bytes | str, now: float) -> None:
        """Stamp one status event (a JSON body with orderId and event); anything else is ignored."""
        try:
            body = json.loads(raw)
        except (ValueError, TypeError):
            return
        oid, event = body.get("orderId"), body.get("event")
        if not oid or not event:
            return
        key = f"{event}:{body['step']}" if body.get("step") else str(event)
        cb = None
        with self.lock:
            self.received += 1
            self.events.setdefault(oid, {}).setdefault(key, now)
            if event in TERMINAL_EVENTS and oid not in self.terminal:
                self.terminal[oid] = (event, now)
                cb = self.on_terminal
        if cb is not None:
            cb(oid)


class StatusWatcher(StatusEvents):
    """Consumes the status queue in a thread."""

    def __init__(self, conn_str: str, queue: str) -> None:
        super().__init__()
        self.conn_str = conn_str
        self.queue = queue
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-watcher", daemon=True)
        self.error: BaseException | None = None
        self.lags: list[tuple[float, float]] = []  # (arrival, seconds after the broker's enqueue), per message

    def start(self, timeout: float = 30.0) -> StatusWatcher:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"status watcher did not attach: {self.error!r}")
        return self

    def _run(self) -> None:
        # The aio client without the SDK's keep-alive reads, as the local host's receivers: of
        # messages sent back to back (a step's status, then ``processed`` at once) the sync receiver
        # held ~2%, and the aio one with those reads ~0.5%, 50-350 ms after the broker took them,
        # and the latency figures counted it (docs/design.md, "Decisions and their measurements").
        # ``lag_ms`` keeps each arrival's time after the broker's enqueue.
        without_keep_alive_reads()
        asyncio.run(self._consume())

    async def _consume(self) -> None:
        from azure.servicebus import ServiceBusReceiveMode
        from azure.servicebus.aio import ServiceBusClient

        backoff = 0.5
        while not self._stop.is_set():
            try:
                async with ServiceBusClient.from_connection_string(self.conn_str) as client, client.get_queue_receiver(
                        self.queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                        prefetch_count=200) as receiver:
                    for m in await receiver.receive_messages(max_message_count=1, max_wait_time=0.1):  # attach
                        self._record(m, time.time())
                    self._ready.set()
                    backoff = 0.5
                    while not self._stop.is_set():
                        # One message per call: prefetched messages are served from the buffer at once.
                        for m in await receiver.receive_messages(max_message_count=1, max_wait_time=0.5):
                            self._record(m, time.time())
            except Exception as e:  # noqa: BLE001 - broker restart etc.: reattach
                self.error = e
                if self._stop.wait(backoff):  # blocks this thread's loop, which runs nothing else
                    return
                backoff = min(backoff * 2, 5.0)

    def _record(self, m: Any, now: float) -> None:
        enqueued = m.enqueued_time_utc
        if enqueued is not None:
            with self.lock:
                self.lags.append((now, now - enqueued.timestamp()))
        self.record(b"".join(m.body) if not isinstance(m.body, (bytes, str)) else m.body, now)

    def lag_ms(self, start: float, end: float) -> dict[str, float | None]:
        """How long after the broker's enqueue the messages that arrived from ``start`` to ``end``
        (epoch seconds) arrived here: n, p50, p99 and max in ms."""
        with self.lock:
            lags = [lag for at, lag in self.lags if start <= at <= end]
        return {"n": len(lags), **{f"p{p}": ms(percentile(lags, p)) for p in (50, 99)},
                "max": ms(max(lags)) if lags else None}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Poster:
    """POSTs orders over keep-alive connections (one per thread). ``headers`` go on every POST:
    ours takes the function key (``Stack.key_headers(FUNCTION)``); a peer's server takes none."""

    def __init__(self, api_url: str, status_queue: str, seed: int = 0,
                 headers: Mapping[str, str] | None = None) -> None:
        u = urlsplit(api_url)
        self.host, self.port, self.path = u.hostname or "127.0.0.1", u.port or 80, u.path.rstrip("/") + "/orders"
        self.status_queue = status_queue
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self._local = threading.local()
        self._seed = seed
        self._seq = 0
        self._lock = threading.Lock()
        self.errors: list[str] = []

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            with self._lock:
                self._seq += 1
                self._local.rng = random.Random(self._seed * 1000 + self._seq)
        return c

    def post(self, priority: str = "normal") -> tuple[str | None, float, float]:
        """(orderId or None, submitted, accepted) as epoch seconds."""
        c = self._conn()
        body = order_body(self._local.rng, self.status_queue, priority)
        for attempt in (0, 1):
            t0 = time.time()
            try:
                c.request("POST", self.path, body=body, headers=self.headers)
                r = c.getresponse()
                data = r.read()
                t1 = time.time()
                if r.status != 202:
                    with self._lock:
                        self.errors.append(f"{r.status} {data[:200]!r}")
                    return None, t0, t1
                return str(json.loads(data)["orderId"]), t0, t1
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                c.close()
                self._local.conn = None
                c = self._conn()
                if attempt:
                    with self._lock:
                        self.errors.append(repr(e))
                    return None, t0, time.time()
        return None, 0.0, 0.0


class LoadRun:
    """Orders of one phase and their timings."""

    def __init__(self, poster: Poster, watcher: StatusWatcher, phase: str, mix: PriorityMix | None = None) -> None:
        self.poster = poster
        self.watcher = watcher
        self.phase = phase
        self.mix = mix  # None: every order is normal
        self.orders: dict[str, OrderTimes] = {}
        self.lock = threading.Lock()
        self.post_failures = 0
        self._errors_from = len(poster.errors)  # the poster's errors before this phase

    def _post_one(self) -> str | None:
        priority = self.mix.next() if self.mix is not None else "normal"
        oid, t0, t1 = self.poster.post(priority)
        if oid is None:
            with self.lock:
                self.post_failures += 1
            return None
        with self.lock:
            self.orders[oid] = OrderTimes(oid, self.phase, t0, t1, priority=priority)
        return oid

    def open_loop(self, rate: float, seconds: float, threads: int = 8,
                  progress: Callable[[str], None] | None = None) -> None:
        """Post at ``rate``/s for ``seconds`` (intended times t0 + i/rate; no coordinated omission
        at these rates: a post takes milliseconds)."""
        import queue

        n = max(1, int(rate * seconds))
        tasks: queue.SimpleQueue[bool] = queue.SimpleQueue()
        t0 = time.monotonic()

        def worker() -> None:
            while tasks.get():
                self._post_one()

        ts = [threading.Thread(target=worker, daemon=True, name=f"post-{i}") for i in range(threads)]
        for t in ts:
            t.start()
        last = t0
        for i in range(n):
            target = t0 + i / rate
            d = target - time.monotonic()
            if d > 0:
                time.sleep(d)
            tasks.put(True)
            if progress is not None and time.monotonic() - last >= 5:
                last = time.monotonic()
                progress(self.status_line(n))
        for _ in ts:
            tasks.put(False)  # after every order: each worker ends once the orders are taken
        for t in ts:
            t.join(30)

    def closed_loop(self, window: int, seconds: float, threads: int = 16,
                    progress: Callable[[str], None] | None = None) -> None:
        """Keep ``window`` orders in flight for ``seconds``: a new order when one finishes."""
        slots = threading.Semaphore(window)
        end = time.monotonic() + seconds
        mine: set[str] = set()
        mine_lock = threading.Lock()

        def released(oid: str) -> None:
            with mine_lock:
                if oid in mine:
                    mine.discard(oid)
                    slots.release()

        self.watcher.on_terminal = released

        def worker() -> None:
            while time.monotonic() < end:
                if not slots.acquire(timeout=0.5):
                    continue
                if time.monotonic() >= end:
                    slots.release()
                    return
                oid = self._post_one()
                if oid is None:
                    slots.release()
                    time.sleep(0.1)
                    continue
                with mine_lock:
                    mine.add(oid)
                    done = oid in self.watcher.terminal
                if done:
                    released(oid)

        ts = [threading.Thread(target=worker, daemon=True, name=f"post-{i}") for i in range(threads)]
        for t in ts:
            t.start()
        while True:
            alive = [t for t in ts if t.is_alive()]
            if not alive:
                break
            alive[0].join(5)
            if progress is not None and alive[0].is_alive():
                progress(self.status_line(None))
        self.watcher.on_terminal = None

    def finished(self) -> int:
        with self.watcher.lock:
            return sum(1 for o in self.orders if o in self.watcher.terminal)

    def wait_all(self, timeout: float, progress: Callable[[str], None] | None = None) -> bool:
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            if self.finished() >= len(self.orders):
                return True
            time.sleep(0.1)
            if progress is not None and time.monotonic() - last >= 5:
                last = time.monotonic()
                progress(self.status_line(len(self.orders)))
        return self.finished() >= len(self.orders)

    @property
    def post_errors(self) -> list[str]:
        """Why this phase's failed posts failed (HTTP status and body, or the exception), first 10."""
        return self.poster.errors[self._errors_from:self._errors_from + 10]

    def status_line(self, total: int | None) -> str:
        with self.lock:
            posted = len(self.orders)
        errors = self.post_errors
        return (f"  {self.phase}: posted {posted}" + (f"/{total}" if total else "")
                + f", finished {self.finished()}, post failures {self.post_failures}"
                + (f" (first: {errors[0]})" if errors else ""))

    def collect(self) -> list[OrderTimes]:
        with self.watcher.lock:
            for oid, o in self.orders.items():
                o.events = dict(self.watcher.events.get(oid, {}))
                term = self.watcher.terminal.get(oid)
                if term is not None:
                    if term[0] == "processed":
                        o.processed = term[1]
                    else:
                        o.failed = term[1]
        return list(self.orders.values())


def ms(v: float | None) -> float | None:
    """Seconds as milliseconds, one decimal (None stays None)."""
    return None if v is None else round(1000 * v, 1)


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def phase_figures(orders: list[OrderTimes], post_failures: int, all_finished: bool) -> dict[str, Any]:
    """A load phase's counts, its throughput from the first POST to the last order done, and its
    latencies submit→done and POST→202 (ms)."""
    done = [o for o in orders if o.processed]
    lat = [o.processed - o.submitted for o in done]
    post = [o.accepted - o.submitted for o in orders if o.accepted]
    first = min((o.submitted for o in orders), default=0.0)
    last = max((o.processed for o in done), default=first)
    failed = sum(1 for o in orders if o.failed)
    return {"orders_posted": len(orders), "post_failures": post_failures, "processed": len(done), "failed": failed,
            "unfinished": len(orders) - len(done) - failed, "all_finished": all_finished,
            "seconds": round(last - first, 2),
            "orders_per_s": round(len(done) / (last - first), 2) if last > first else None,
            "latency_ms": {f"p{p}": ms(percentile(lat, p)) for p in (50, 95, 99)} | {"max": ms(max(lat, default=None))},
            "post_latency_ms": {f"p{p}": ms(percentile(post, p)) for p in (50, 99)},
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}
