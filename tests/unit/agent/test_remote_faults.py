"""The remote call's transport faults and their names (shared/agent/remote.py, on urllib3).

A raw TCP remote, scripted per connection turn: an answer, a connection closed before any
answer, or one closed mid-body (fewer bytes than its Content-Length). Each fault is transient
and named as the breaker counts it; the call after it answers. urllib3's exception classes are
mapped in ``_fault_of``: a refused connection is a ``NewConnectionError``, itself a
``ConnectTimeoutError``, and must not count as a timeout.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from urllib3.exceptions import (
    ConnectTimeoutError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from shared.agent import AgentRuntime, RetryPolicy
from shared.agent.remote import _BrokenBody, _fault_of, _Reply, _retry_after
from tests.unit.agent.test_runtime import FAST, RecordingSender, make_request, request_body

OK = json.dumps({"reservationId": "r-1"}).encode()


class RawRemote:
    """Answers POSTs on a loopback port; ``script`` says what each request gets (the last repeats)."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.seen: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.listener.getsockname()[1]}/inventory"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while True:
                head = [reader.readline()]
                while head[-1] not in (b"\r\n", b""):
                    head.append(reader.readline())
                if head[-1] == b"":
                    return
                length = next(int(h.split(b":")[1]) for h in head if h.lower().startswith(b"content-length"))
                reader.read(length)
                action = self.script.pop(0) if len(self.script) > 1 else self.script[0]
                self.seen.append(action)
                if action == "drop":  # closed before any answer
                    return
                if action == "truncate":  # the headers, then half the promised body, then closed
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 + f"Content-Length: {len(OK)}\r\n\r\n".encode() + OK[: len(OK) // 2])
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             + f"Content-Length: {len(OK)}\r\n\r\n".encode() + OK)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def raw() -> Iterator[RawRemote]:
    remote = RawRemote(["ok"])
    yield remote
    remote.close()


@pytest.mark.parametrize(("fault", "name"), [("drop", "connection-error"), ("truncate", "protocol-error")])
def test_a_connection_closed_before_or_during_the_answer_is_transient_and_named(
        raw: RawRemote, fault: str, name: str) -> None:
    raw.script = [fault, "ok"]
    sender = RecordingSender()
    result = AgentRuntime("inventory", raw.base, sender, policy=FAST).handle(make_request(request_body(seconds=3)))
    assert result.statuses == (name, 200)
    assert result.outcome == "success" and result.reply is not None
    assert result.reply.result == {"reservationId": "r-1"}
    assert raw.seen == [fault, "ok"]


def test_a_body_cut_short_every_time_sends_nothing_by_complete_by(raw: RawRemote) -> None:
    raw.script = ["truncate"]
    sender = RecordingSender()
    result = AgentRuntime("inventory", raw.base, sender, policy=FAST).handle(make_request(request_body(seconds=0.6)))
    assert result.status == "expired" and sender.replies == []
    assert result.calls >= 2 and set(result.statuses) == {"protocol-error"}


@pytest.fixture
def full_backlog() -> Iterator[str]:
    """A listener whose accept queue is full: new connections are never accepted (the SYNs are dropped)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    try:
        for _ in range(8):
            probe = socket.socket()
            probe.settimeout(0.2)
            try:
                probe.connect(("127.0.0.1", port))
            except TimeoutError:
                probe.close()
                break
            held.append(probe)
        else:
            pytest.skip("this kernel accepts past a full backlog")
        yield f"http://127.0.0.1:{port}/inventory"
    finally:
        for s in held:
            s.close()
        listener.close()


def test_a_connect_timeout_is_a_timeout_not_a_connection_error(full_backlog: str) -> None:
    sender = RecordingSender()
    policy = RetryPolicy(initial_backoff=0.05, max_backoff=0.1, jitter=0.0, connect_timeout=0.2)
    result = AgentRuntime("inventory", full_backlog, sender, policy=policy).handle(
        make_request(request_body(seconds=0.8)))
    assert result.status == "expired" and sender.replies == []
    assert result.calls >= 2 and set(result.statuses) == {"timeout"}


def _new_connection_error() -> NewConnectionError:
    return NewConnectionError(None, "Failed to establish a new connection: [Errno 111] Connection refused")  # type: ignore[arg-type]


@pytest.mark.parametrize(("error", "name"), [
    (_new_connection_error(), "connection-error"),
    (MaxRetryError(None, "/x", _new_connection_error()), "connection-error"),  # type: ignore[arg-type]
    (ConnectTimeoutError(None, "connect timed out"), "timeout"),
    (MaxRetryError(None, "/x", ConnectTimeoutError(None, "connect timed out")), "timeout"),  # type: ignore[arg-type]
    (ReadTimeoutError(None, "/x", "Read timed out."), "timeout"),  # type: ignore[arg-type]
    (ProtocolError("Connection aborted.", ConnectionResetError(104, "reset")), "connection-error"),
    (SSLError("certificate verify failed"), "connection-error"),
    (_BrokenBody(ProtocolError("Connection broken: IncompleteRead(7 bytes read, 7 more expected)")),
     "protocol-error"),
])
def test_urllib3_errors_are_named_as_the_breaker_counts_them(error: Exception, name: str) -> None:
    assert _fault_of(error) == name  # type: ignore[arg-type]


def test_retry_after_as_seconds_or_an_http_date() -> None:
    now = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)

    def reply(value: str) -> _Reply:
        return _Reply(503, {"Retry-After": value}, b"")

    assert _retry_after(reply("2.5"), now) == 2.5
    assert _retry_after(reply(format_datetime(now + timedelta(seconds=7), usegmt=True)), now) == 7.0
    assert _retry_after(reply(format_datetime(now - timedelta(seconds=7), usegmt=True)), now) == 0.0
    assert _retry_after(reply("soon"), now) is None
    assert _retry_after(_Reply(503, {}, b""), now) is None
