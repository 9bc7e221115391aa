"""What ``make run`` shows after the demo: a live line of order counts by search category, and
each operator alert as it arrives.

* Counts: ``GET /api/orders?state=inFlight|attention|processed|error`` (the search API), paged
  by ``continuationToken``, every ``interval`` seconds. A category is counted up to
  ``COUNT_CAP`` orders (then shown as ``1000+``), so a large persistent store costs a few pages.
* Alerts: received from the alerts queue (setting ``AlertsQueue``) with azure-servicebus, from
  the stack's Service Bus (setting ``ServiceBusConnection``), printed, then completed.
* On a terminal the count line is redrawn in place (``\\r``) and alerts print above it;
  otherwise a count line is printed only when the counts change.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

import requests
from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage, ServiceBusReceiver

CATEGORIES = ("inFlight", "attention", "processed", "error")
COUNT_CAP = 1000
PAGE_LIMIT = 200


class HttpGet(Protocol):
    def __call__(self, url: str, *, params: dict[str, Any], timeout: float) -> requests.Response: ...


@dataclass(frozen=True)
class Tally:
    """Orders per search category; ``capped``: categories holding more than counted."""

    counts: dict[str, int] = field(default_factory=dict)
    capped: frozenset[str] = frozenset()
    error: str | None = None  # why counting failed (the counts are then empty)


class SearchError(Exception):
    pass


def count_category(get: HttpGet, orders_url: str, state: str, cap: int = COUNT_CAP) -> tuple[int, bool]:
    """(orders in ``state`` counted up to ``cap``, whether there are more), page by page."""
    total, token = 0, None
    while True:
        params: dict[str, Any] = {"state": state, "limit": min(PAGE_LIMIT, cap)}
        if token:
            params["continuationToken"] = token
        r = get(orders_url, params=params, timeout=10)
        if r.status_code != 200:
            raise SearchError(f"GET /orders?state={state}: {r.status_code}")
        page = r.json()
        total += len(page["orders"])
        token = page.get("continuationToken")
        if not token or total >= cap:
            return total, bool(token)


def tally(get: HttpGet, orders_url: str) -> Tally:
    """Every category's count, or a Tally saying why there is none."""
    counts, capped = {}, set()
    try:
        for state in CATEGORIES:
            counts[state], more = count_category(get, orders_url, state)
            if more:
                capped.add(state)
    except (requests.RequestException, SearchError, ValueError, KeyError, TypeError) as e:
        return Tally(error=str(e) or type(e).__name__)
    return Tally(counts, frozenset(capped))


def render_tally(t: Tally, at: datetime) -> str:
    """``12:03:04Z  orders: inFlight 1 · attention 3 · processed 17 · error 0`` (``at`` in UTC)."""
    clock = at.astimezone(UTC).strftime("%H:%M:%SZ")
    if t.error is not None:
        return f"{clock}  orders: counts unavailable ({t.error})"
    parts = (f"{c} {t.counts.get(c, 0)}{'+' if c in t.capped else ''}" for c in CATEGORIES)
    return f"{clock}  orders: " + " · ".join(parts)


def render_alert(body: bytes | str) -> str:
    """``ALERT 12:03:04Z order o-1 step create-shipment (failures 3): reason``: ``at`` in UTC; the
    failure count (the step's timeouts) when there were any; an unreadable body as it is."""
    try:
        alert = json.loads(body)
        order_id, reason = alert["orderId"], alert.get("reason") or "?"
    except (ValueError, TypeError, KeyError):
        raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        return f"ALERT (unreadable) {raw[:200]}"
    step = f" step {alert['step']}" if alert.get("step") else ""
    failures = f" (failures {alert['failureCount']})" if alert.get("failureCount") else ""
    return f"ALERT {_clock(alert.get('at'))}order {order_id}{step}{failures}: {reason}"


def _clock(at: Any) -> str:
    """``12:03:04Z `` from an ISO time, or nothing."""
    try:
        when = datetime.fromisoformat(str(at))
    except ValueError:
        return ""
    return (when.astimezone(UTC) if when.tzinfo else when).strftime("%H:%M:%SZ ")


class Terminal:
    """A live line at the bottom, and lines printed above it, from any thread."""

    def __init__(self, out: TextIO, tty: bool | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self._live = ""
        self._lock = threading.Lock()

    def live(self, text: str) -> None:
        with self._lock:
            if self.tty:
                self._live = text[: shutil.get_terminal_size().columns - 1]  # one line, or \r redraw scrolls
                self.out.write("\r" + self._live + "\x1b[K")
            else:
                self.out.write(text + "\n")
            self.out.flush()

    def say(self, text: str) -> None:
        with self._lock:
            if self.tty:
                self.out.write("\r\x1b[K" + text + "\n" + self._live)
            else:
                self.out.write(text + "\n")
            self.out.flush()

    def end(self) -> None:
        """Leave the live line, so what follows starts on a line of its own."""
        with self._lock:
            if self.tty and self._live:
                self.out.write("\n")
                self.out.flush()
            self._live = ""


class AlertFeed:
    """Receives the alerts queue on a thread, hands each alert's line to ``on_alert``, completes it.

    A broken connection is reported once through ``on_problem`` and retried every few seconds."""

    def __init__(self, connection_string: str, queue: str, on_alert: Callable[[str], None],
                 on_problem: Callable[[str], None]) -> None:
        self.connection_string = connection_string
        self.queue = queue
        self.on_alert = on_alert
        self.on_problem = on_problem
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alerts", daemon=True)

    def start(self) -> AlertFeed:
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        reported = False
        while not self._stop.is_set():
            try:
                with ServiceBusClient.from_connection_string(self.connection_string) as client, \
                        client.get_queue_receiver(self.queue) as receiver:
                    self._drain(receiver)
            except Exception as e:  # the SDK's errors vary; the feed must outlive them
                if not reported and not self._stop.is_set():
                    self.on_problem(f"alerts: cannot receive from queue {self.queue!r}: {e}; retrying")
                reported = True
                self._stop.wait(5.0)

    def _drain(self, receiver: ServiceBusReceiver) -> None:
        while not self._stop.is_set():
            for message in receiver.receive_messages(max_message_count=20, max_wait_time=1):
                self.on_alert(render_alert(message_body(message)))
                receiver.complete_message(message)


def message_body(message: ServiceBusReceivedMessage) -> bytes:
    body = message.body
    return body if isinstance(body, bytes) else b"".join(body) if isinstance(body, Iterable) else str(body).encode()


class Watch:
    """The counts line and the alert feed of one running stack (its api URL and settings)."""

    def __init__(self, api_url: str, settings: dict[str, str], out: TextIO, tty: bool | None = None) -> None:
        self.orders_url = f"{api_url}/orders"
        self.terminal = Terminal(out, tty)
        self.session = requests.Session()
        self._last: Tally | None = None
        self.feed = AlertFeed(settings["ServiceBusConnection"], settings.get("AlertsQueue") or "alerts",
                              self.terminal.say, self.terminal.say)

    def start(self) -> Watch:
        # The SDK logs its reconnects and link errors itself: they would break the live line.
        logging.getLogger("azure").setLevel(logging.CRITICAL)
        self.feed.start()
        return self

    def refresh(self) -> None:
        """Count again; show the line (always on a terminal, else when the counts changed)."""
        current = tally(self.session.get, self.orders_url)
        if self.terminal.tty or current != self._last:
            self.terminal.live(render_tally(current, datetime.now(UTC)))
        self._last = current

    def close(self) -> None:
        self.feed.close()
        self.terminal.end()
        self.session.close()


def watch_forever(watch: Watch, dead_components: Callable[[], list[str]], interval: float = 2.0) -> None:
    """Refresh the counts every ``interval`` seconds; say once when a component exits. Until interrupted."""
    reported: set[str] = set()
    while True:
        watch.refresh()
        for line in dead_components():
            if line not in reported:
                reported.add(line)
                watch.terminal.say(line)
        time.sleep(interval)
