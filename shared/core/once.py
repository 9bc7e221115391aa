"""The app's one way to hold a worker-wide object: built on first use, then kept.

A worker runs its invocations on several threads, so the first use may come from two at once:
one builds, the others wait for it, and the object is never built twice (two Service Bus clients
would each open their connections). Tests set ``value`` (through ``monkeypatch``) to put another
object in place, or None to have it built again.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Once(Generic[T]):
    """``build``'s result, built by the first call and returned by every call after it."""

    def __init__(self, build: Callable[[], T]) -> None:
        self.build = build
        self.value: T | None = None
        self._lock = threading.Lock()
        functools.update_wrapper(self, build)

    def __call__(self) -> T:
        value = self.value
        if value is None:
            with self._lock:
                if self.value is None:
                    self.value = self.build()
                value = self.value
        return value


def once(build: Callable[[], T]) -> Once[T]:
    """Decorate a function of no argument that builds a worker-wide object."""
    return Once(build)
