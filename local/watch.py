"""What ``make run`` shows after the demo: a live line of order counts by search category, and
each operator alert as it arrives.

* Counts: ``GET /api/orders?state=inFlight|attention|processed|error`` (the search API), paged
  by ``continuationToken``, every ``interval`` seconds. A category is counted up to
  ``COUNT_CAP`` orders (then shown as ``1000+``), so a large persistent store costs a few pages.
* Alerts: received from the alerts queue (setting ``AlertsQueue``) with azure-servicebus, from
  the stack's Service Bus (setting ``ServiceBusConnection``), printed one line each (an order's
  alert, a breaker's opening or closing: ``render_alert``), then completed.
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
from pydantic import BaseModel, ValidationError

from shared.core.messages import AlertMessage, BreakerAlert

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
    """One line per message of the alerts queue, by its ``kind`` (times in UTC):

    * ``alert``, an order's (``AlertMessage``; also a body without a kind):
      ``ALERT 12:03:04Z order o-1 step create-shipment (failures 3): reason``, with the failure
      count (the step's timeouts) when there were any;
    * ``breaker``, a remote's circuit breaker (``BreakerAlert``):
      ``ALERT 12:03:04Z breaker payment opened (failures 5): reason; next probe 12:03:34Z``, and
      ``ALERT 12:04:10Z breaker payment closed after 1 min 6 s open``;
    * a kind not known here: ``ALERT (kind NAME)`` and the body.

    A body is read with the app's model of its kind (fields the model does not know are left out);
    one the model refuses (an older or partial one) is read field by field. Only a body that is not
    a JSON object, or lacks what names its subject (an order's ``orderId``, a breaker's ``remote``
    and ``state``), is ``ALERT (unreadable)`` and the body as it is."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        alert = json.loads(text)
    except ValueError:
        alert = None
    if not isinstance(alert, dict) or not isinstance(kind := alert.get("kind", "alert"), str):
        return f"ALERT (unreadable) {_one_line(text)[:200]}"
    if kind not in ALERT_KINDS:
        return f"ALERT (kind {_one_line(kind)}) {_one_line(text)[:200]}"
    model, line = ALERT_KINDS[kind]
    return line(alert_fields(model, alert)) or f"ALERT (unreadable) {_one_line(text)[:200]}"


def alert_fields(model: type[BaseModel], alert: dict[str, Any]) -> dict[str, Any]:
    """The body's values by the model's field names: as the model validates them, or, when it
    refuses the body, as they are (a value may then be of any JSON type)."""
    names = {}
    for name, info in model.model_fields.items():
        names[name] = names[info.alias or name] = name
    known = {key: value for key, value in alert.items() if key in names}
    try:
        return dict(model.model_validate(known))
    except ValidationError:
        return {names[key]: value for key, value in known.items()}


def _order_line(alert: dict[str, Any]) -> str | None:
    if "order_id" not in alert:
        return None
    step = f" step {_one_line(alert['step'])}" if alert.get("step") else ""
    failures = f" (failures {alert['failure_count']})" if alert.get("failure_count") else ""
    return f"ALERT {_clock(alert.get('at'))}order {_one_line(alert['order_id'])}{step}{failures}: " \
           f"{_one_line(alert.get('reason') or '?')}"


def _breaker_line(alert: dict[str, Any]) -> str | None:
    if "remote" not in alert or "state" not in alert:
        return None
    head = f"ALERT {_clock(alert.get('at'))}breaker {_one_line(alert['remote'])}"
    if alert["state"] == "open":
        failures = f" (failures {alert['failures']})" if alert.get("failures") is not None else ""
        reason = f": {_one_line(alert['reason'])}" if alert.get("reason") else ""
        probe = _clock(alert.get("retry_at")).strip()
        return f"{head} opened{failures}{reason}" + (f"; next probe {probe}" if probe else "")
    if alert["state"] == "closed":
        seconds = alert.get("open_seconds")
        return f"{head} closed" + (f" after {_duration(seconds)} open" if seconds is not None else "")
    return f"{head} {_one_line(alert['state'])}"


ALERT_KINDS: dict[str, tuple[type[BaseModel], Callable[[dict[str, Any]], str | None]]] = {
    "alert": (AlertMessage, _order_line),
    "breaker": (BreakerAlert, _breaker_line),
}


def _clock(at: Any) -> str:
    """``12:03:04Z `` from a time or an ISO time, or nothing."""
    try:
        when = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
    except ValueError:
        return ""
    return (when.astimezone(UTC) if when.tzinfo else when).strftime("%H:%M:%SZ ")


def _duration(seconds: Any) -> str:
    """``12.3 s``, ``1 min 6 s``, ``2 h 5 min``; a value that is not a number as it is."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return _one_line(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s"


def _one_line(value: Any) -> str:
    """A value as text on one line (a reason may hold line breaks)."""
    return " ".join(str(value).split())


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

    def __init__(self, api_url: str, settings: dict[str, str], out: TextIO, tty: bool | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.orders_url = f"{api_url}/orders"
        self.terminal = Terminal(out, tty)
        self.session = requests.Session()
        self.session.headers.update(headers or {})  # the search is an operator route: the master key
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
