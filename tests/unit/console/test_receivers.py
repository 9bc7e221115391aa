"""shared.console.receivers: the console's peek receivers are built once per queue and dead-letter
queue and kept from one view to the next, so a view opens no link once the worker has served one;
a kept receiver that fails is replaced within the same peek; an idle one is closed by the next peek. The client is
the stand-in of test_deadletters.py (the SDK's receiver API); the real thing is
tests/integration/test_deadletters_servicebus.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.console import deadletters
from shared.console.overview import get_overview
from shared.console.receivers import PeekReceivers, peek_receivers
from shared.settings import QUEUE_SETTINGS
from tests.unit.console.test_deadletters import FakeClient, Msg
from tests.unit.harness import make_runtime

QUEUES = len(QUEUE_SETTINGS)


def test_the_overview_builds_its_receivers_once_and_later_views_none() -> None:
    client = FakeClient({("scheduler", True): [Msg(7)]})
    rt = replace(make_runtime(), service_bus=lambda: client)  # the worker's client, as get_runtime() sets it

    first = get_overview(rt)
    assert first.status == 200 and first.body["queuesError"] is None
    assert len(client.receivers) == 2 * QUEUES  # one per queue and per dead-letter queue
    assert len(client.peeks) == 2 * QUEUES  # one peek each: the Service Bus operations of a view

    client.peeks.clear()
    again = get_overview(rt)
    assert again.body["queues"] == first.body["queues"]
    assert len(client.receivers) == 2 * QUEUES  # none built: the first view's are used again
    assert len(client.peeks) == 2 * QUEUES
    assert not any(r.closed for r in client.receivers)

    # The dead-letters view peeks on the overview's receiver of that dead-letter queue: no new link.
    client.peeks.clear()
    page = deadletters.get_dead_letters(rt, {"queue": "scheduler"})
    assert page.status == 200 and [m["sequenceNumber"] for m in page.body["messages"]] == [7]
    assert client.peeks == [("scheduler", True, deadletters.DEFAULT_LIMIT + 1, 1)]
    assert len(client.receivers) == 2 * QUEUES


def test_each_client_has_its_own_receivers() -> None:
    one, other = FakeClient(), FakeClient()
    assert peek_receivers(one) is peek_receivers(one)
    assert peek_receivers(one) is not peek_receivers(other)
    deadletters.queue_depths(make_runtime(), client=one)
    deadletters.queue_depths(make_runtime(), client=other)
    assert len(one.receivers) == len(other.receivers) == 2 * QUEUES


def test_a_kept_receiver_that_fails_is_replaced_within_the_same_peek() -> None:
    client = FakeClient({("alerts", True): [Msg(3)]})
    pool = PeekReceivers(client)
    assert [m.sequence_number for m in pool.peek("alerts", 5, 1, dead_letter=True, timeout=10)] == [3]
    kept = client.receivers[0]
    kept.fail_next = True  # e.g. Service Bus detached its idle link and the SDK could not recover
    assert [m.sequence_number for m in pool.peek("alerts", 5, 1, dead_letter=True, timeout=10)] == [3]
    assert kept.closed and len(client.receivers) == 2 and not client.receivers[1].closed
    assert pool.built == 2


def test_a_new_receiver_that_fails_is_dropped_and_the_failure_raised() -> None:
    client = FakeClient(fail=True)
    with pytest.raises(deadletters.ServiceBusUnavailable):
        deadletters.peek_dead_letters(make_runtime(), "alerts", client=client)
    assert len(client.receivers) == 1 and client.receivers[0].closed  # tried once, not again
    client.fail = False
    assert deadletters.peek_dead_letters(make_runtime(), "alerts", client=client)["messages"] == []
    assert len(client.receivers) == 2  # the next view builds a new one


def test_a_receiver_unused_for_the_idle_time_is_closed() -> None:
    now = [1000.0]
    client = FakeClient()
    pool = PeekReceivers(client, idle_seconds=300, clock=lambda: now[0])
    pool.peek("scheduler", 1, 1, dead_letter=False, timeout=10)
    pool.peek("scheduler", 1, 1, dead_letter=True, timeout=10)
    now[0] += 200
    pool.peek("scheduler", 1, 1, dead_letter=True, timeout=10)  # used again: not idle
    assert pool.close_idle(now[0] + 100) == 1  # the active queue's, unused for 300 s, is closed
    assert [r.closed for r in client.receivers] == [True, False]
    assert pool.close_idle(now[0] + 300) == 0
    pool.peek("scheduler", 1, 1, dead_letter=False, timeout=10)  # built again on its next use
    assert pool.built == 3 and pool.open_count() == 1
    pool.close()
    assert all(r.closed for r in client.receivers) and pool.open_count() == 0


def test_the_next_peek_closes_the_idle_receivers_inside_its_own_call() -> None:
    """No thread of its own: an instance frozen between views leaves nothing half done."""
    now = [1000.0]
    client = FakeClient()
    pool = PeekReceivers(client, idle_seconds=300, clock=lambda: now[0])
    pool.peek("scheduler", 1, 1, dead_letter=False, timeout=10)
    now[0] += 300
    pool.peek("alerts", 1, 1, dead_letter=True, timeout=10)
    assert [r.closed for r in client.receivers] == [True, False] and pool.open_count() == 1
