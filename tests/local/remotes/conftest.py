"""The simulator, started the way the stack starts it: ``python -m local.remotes`` on a free port."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from local.procs import Proc, free_port
from local.remotes.client import RemotesClient

SEED = 7


def start_remotes(seed: int = SEED) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc("remotes", [sys.executable, "-m", "local.remotes", "--host", "127.0.0.1",
                            "--port", str(port), "--seed", str(seed)]).start("ready", timeout=30)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def remotes_server() -> Iterator[tuple[Proc, str]]:
    proc, url = start_remotes()
    yield proc, url
    proc.stop()
    assert not proc.alive()


@pytest.fixture
def client(remotes_server: tuple[Proc, str]) -> Iterator[RemotesClient]:
    c = RemotesClient(remotes_server[1])
    c.reset_state()  # each test starts with no ledger, no stored keys, no faults
    yield c
    c.close()


def order(total: str = "19.98", items: list[dict[str, Any]] | None = None, currency: str = "EUR") -> dict[str, Any]:
    return {"customerId": "c-1", "currency": currency, "total": total,
            "items": items or [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}]}


def call(base: str, service: str, operation: str, order_id: str, key: str | None, *,
         body_order: dict[str, Any] | None = None, context: dict[str, Any] | None = None,
         timeout: float = 10.0) -> requests.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    body = {"orderId": order_id, "order": body_order or order(), "context": context or {}}
    return requests.post(f"{base}/{service}/{operation}", json=body, headers=headers, timeout=timeout)
