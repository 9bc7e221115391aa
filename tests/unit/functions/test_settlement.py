"""functions/settlement.py: the triggers dead-letter a poison message; the host completes and abandons the rest."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.functions.servicebus import ServiceBusMessage

from functions.settlement import MAX_DESCRIPTION, received, settle
from shared.core.messages import PoisonMessage


class RecordingActions:
    """A ``ServiceBusMessageActions`` that records each settlement: (action, message, reason, description).
    Every action of the real client is here, so a settlement ``settle`` must not make is seen too."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[tuple[str, Any, str | None, str | None]] = []
        self.fail = fail or set()

    def _record(self, action: str, message: Any, reason: str | None = None, description: str | None = None) -> None:
        self.calls.append((action, message, reason, description))
        if action in self.fail:
            raise RuntimeError(f"{action} failed")

    def complete(self, message: Any) -> None:
        self._record("complete", message)

    def abandon(self, message: Any) -> None:
        self._record("abandon", message)

    def defer(self, message: Any) -> None:
        self._record("defer", message)

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None:
        self._record("deadletter", message, deadletter_reason, deadletter_error_description)

    @property
    def actions(self) -> list[str]:
        return [c[0] for c in self.calls]


def test_a_return_gives_the_result_and_leaves_the_message_to_the_host() -> None:
    """autoCompleteMessages is true: the host completes it, no gRPC call from the function."""
    actions, msg = RecordingActions(), object()
    assert settle(actions, msg, lambda: 42) == 42
    assert actions.calls == []


def test_poison_is_dead_lettered_at_once_with_its_reason_and_description() -> None:
    actions, msg = RecordingActions(), object()

    def handle() -> None:
        raise PoisonMessage("order 0f: step 'x' attempt 1 is not in flight", "StepNotInFlight")

    assert settle(actions, msg, handle) is None  # no exception: the invocation succeeded, nothing to redeliver
    assert actions.calls == [("deadletter", msg, "StepNotInFlight", "order 0f: step 'x' attempt 1 is not in flight")]


def test_a_long_description_is_cut() -> None:
    actions = RecordingActions()

    def handle() -> None:
        raise PoisonMessage("x" * 10_000, "SchemaViolation")

    settle(actions, object(), handle)
    assert len(actions.calls[0][3] or "") == MAX_DESCRIPTION


def test_a_transient_failure_raises_for_the_host_to_abandon() -> None:
    actions, msg = RecordingActions(), object()

    def handle() -> None:
        raise ConnectionError("store unavailable")

    with pytest.raises(ConnectionError):
        settle(actions, msg, handle)
    assert actions.calls == []


def test_a_failed_dead_letter_raises() -> None:
    """The lock was lost: the invocation fails and the host abandons; the next delivery is poison again."""

    def handle() -> None:
        raise PoisonMessage("not JSON", "InvalidJson")

    with pytest.raises(RuntimeError, match="deadletter failed"):
        settle(RecordingActions(fail={"deadletter"}), object(), handle)


class SdkLike:
    """The attributes ``received`` reads of the SDK's ServiceBusReceivedMessage."""

    def __init__(self) -> None:
        self.body = iter([b'{"a": ', b"1}"])
        self.message_id = "m-1"
        self.reply_to = "replies"
        self.application_properties = {b"traceparent": b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01", b"n": 3}
        self.delivery_count = 1


def test_received_reads_an_sdk_like_message_with_bytes_properties() -> None:
    m = received(SdkLike())
    assert m.body == b'{"a": 1}' and m.message_id == "m-1" and m.reply_to == "replies" and m.delivery_count == 1
    assert m.application_properties["n"] == 3 and m.traceparent and m.traceparent.startswith("00-")


def test_received_reads_the_plain_bindings_message() -> None:
    msg = ServiceBusMessage(body=b"{}", message_id=str(uuid.uuid4()), application_properties={"traceparent": "t"},
                            user_properties={}, delivery_count=2, reply_to="r")
    m = received(msg)
    assert (m.body, m.traceparent, m.delivery_count, m.reply_to) == (b"{}", "t", 2, "r")
