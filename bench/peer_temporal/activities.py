"""The Temporal peer's activities: the DBOS peer's remote calls (bench/peer_dbos/remote.py, the
same keys, bodies and answers), run on the worker's thread pool (one keep-alive connection per
thread and destination)."""

from __future__ import annotations

import json
from typing import Any

from temporalio import activity

from bench.peer_dbos import remote


@activity.defn(name="call_step")
def call_step(service: str, operation: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """One forward call: ``{"outcome": …}``, or raises remote.Transient, which Temporal retries."""
    return remote.call(service, operation, key, body)


@activity.defn(name="call_compensation")
def call_compensation(service: str, operation: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    return remote.call(service, operation, key, body)


@activity.defn(name="notify")
def notify(body: dict[str, Any]) -> None:
    remote.post_status(json.dumps(body).encode())


ACTIVITIES = [call_step, call_compensation, notify]
