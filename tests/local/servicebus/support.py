"""Helpers for the Service Bus conformance tests. They only ever talk to the emulator through the SDK."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiver

CONFIG = Path(__file__).with_name("Config.json")

# Client options for most tests. retry_total=0: the broker's first answer is what the test sees, so no SDK
# retry masks a wrong answer or makes a correct refusal slow (the SDK retries even SessionCannotBeLocked,
# com.microsoft:timeout and failed management operations, for 10-20 s). keep_alive=None: no keep-alive
# thread, whose join makes every close() wait up to a second. Tests of the app-facing default
# configuration (unknown entity, reconnect after restart) build a default client instead.
CLIENT_OPTIONS: dict[str, Any] = {"retry_total": 0, "keep_alive": None}

T = TypeVar("T")


_CLOSERS: list[threading.Thread] = []


def _close_in_background(closeable: Any) -> threading.Thread:
    t = threading.Thread(target=closeable.close, name="sb-close", daemon=True)
    t.start()
    _CLOSERS.append(t)
    return t


def close_client_in_background(client: Any) -> None:
    """Close a client after its handlers' background closes finished (never two closes of one handler at once)."""
    pending = list(_CLOSERS)

    def run() -> None:
        for t in pending:
            t.join(15)
        client.close()

    t = threading.Thread(target=run, name="sb-close-client", daemon=True)
    t.start()
    _CLOSERS.append(t)


def join_background_closes(timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while _CLOSERS:
        _CLOSERS.pop().join(max(0.0, deadline - time.monotonic()))


class _ClosesInBackground:
    """A sender/receiver whose ``with`` block ends by closing it on a background thread.

    The SDK's close is slow by design (a receiver drains its link for ~0.4 s and joins a keep-alive thread
    that sleeps in 1 s steps), which would dominate the suite's run time. ``__enter__`` returns the SDK's own
    handler, so tests use the unmodified SDK object. Call ``.close()`` explicitly where a test needs the link
    closed before going on (for example to accept the same session again).
    """

    def __init__(self, handler: Any) -> None:
        self._handler = handler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handler, name)

    def __enter__(self) -> Any:
        return self._handler.__enter__()

    def __exit__(self, *exc: object) -> None:
        _close_in_background(self._handler)


class QuickCloseClient:
    """Wraps a ServiceBusClient so that senders and receivers opened with ``with`` close in the background."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_queue_sender(self, *args: Any, **kwargs: Any) -> Any:
        return _ClosesInBackground(self._client.get_queue_sender(*args, **kwargs))

    def get_queue_receiver(self, *args: Any, **kwargs: Any) -> Any:
        return _ClosesInBackground(self._client.get_queue_receiver(*args, **kwargs))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> QuickCloseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        close_client_in_background(self._client)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def body_of(msg: ServiceBusReceivedMessage) -> bytes:
    """The message's data body as bytes (the SDK yields the data sections)."""
    body = msg.body
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    return b"".join(body)


def app_props(msg: ServiceBusReceivedMessage) -> dict[str, Any]:
    """Application properties with the SDK's received bytes keys/strings decoded."""
    out: dict[str, Any] = {}
    for k, v in (msg.application_properties or {}).items():
        key = k.decode() if isinstance(k, bytes) else k
        out[key] = v.decode() if isinstance(v, bytes) else v
    return out


def receive_n(receiver: ServiceBusReceiver, n: int, timeout: float = 10.0) -> list[ServiceBusReceivedMessage]:
    """Receive until ``n`` messages arrived or ``timeout`` passed; returns what arrived."""
    got: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        got.extend(receiver.receive_messages(max_message_count=n - len(got), max_wait_time=min(left, 2.0)))
    return got


def receive_exactly(receiver: ServiceBusReceiver, n: int, timeout: float = 10.0) -> list[ServiceBusReceivedMessage]:
    got = receive_n(receiver, n, timeout)
    assert len(got) == n, f"expected {n} messages, received {len(got)} within {timeout}s"
    return got


def assert_nothing(receiver: ServiceBusReceiver, wait: float = 1.0) -> None:
    """Nothing is delivered to ``receiver`` within ``wait`` seconds."""
    got = receiver.receive_messages(max_message_count=10, max_wait_time=wait)
    assert got == [], f"expected no message, got {[(m.message_id, body_of(m)) for m in got]}"


def bounded(fn: Callable[[], T], timeout: float, what: str) -> T:
    """Run ``fn`` in a daemon thread; fail the test (instead of hanging) if it takes longer than ``timeout``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=run, name=f"bounded-{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"{what} did not return within {timeout}s (hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def sleep_until(when: dt.datetime, extra: float = 0.0) -> None:
    delay = (when - utcnow()).total_seconds() + extra
    if delay > 0:
        time.sleep(delay)


class Scenarios:
    """A module's slow scenarios (lock expiry and renewal, TTL, schedules, restarts), registered by name.

    Their tests run them concurrently, so that the suite's wall time is the longest wait rather than the sum of
    all waits; each test still reports its own scenario's failure, with its traceback. Convention: the scenario
    ``foo`` belongs to the test ``test_foo``. ``arg`` says what each scenario is called with: ``"client"`` (its
    own client of the shared emulator), ``"endpoint"`` (the shared emulator's Endpoint) or ``None`` (nothing).
    """

    def __init__(self, arg: str | None = "client") -> None:
        self.arg = arg
        self.fns: dict[str, Callable[..., None]] = {}

    def __call__(self, fn: Callable[..., None]) -> Callable[..., None]:
        self.fns[fn.__name__] = fn
        return fn


class ScenarioRun:
    """Scenarios started together on background threads; ``check`` waits for one and re-raises its error."""

    def __init__(self, call: Callable[[Callable[..., None]], None], fns: dict[str, Callable[..., None]]) -> None:
        self._call = call
        self._done: dict[str, threading.Event] = {}
        self._errors: dict[str, BaseException] = {}
        self._threads: list[threading.Thread] = []
        for name, fn in fns.items():
            self._done[name] = threading.Event()
            t = threading.Thread(target=self._run, args=(name, fn), name=f"scenario-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, name: str, fn: Callable[..., None]) -> None:
        try:
            self._call(fn)
        except BaseException as exc:  # noqa: BLE001 - re-raised by check() in the test's thread
            self._errors[name] = exc
        finally:
            self._done[name].set()

    def check(self, fn: Callable[..., None], timeout: float = 50.0) -> None:
        name = fn.__name__
        if name not in self._done:  # not started with the others (test selected by another name): run it here
            self._call(fn)
            return
        if not self._done[name].wait(timeout):
            pytest.fail(f"scenario {name} did not finish within {timeout}s (hang)")
        if name in self._errors:
            raise self._errors.pop(name)

    def join(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
