"""The console's peek receivers: one per queue and per dead-letter queue, kept from one view to the next.

A ``ServiceBusReceiver`` opened for one peek and closed after it costs more than the peek: a
connection, its authentication, the receive link and the management link pair, then their close
(about 1 s on the local emulator, for a peek of a few ms). The overview peeks every queue and
every dead-letter queue (28 peeks) at each refresh, so each worker keeps one receiver per
(queue, dead-letter queue or not) of a ``ServiceBusClient`` (``peek_receivers``), built on first
use and reused by every later view, as the app keeps its senders (``shared.runtime.clients``):

* a receiver is used by one thread at a time (it is not thread-safe): each has its own lock;
* it only peeks, which issues no link credit: an idle receiver receives nothing and locks nothing;
* one that fails is closed and dropped; if it was kept from an earlier view (its link may have
  been detached since, or its client closed), the peek is tried once more on a new receiver,
  within what is left of the same time budget;
* one not used for ``IDLE_CLOSE_SECONDS`` is closed by the next peek (``close_idle``), inside
  that invocation: no thread of its own, so a frozen or recycled instance leaves nothing half
  done (the service drops a frozen instance's idle connections; the next peek builds anew).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

IDLE_CLOSE_SECONDS = 300.0


@dataclass
class _Slot:
    """The receiver of one (queue, dead letter?), behind its own lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    receiver: Any = None
    last_used: float = 0.0


class PeekReceivers:
    """The peek receivers of one ``ServiceBusClient`` (see the module). ``built`` counts the
    receivers it has built: each is a connection and its links."""

    def __init__(self, client: Any, *, idle_seconds: float = IDLE_CLOSE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: dict[tuple[str, bool], _Slot] = {}
        self.built = 0

    def peek(self, queue: str, count: int, sequence_number: int, *, dead_letter: bool, timeout: float) -> list[Any]:
        """Up to ``count`` messages of ``queue`` (or its dead-letter queue) from ``sequence_number``
        on: one peek request, on the kept receiver. Raises what the SDK raises."""
        self.close_idle()
        slot = self._slot(queue, dead_letter)
        deadline = time.monotonic() + timeout
        with slot.lock:
            kept = slot.receiver is not None
            try:
                return self._peek(slot, queue, dead_letter, count, sequence_number, timeout)
            except Exception:
                left = deadline - time.monotonic()
                if not kept or left <= 0:
                    raise
            # the kept receiver failed and was dropped: once more, on a new one
            return self._peek(slot, queue, dead_letter, count, sequence_number, left)

    def open_count(self) -> int:
        with self._lock:
            return sum(1 for slot in self._slots.values() if slot.receiver is not None)

    def close_idle(self, now: float | None = None) -> int:
        """Close every receiver not used for ``idle_seconds`` (one in use is not idle); the
        number still open."""
        now = self._clock() if now is None else now
        with self._lock:
            slots = list(self._slots.values())
        taken = []
        for slot in slots:
            if not slot.lock.acquire(blocking=False):
                continue  # peeking right now
            try:
                if slot.receiver is not None and now - slot.last_used >= self.idle_seconds:
                    taken.append(slot.receiver)
                    slot.receiver = None
            finally:
                slot.lock.release()
        _close_all(taken)
        return self.open_count()

    def close(self) -> None:
        """Close every receiver; a later peek builds them again."""
        with self._lock:
            slots = list(self._slots.values())
        taken = []
        for slot in slots:
            with slot.lock:
                if slot.receiver is not None:
                    taken.append(slot.receiver)
                    slot.receiver = None
        _close_all(taken)

    def _slot(self, queue: str, dead_letter: bool) -> _Slot:
        with self._lock:
            slot = self._slots.get((queue, dead_letter))
            if slot is None:
                slot = self._slots[(queue, dead_letter)] = _Slot()
            return slot

    def _peek(self, slot: _Slot, queue: str, dead_letter: bool, count: int, sequence_number: int,
              timeout: float) -> list[Any]:
        if slot.receiver is None:
            from azure.servicebus import ServiceBusSubQueue

            sub_queue = ServiceBusSubQueue.DEAD_LETTER if dead_letter else None
            slot.receiver = self.client.get_queue_receiver(queue, sub_queue=sub_queue)
            with self._lock:
                self.built += 1
        slot.last_used = self._clock()
        try:
            return list(slot.receiver.peek_messages(max_message_count=count, sequence_number=sequence_number,
                                                    timeout=timeout))
        except Exception:
            _close(slot)
            raise


def _close(slot: _Slot) -> None:
    receiver, slot.receiver = slot.receiver, None
    if receiver is not None:
        _close_receiver(receiver)


def _close_all(receivers: list[Any]) -> None:
    """Close ``receivers`` side by side: each close waits for the service's answer (about 0.6 s
    on the local emulator)."""
    if receivers:
        with ThreadPoolExecutor(max_workers=len(receivers)) as pool:
            list(pool.map(_close_receiver, receivers))


def _close_receiver(receiver: Any) -> None:
    try:
        receiver.close()
    except Exception:  # noqa: BLE001 - best effort: the receiver is dropped either way
        pass


_pools: dict[int, PeekReceivers] = {}
_pools_lock = threading.Lock()


def peek_receivers(client: Any) -> PeekReceivers:
    """The worker's peek receivers of ``client`` (the worker's ``ServiceBusClient``, or a test's)."""
    with _pools_lock:
        pool = _pools.get(id(client))
        if pool is None or pool.client is not client:
            pool = _pools[id(client)] = PeekReceivers(client)
        return pool


def close_peek_receivers() -> None:
    """Close and forget every client's peek receivers (the tests, between them)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
