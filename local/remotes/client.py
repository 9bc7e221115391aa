"""A small client of the remote services simulator's control endpoints (and its services).

    c = RemotesClient("http://127.0.0.1:7081")
    c.set_faults("payment", transientRate=0.2, latencyMs=50)
    c.set_faults("inventory", reject_skus=["SKU-9"])      # snake_case works too
    c.reset_faults()
    c.ledger(order_id="o-1"); c.stats(); c.health()
    c.calls(service="shipping"); c.down_windows()
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import requests

from local.remotes.server import FAULT_DEFAULTS


def _camel(name: str) -> str:
    if name in FAULT_DEFAULTS:
        return name
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


class RemotesClient:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> RemotesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, service: str) -> str:
        """The base URL of one service, as the *ServiceUrl settings hold it."""
        return f"{self.base_url}/{service}"

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        r = self.session.request(method, self.base_url + path, timeout=self.timeout, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text}")
        return r.json()

    # ---- control

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/_health")

    def set_faults(self, service: str, **faults: Any) -> dict[str, Any]:
        """Replace ``service``'s faults; fields not given go back to their defaults."""
        body = {_camel(k): v for k, v in faults.items()}
        return self._json("PUT", f"/_faults/{service}", json=body)

    def faults(self) -> dict[str, dict[str, Any]]:
        return self._json("GET", "/_faults")

    def reset_faults(self) -> dict[str, Any]:
        return self._json("DELETE", "/_faults")

    def reset_state(self) -> None:
        """Forget the ledger, stored answers, reservations, payments, stats and faults."""
        self._json("DELETE", "/_state")

    def ledger(self, order_id: str | None = None, service: str | None = None) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("orderId", order_id), ("service", service)) if v}
        return self._json("GET", "/_ledger", params=params)["effects"]

    def stats(self) -> dict[str, Any]:
        return self._json("GET", "/_stats")

    def calls(self, service: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """The simulator's call journal: every call received (``at``, ``service``, ``operation``,
        ``idempotencyKey``, ``fault``), oldest first; only ``service``'s, from ``since`` (ISO) on."""
        params = {k: v for k, v in (("service", service), ("since", since)) if v}
        return self._json("GET", "/_calls", params=params)["calls"]

    def down_windows(self) -> list[dict[str, Any]]:
        """Each period a service was down: ``service``, ``mode``, ``from``, ``to``, ``calls``."""
        return list(self.stats().get("downWindows") or [])

    # ---- ledger checks for tests

    def duplicate_effects(self) -> list[tuple[str, str]]:
        """(service, idempotencyKey) pairs applied more than once: must always be empty."""
        counts = Counter((e["service"], e["idempotencyKey"]) for e in self.ledger())
        return [k for k, n in counts.items() if n > 1]

    def effects_by_order(self) -> dict[str, Counter[str]]:
        """orderId -> Counter of "service/operation" effects (tombstones are not effects: a
        compensation that found nothing to undo)."""
        out: dict[str, Counter[str]] = {}
        for e in self.ledger():
            if e.get("kind") == "tombstone":
                continue
            out.setdefault(e["orderId"], Counter())[f"{e['service']}/{e['operation']}"] += 1
        return out

    # ---- the services themselves (what an agent does)

    def call(self, service: str, operation: str, body: dict[str, Any], idempotency_key: str | None,
             timeout: float | None = None) -> requests.Response:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        return self.session.post(f"{self.base_url}/{service}/{operation}", json=body, headers=headers,
                                 timeout=timeout or self.timeout)
