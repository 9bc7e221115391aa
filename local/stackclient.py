"""The local stack as local.demo uses it: StackError, demo order bodies, and DemoStack (Stack is one)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import requests

    from local.remotes.client import RemotesClient


class StackError(RuntimeError):
    pass


class DemoStack(Protocol):
    """The stack the demo runs on (local.stack.Stack): its orders over HTTP and its remotes simulator."""

    @property
    def remotes(self) -> RemotesClient: ...

    def post_order(self, body: Mapping[str, Any], session: requests.Session | None = None,
                   timeout: float = 30.0) -> str: ...

    def send_event(self, order_id: str, name: str, body: Mapping[str, Any],
                   session: requests.Session | None = None, timeout: float = 30.0) -> str: ...

    def get_order(self, order_id: str, session: requests.Session | None = None,
                  timeout: float = 30.0) -> dict[str, Any]: ...


# ---- orders: the demo's ordinary orders ---------------------------------------------------------

_SKUS = [("SKU-1", 9.99), ("SKU-2", 4.5), ("SKU-3", 19.0), ("SKU-4", 0.1), ("SKU-5", 129.95)]


def demo_order(rng: random.Random) -> dict[str, Any]:
    items = [{"sku": sku, "quantity": rng.randint(1, 3), "unitPrice": price}
             for sku, price in rng.sample(_SKUS, rng.randint(1, 3))]
    return {"customerId": f"c-{rng.randint(1, 20)}", "currency": "EUR", "items": items,
            "priority": "high" if rng.random() < 0.2 else "normal", "statusQueue": None}

