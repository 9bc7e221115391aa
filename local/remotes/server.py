"""The remote services simulator: state (``Simulator``) and its HTTP front (``RemotesServer``).

Contract: docs/contracts.md, "Remote services". Behaviour worth knowing:

* **Idempotency.** The ``Idempotency-Key`` header is required (400 without it). Keys are scoped
  per service. The first call with a key that gets a definitive answer (200, or a 422
  permanent rejection) stores that answer; every later call with the key replays it and
  applies nothing. Calls with the same key are serialised by a lock per key, so concurrent
  duplicates apply the effect exactly once. 400s (malformed requests) and injected 503s are
  not stored: the caller may fix the request or retry.
* **Ledger.** Every applied effect is appended to the ledger (``GET /_ledger``), with its
  service, operation, idempotency key, order id, result and time. An idempotency key can
  appear at most once per service: tests detect double effects and compensations from it.
* **Call journal and down windows** (``local.remotes.journal``). ``GET /_calls?service=&since=``
  lists every service call received (time, operation, key, the fault injected into it);
  ``/_stats`` ``downWindows`` gives each period a service was down and the calls it received
  then (what a chaos run reports as the calls made to a dead remote).
* **Services.** ``inventory``: ``reserve``/``release`` (stock, the order workflow) and
  ``reserve-licence``/``release-licence`` (licences, the digital workflow); ``payment``:
  ``charge``/``refund``; ``shipping``: ``ship``; ``delivery``: ``deliver`` (digital goods, no
  undo). Every one has the same idempotency, ledger and faults.
* **Business rules.** ``release``, ``release-licence`` and ``refund`` find the effect to undo by
  the body's ``compensates.idempotencyKey`` (the key the original ``reserve``/``reserve-licence``/
  ``charge`` was sent with; without ``compensates``, by ``context["reserve-inventory"].reservationId``
  / ``context["reserve-licence"].licenceId`` / ``context["charge-payment"].paymentId``). The
  reservation or licence must belong to the order and still be held; the payment must belong to
  the order and not be refunded yet. Otherwise: 422. Money is ``Decimal`` throughout, and goes
  out as strings.
* **Compensating nothing (tombstones).** If no effect was ever applied under
  ``compensates.idempotencyKey``, ``release``/``refund`` answer 200 ``{"released": null,
  "nothingToUndo": true}`` / ``{"refundId": null, "nothingToUndo": true}``, record a ledger
  entry of kind ``tombstone`` and tombstone that key: a later original call with it (a charge
  arriving after its refund) gets 409 ``{"error": "compensated"}`` and applies nothing (not
  stored; every such call gets the 409). A key with a stored answer replays it as usual. The
  lookup, the tombstone and every effect happen under one lock, so an original call and its
  compensation racing each other end either "applied, then undone" or "tombstoned, refused".
* **Faults** (``PUT /_faults/{service}``; a PUT replaces the service's faults, unspecified
  fields go back to their defaults; ``DELETE /_faults`` resets all), applied in this order
  to every service call (after the 400 for a missing key):

  ``down``              ``true`` / ``"503"``: 503 for everything; ``"reset"``: the connection
                        is reset (TCP RST) without any response.
  ``hangRate``          this fraction of calls stall ``hangSeconds`` and then get a 503 with
                        no effect (the caller normally times out long before).
  ``hangSkus``          every call about an order holding one of these SKUs hangs so (every
                        attempt: the demo's shipment that never answers).
  ``latencyMs``         every other call takes this long (as processing time, while holding
                        its idempotency key: duplicates of a call in progress wait for it).
  ``transientRate``     this fraction of calls get a 503 with no effect.
  ``rejectSkus``        ``reserve`` or ``reserve-licence`` of an order holding one of these
                        SKUs: 422 (out of stock, no licence left).
  ``rejectAmountOver``  ``charge`` of more than this amount: 422.
  ``lostResponseRate``  this fraction of calls that apply an effect get a 503 instead of the
                        stored answer: the effect happened, the caller does not know. A retry
                        with the same key gets the stored answer.

  ``ratePerSecond``     the service's published rate limit (``null``: none). A call that would
                        be the (N+1)th one accepted within the last second gets 429 with
                        ``Retry-After`` (whole seconds, at least 1) and no effect, before any
                        other fault; ``/_stats`` counts it under status ``429`` and
                        ``injected.rateLimited``. A refused call does not use up the rate.

  The random draws come from one ``random.Random`` per service, seeded from ``--seed``.
"""

from __future__ import annotations

import copy
import json
import math
import random
import socket
import struct
import sys
import threading
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from local.remotes.journal import CallJournal, DownWindows

SERVICES: dict[str, tuple[str, ...]] = {
    "inventory": ("reserve", "release", "reserve-licence", "release-licence"),
    "payment": ("charge", "refund"),
    "shipping": ("ship",),
    "delivery": ("deliver",),
}

FAULT_DEFAULTS: dict[str, Any] = {
    "latencyMs": 0,
    "transientRate": 0.0,
    "hangRate": 0.0,
    "hangSeconds": 30,
    "hangSkus": [],
    "lostResponseRate": 0.0,
    "rejectSkus": [],
    "rejectAmountOver": None,
    "down": False,
    "ratePerSecond": None,
}

MAX_BODY_BYTES = 1 << 20
RESET = object()  # sentinel result: reset the connection instead of answering


class BadRequest(Exception):
    """A malformed request: 400, not stored under the idempotency key."""


class Rejected(Exception):
    """A permanent business rejection: 422, stored under the idempotency key."""


class Compensated(Exception):
    """The idempotency key was tombstoned by a compensation of nothing: 409, not stored."""


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _decimal(value: Any, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, Decimal)):
        raise BadRequest(f"{what} must be a decimal number or string")
    try:
        d = Decimal(value)
    except (InvalidOperation, ValueError):
        raise BadRequest(f"{what} is not a decimal: {value!r}") from None
    if not d.is_finite():
        raise BadRequest(f"{what} must be finite")
    return d


def _rate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise BadRequest(f"{name} must be a number in [0, 1]")
    r = float(value)
    if not 0.0 <= r <= 1.0:
        raise BadRequest(f"{name} must be in [0, 1]")
    return r


def _non_negative(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise BadRequest(f"{name} must be a non-negative number")
    v = float(value)
    if v < 0:
        raise BadRequest(f"{name} must be >= 0")
    return v


def _positive(value: Any, name: str) -> float:
    v = _non_negative(value, name)
    if v == 0:
        raise BadRequest(f"{name} must be > 0 (null: no limit)")
    return v


def validate_faults(raw: Any) -> dict[str, Any]:
    """Validate a ``PUT /_faults/{service}`` body; return the full fault set (defaults filled)."""
    if not isinstance(raw, dict):
        raise BadRequest("faults must be a JSON object")
    unknown = set(raw) - set(FAULT_DEFAULTS)
    if unknown:
        raise BadRequest(f"unknown fault fields: {sorted(unknown)}; known: {sorted(FAULT_DEFAULTS)}")
    f = copy.deepcopy(FAULT_DEFAULTS)
    for name in ("transientRate", "hangRate", "lostResponseRate"):
        if name in raw:
            f[name] = _rate(raw[name], name)
    for name in ("latencyMs", "hangSeconds"):
        if name in raw:
            f[name] = _non_negative(raw[name], name)
    for name in ("rejectSkus", "hangSkus"):
        if name in raw:
            skus = raw[name]
            if not isinstance(skus, list) or not all(isinstance(s, str) for s in skus):
                raise BadRequest(f"{name} must be a list of strings")
            f[name] = list(skus)
    if raw.get("rejectAmountOver") is not None:
        f["rejectAmountOver"] = str(_decimal(raw["rejectAmountOver"], "rejectAmountOver"))
    if raw.get("ratePerSecond") is not None:
        f["ratePerSecond"] = _positive(raw["ratePerSecond"], "ratePerSecond")
    if "down" in raw:
        down = raw["down"]
        if down in (True, "503", 503):
            f["down"] = True
        elif down in (False, None):
            f["down"] = False
        elif down == "reset":
            f["down"] = "reset"
        else:
            raise BadRequest('down must be true, false, "503" or "reset"')
    return f


def _holds_sku(body: Any, skus: list[str]) -> bool:
    """Whether a call's body is about an order holding one of ``skus`` (a malformed body holds none)."""
    order = body.get("order") if isinstance(body, dict) else None
    items = order.get("items") if isinstance(order, dict) else None
    return bool(skus) and isinstance(items, list) and any(isinstance(i, dict) and i.get("sku") in skus
                                                          for i in items)


@dataclass
class Hold:
    """Items the inventory holds for an order: a stock reservation or a licence."""

    order_id: str
    items: list[dict[str, Any]]
    released: bool = False


@dataclass
class Payment:
    order_id: str
    amount: Decimal
    currency: str
    refunded: bool = False


@dataclass
class Stored:
    operation: str
    status: int
    body: dict[str, Any]


@dataclass
class Outcome:
    status: int
    body: dict[str, Any] | None  # None with RESET
    reset: bool = False
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Stats:
    total: int = 0
    requests: dict[str, dict[str, dict[str, int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(int))))
    replays: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    # service -> fault kind (down, reset, hang, transient, lostResponse) -> calls it was applied to
    injected: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))


class Simulator:
    """All the simulator's state. Thread-safe; the HTTP layer is a thin front over it."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._lock = threading.Lock()  # guards everything below except the per-key locks' bodies
        self._faults: dict[str, dict[str, Any]] = {}
        self._rngs: dict[str, random.Random] = {}
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}
        self._stored: dict[tuple[str, str], Stored] = {}
        self._reservations: dict[str, Hold] = {}
        self._licences: dict[str, Hold] = {}
        self._payments: dict[str, Payment] = {}
        self._ledger: list[dict[str, Any]] = []
        # (service, key) -> (operation, result) of every effect applied under that key, and the
        # keys tombstoned by a compensation of nothing. Both change only under self._lock,
        # together with the effect itself.
        self._applied: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._tombstones: set[tuple[str, str]] = set()
        self._stats = _Stats()
        self._accepted: dict[str, deque[float]] = defaultdict(deque)  # ratePerSecond: calls let through
        self._journal = CallJournal()  # every call received, with the fault injected (GET /_calls)
        self._down = DownWindows()  # each period a service was down, and the calls it received then
        self.reset_faults()

    # ---- control -------------------------------------------------------------------------

    def reset_faults(self) -> None:
        with self._lock:
            self._faults = {s: copy.deepcopy(FAULT_DEFAULTS) for s in SERVICES}
            self._rngs = {s: random.Random(f"{self.seed}:{s}") for s in SERVICES}
            self._down.close_all(datetime.now(UTC))

    def set_faults(self, service: str, raw: Any) -> dict[str, Any]:
        if service not in SERVICES:
            raise KeyError(service)
        faults = validate_faults(raw)
        with self._lock:
            self._faults[service] = faults
            self._down.set_down(service, faults["down"], datetime.now(UTC))
        return copy.deepcopy(faults)

    def faults(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self._faults)

    def ledger(self, order_id: str | None = None, service: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(e) for e in self._ledger
                    if (order_id is None or e["orderId"] == order_id)
                    and (service is None or e["service"] == service)]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "total": self._stats.total,
                "requests": json.loads(json.dumps(self._stats.requests)),
                "replays": json.loads(json.dumps(self._stats.replays)),
                "injected": json.loads(json.dumps(self._stats.injected)),
                "effects": len(self._ledger),
                "storedKeys": len(self._stored),
                "downWindows": self._down.snapshot(),
                "calls": self._journal.summary(),
            }

    def calls(self, service: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """The call journal (``local.remotes.journal``): calls received, oldest first."""
        with self._lock:
            return self._journal.entries(service, since)

    def reset_state(self) -> None:
        """Forget everything: ledger, stored answers, reservations, licences, payments, stats and faults."""
        with self._lock:
            self._key_locks.clear()
            self._stored.clear()
            self._reservations.clear()
            self._licences.clear()
            self._payments.clear()
            self._ledger.clear()
            self._applied.clear()
            self._tombstones.clear()
            self._stats = _Stats()
            self._journal.clear()
            self._down.clear()
            self._accepted.clear()
        self.reset_faults()

    def count(self, service: str, operation: str, status: int | str) -> None:
        with self._lock:
            self._stats.total += 1
            self._stats.requests[service][operation][str(status)] += 1

    # ---- service calls -------------------------------------------------------------------

    def call(self, service: str, operation: str, key: str | None, body: Any) -> Outcome:
        """One service call, faults included. Blocks for latency and hangs."""
        if not key:
            return Outcome(400, {"error": "the Idempotency-Key header is required"})
        with self._lock:
            faults = copy.deepcopy(self._faults[service])
            throttled = self._throttled(service, faults["ratePerSecond"], time.monotonic())
            if throttled is not None:
                self._stats.injected[service]["rateLimited"] += 1
                self._journal.record(datetime.now(UTC), service, operation, key, "rateLimited")
                return throttled
            rng = self._rngs[service]
            # Draw all three every time: the sequence depends only on the seed and call order.
            hang, transient, lost = (rng.random() < faults["hangRate"],
                                     rng.random() < faults["transientRate"],
                                     rng.random() < faults["lostResponseRate"])
            hang = hang or _holds_sku(body, faults["hangSkus"])
            fault = ("reset" if faults["down"] == "reset" else "down" if faults["down"]
                     else "hang" if hang else "transient" if transient else None)
            if fault:
                self._stats.injected[service][fault] += 1
            arrived = datetime.now(UTC)
            journaled = self._journal.record(arrived, service, operation, key, fault)
            self._down.count_call(service, arrived)
        if faults["down"] == "reset":
            return Outcome(0, None, reset=True)
        if faults["down"]:
            return Outcome(503, {"error": f"{service} is down (injected)"})
        latency = faults["latencyMs"] / 1000.0
        if hang:
            time.sleep(faults["hangSeconds"])
            return Outcome(503, {"error": f"{service} timed out (injected hang)"})
        if transient:
            time.sleep(latency)
            return Outcome(503, {"error": f"{service} transient failure (injected)"})

        slot = (service, key)
        with self._lock:
            key_lock = self._key_locks.setdefault(slot, threading.Lock())
        with key_lock:
            with self._lock:
                stored = self._stored.get(slot)
                if stored is not None:
                    self._stats.replays[service][operation] += 1
            # The latency is the service's processing time, between looking the key up and
            # storing the answer: concurrent duplicates really overlap with the first call's work.
            time.sleep(latency)
            if stored is not None:
                if stored.operation != operation:
                    return Outcome(422, {"error": f"Idempotency-Key {key!r} was already used for "
                                                  f"{service}/{stored.operation}"})
                return Outcome(stored.status, copy.deepcopy(stored.body))
            try:
                result = self._apply(service, operation, key, body, faults)
                status = 200
            except BadRequest as e:
                return Outcome(400, {"error": str(e)})
            except Rejected as e:
                result, status = {"error": str(e)}, 422
            except Compensated:
                return Outcome(409, {"error": "compensated"})
            with self._lock:
                self._stored[slot] = Stored(operation, status, copy.deepcopy(result))
        if status == 200 and lost:
            with self._lock:
                self._stats.injected[service]["lostResponse"] += 1
                journaled["fault"] = "lostResponse"
            return Outcome(503, {"error": f"{service} response lost (injected; the effect was applied)"})
        return Outcome(status, result)

    def _throttled(self, service: str, rate: float | None, now: float) -> Outcome | None:
        """The ``ratePerSecond`` fault (under the lock): 429 + Retry-After for a call over the rate
        within the last second, else None (and the call is counted in the window)."""
        if rate is None:
            return None
        window = self._accepted[service]
        while window and window[0] <= now - 1.0:
            window.popleft()
        if len(window) >= rate:
            retry_after = max(1, math.ceil(window[0] + 1.0 - now))
            return Outcome(429, {"error": f"{service}: over {rate:g} calls per second (injected)"},
                           headers={"Retry-After": str(retry_after)})
        window.append(now)
        return None

    def _apply(self, service: str, operation: str, key: str, body: Any,
               faults: dict[str, Any]) -> dict[str, Any]:
        """Validate and apply one effect. Runs under the key's lock."""
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        order_id = body.get("orderId")
        if not isinstance(order_id, str) or not order_id:
            raise BadRequest("orderId (a non-empty string) is required")
        order = body.get("order")
        context = body.get("context") or {}
        if not isinstance(context, dict):
            raise BadRequest("context must be an object")
        compensates = body.get("compensates")
        if compensates is not None:
            if not isinstance(compensates, dict):
                raise BadRequest("compensates must be an object")
            target = compensates.get("idempotencyKey")
            if not isinstance(target, str) or not target.strip():
                raise BadRequest("compensates.idempotencyKey (a non-empty string) is required")
            if target.strip() == key:
                raise BadRequest("compensates.idempotencyKey must not be the compensation's own key")
        extra: dict[str, Any] = {"kind": "effect"}
        handler = getattr(self, f"_{service}_{operation.replace('-', '_')}")
        with self._lock:
            if (service, key) in self._tombstones:
                raise Compensated(key)
            result = handler(order_id, order, context, faults, extra, compensates)
            entry = {
                "seq": len(self._ledger) + 1,
                "service": service,
                "operation": operation,
                "idempotencyKey": key,
                "orderId": order_id,
                "result": copy.deepcopy(result),
                "at": _now(),
            }
            entry.update(extra)
            self._ledger.append(entry)
            if extra["kind"] == "effect":
                self._applied[(service, key)] = (operation, copy.deepcopy(result))
        return result

    # Each handler runs under self._lock; it validates, raises Rejected/BadRequest, or applies.

    @staticmethod
    def _order(order: Any) -> dict[str, Any]:
        if not isinstance(order, dict):
            raise BadRequest("order (an object) is required")
        return order

    @classmethod
    def _items(cls, order: Any) -> list[dict[str, Any]]:
        items = cls._order(order).get("items")
        if not isinstance(items, list) or not items:
            raise BadRequest("order.items must be a non-empty list")
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequest(f"order.items[{i}] must be an object")
            sku, qty = item.get("sku"), item.get("quantity")
            if not isinstance(sku, str) or not sku:
                raise BadRequest(f"order.items[{i}].sku must be a non-empty string")
            if isinstance(qty, bool) or not isinstance(qty, int) or qty <= 0:
                raise BadRequest(f"order.items[{i}].quantity must be a positive integer")
            out.append({"sku": sku, "quantity": qty})
        return out

    @staticmethod
    def _context_id(context: dict[str, Any], step: str, field_name: str) -> str:
        sub = context.get(step)
        value = sub.get(field_name) if isinstance(sub, dict) else None
        if not isinstance(value, str) or not value:
            raise Rejected(f'context["{step}"].{field_name} is missing: nothing to undo')
        return value

    def _undo_target(self, service: str, forward: str, step: str, field_name: str, context: dict[str, Any],
                     compensates: dict[str, Any] | None, extra: dict[str, Any]) -> str | None:
        """The id of the effect a compensation undoes, or None: nothing was ever applied under
        ``compensates.idempotencyKey``, which is then tombstoned. Runs under self._lock."""
        if compensates is None:
            return self._context_id(context, step, field_name)  # the older contract
        target = compensates["idempotencyKey"].strip()
        extra["compensates"] = target
        applied = self._applied.get((service, target))
        if applied is None:
            self._tombstones.add((service, target))
            extra["kind"] = "tombstone"
            return None
        operation, result = applied
        if operation != forward:
            raise Rejected(f"Idempotency-Key {target!r} was used for {service}/{operation}, not {forward}")
        value = str(result[field_name])
        sub = context.get(step)
        named = sub.get(field_name) if isinstance(sub, dict) else None
        if named and named != value:
            raise Rejected(f'context["{step}"].{field_name} {named} is not the effect of {target!r} ({value})')
        return value

    def _hold(self, holds: dict[str, Hold], prefix: str, refusal: str, order_id: str, order: Any,
              faults: dict[str, Any], extra: dict[str, Any]) -> str:
        """Hold the order's items in ``holds`` (refused for a rejected SKU); the new hold's id."""
        items = self._items(order)
        rejected = sorted({i["sku"] for i in items if i["sku"] in faults["rejectSkus"]})
        if rejected:
            raise Rejected(f"{refusal}: {', '.join(rejected)}")
        hid = _new_id(prefix)
        holds[hid] = Hold(order_id, items)
        extra["items"] = items
        return hid

    @staticmethod
    def _release(holds: dict[str, Hold], noun: str, hid: str | None, order_id: str) -> dict[str, Any]:
        """Release the hold ``hid`` of ``order_id`` (None: the undone step applied nothing)."""
        if hid is None:
            return {"released": None, "nothingToUndo": True}
        held = holds.get(hid)
        if held is None:
            raise Rejected(f"unknown {noun} {hid}")
        if held.order_id != order_id:
            raise Rejected(f"{noun} {hid} belongs to another order")
        if held.released:
            raise Rejected(f"{noun} {hid} was already released")
        held.released = True
        return {"released": hid}

    def _inventory_reserve(self, order_id: str, order: Any, context: dict[str, Any],
                           faults: dict[str, Any], extra: dict[str, Any],
                           compensates: dict[str, Any] | None) -> dict[str, Any]:
        return {"reservationId": self._hold(self._reservations, "res", "out of stock", order_id, order, faults, extra)}

    def _inventory_release(self, order_id: str, order: Any, context: dict[str, Any],
                           faults: dict[str, Any], extra: dict[str, Any],
                           compensates: dict[str, Any] | None) -> dict[str, Any]:
        rid = self._undo_target("inventory", "reserve", "reserve-inventory", "reservationId", context,
                                compensates, extra)
        return self._release(self._reservations, "reservation", rid, order_id)

    def _inventory_reserve_licence(self, order_id: str, order: Any, context: dict[str, Any],
                                   faults: dict[str, Any], extra: dict[str, Any],
                                   compensates: dict[str, Any] | None) -> dict[str, Any]:
        return {"licenceId": self._hold(self._licences, "lic", "no licence left", order_id, order, faults, extra)}

    def _inventory_release_licence(self, order_id: str, order: Any, context: dict[str, Any],
                                   faults: dict[str, Any], extra: dict[str, Any],
                                   compensates: dict[str, Any] | None) -> dict[str, Any]:
        lid = self._undo_target("inventory", "reserve-licence", "reserve-licence", "licenceId", context,
                                compensates, extra)
        return self._release(self._licences, "licence", lid, order_id)

    def _payment_charge(self, order_id: str, order: Any, context: dict[str, Any],
                        faults: dict[str, Any], extra: dict[str, Any],
                        compensates: dict[str, Any] | None) -> dict[str, Any]:
        o = self._order(order)
        amount = _decimal(o.get("total"), "order.total")
        if amount <= 0:
            raise BadRequest("order.total must be positive")
        currency = o.get("currency")
        if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
            raise BadRequest("order.currency must be a 3-letter code")
        limit = faults["rejectAmountOver"]
        if limit is not None and amount > Decimal(limit):
            raise Rejected(f"amount {amount} {currency} exceeds the limit {limit}")
        pid = _new_id("pay")
        self._payments[pid] = Payment(order_id, amount, currency)
        extra.update(amount=str(amount), currency=currency)
        return {"paymentId": pid, "amount": str(amount)}

    def _payment_refund(self, order_id: str, order: Any, context: dict[str, Any],
                        faults: dict[str, Any], extra: dict[str, Any],
                        compensates: dict[str, Any] | None) -> dict[str, Any]:
        pid = self._undo_target("payment", "charge", "charge-payment", "paymentId", context, compensates, extra)
        if pid is None:
            return {"refundId": None, "nothingToUndo": True}
        pay = self._payments.get(pid)
        if pay is None:
            raise Rejected(f"unknown payment {pid}")
        if pay.order_id != order_id:
            raise Rejected(f"payment {pid} belongs to another order")
        if pay.refunded:
            raise Rejected(f"payment {pid} was already refunded")
        pay.refunded = True
        extra.update(amount=str(pay.amount), currency=pay.currency, paymentId=pid)
        return {"refundId": _new_id("ref")}

    def _shipping_ship(self, order_id: str, order: Any, context: dict[str, Any],
                       faults: dict[str, Any], extra: dict[str, Any],
                       compensates: dict[str, Any] | None) -> dict[str, Any]:
        extra["items"] = self._items(order)
        return {"shipmentId": _new_id("shp")}

    def _delivery_deliver(self, order_id: str, order: Any, context: dict[str, Any],
                          faults: dict[str, Any], extra: dict[str, Any],
                          compensates: dict[str, Any] | None) -> dict[str, Any]:
        extra["items"] = self._items(order)
        return {"deliveryId": _new_id("dlv")}


# ---- HTTP -------------------------------------------------------------------------------------


def _json_default(o: Any) -> Any:
    if isinstance(o, Decimal):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so clients can pool connections
    server_version = "remotes-simulator/1"
    timeout = 300  # idle keep-alive connections are dropped after this
    server: RemotesServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm
        # and the peer's delayed ACK add ~40 ms to every keep-alive response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    # -- plumbing

    def _read_body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(413, {"error": "body too large"})
            self.close_connection = True
            return None
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, default=_json_default).encode()
        try:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the caller gave up (a client timeout during a hang)

    def _reset(self) -> None:
        """Abort the connection with a TCP RST and no response."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.server.mark_reset(self.connection)
        self.close_connection = True

    def _parse_json(self, raw: bytes) -> Any:
        if not raw:
            return None
        return json.loads(raw, parse_float=Decimal)

    def _route(self) -> tuple[list[str], dict[str, list[str]]]:
        parts = urlsplit(self.path)
        return [p for p in parts.path.split("/") if p], parse_qs(parts.query)

    # -- verbs

    def do_POST(self) -> None:  # noqa: N802
        raw = self._read_body()
        if raw is None:
            return
        path, _ = self._route()
        if len(path) != 2 or path[0] not in SERVICES:
            self._send(404, {"error": f"no such service: {self.path}"})
            return
        service, operation = path
        if operation not in SERVICES[service]:
            self._send(404, {"error": f"{service} has no operation {operation!r}; "
                                      f"known: {list(SERVICES[service])}"})
            return
        sim = self.server.simulator
        try:
            body = self._parse_json(raw)
        except ValueError:
            sim.count(service, operation, 400)
            self._send(400, {"error": "the body is not valid JSON"})
            return
        key = self.headers.get("Idempotency-Key")
        outcome = sim.call(service, operation, key.strip() if key else None, body)
        if outcome.reset:
            sim.count(service, operation, "reset")
            self._reset()
            return
        sim.count(service, operation, outcome.status)
        self._send(outcome.status, outcome.body, outcome.headers)

    def do_GET(self) -> None:  # noqa: N802
        path, query = self._route()
        sim = self.server.simulator
        if path == ["_health"]:
            self._send(200, {"status": "ok", "seed": sim.seed, "services": list(SERVICES)})
        elif path == ["_ledger"]:
            order_id, service = (query[k][0] if query.get(k) else None for k in ("orderId", "service"))
            self._send(200, {"effects": sim.ledger(order_id=order_id, service=service)})
        elif path == ["_stats"]:
            self._send(200, sim.stats())
        elif path == ["_calls"]:
            service, since = (query[k][0] if query.get(k) else None for k in ("service", "since"))
            try:
                self._send(200, {"calls": sim.calls(service=service, since=since)})
            except ValueError:
                self._send(400, {"error": "since must be an ISO 8601 time"})
        elif path == ["_faults"]:
            self._send(200, sim.faults())
        elif len(path) == 2 and path[0] == "_faults" and path[1] in SERVICES:
            self._send(200, sim.faults()[path[1]])
        else:
            self._send(404, {"error": f"not found: {self.path}"})

    def do_PUT(self) -> None:  # noqa: N802
        raw = self._read_body()
        if raw is None:
            return
        path, _ = self._route()
        if len(path) != 2 or path[0] != "_faults":
            self._send(404, {"error": f"not found: {self.path}"})
            return
        if path[1] not in SERVICES:
            self._send(404, {"error": f"unknown service {path[1]!r}; known: {list(SERVICES)}"})
            return
        try:
            body = self._parse_json(raw)
            self._send(200, self.server.simulator.set_faults(path[1], body if body is not None else {}))
        except ValueError:
            self._send(400, {"error": "the body is not valid JSON"})
        except BadRequest as e:
            self._send(400, {"error": str(e)})

    def do_DELETE(self) -> None:  # noqa: N802
        if self._read_body() is None:
            return
        path, _ = self._route()
        sim = self.server.simulator
        if path == ["_faults"]:
            sim.reset_faults()
            self._send(200, sim.faults())
        elif path == ["_state"]:
            sim.reset_state()
            self._send(200, {"reset": True})
        else:
            self._send(404, {"error": f"not found: {self.path}"})


class RemotesServer(ThreadingHTTPServer):
    """One thread per connection: a hanging call never blocks any other."""

    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True

    def __init__(self, host: str, port: int, seed: int = 0, verbose: bool = False) -> None:
        self.simulator = Simulator(seed)
        self.verbose = verbose
        self._reset_lock = threading.Lock()
        self._to_reset: set[int] = set()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def mark_reset(self, sock: socket.socket) -> None:
        with self._reset_lock:
            self._to_reset.add(id(sock))

    def shutdown_request(self, request: Any) -> None:
        with self._reset_lock:
            reset = id(request) in self._to_reset
            self._to_reset.discard(id(request))
        if reset:
            # No shutdown(SHUT_WR): that would send a FIN. close() with SO_LINGER 0 sends RST.
            self.close_request(request)
        else:
            super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return  # callers hanging up (timeouts, resets) are business as usual here
        super().handle_error(request, client_address)


def serve(host: str, port: int, seed: int = 0, verbose: bool = False) -> RemotesServer:
    """Start a server on a background thread (for in-process use); returns it. Stop with shutdown()."""
    server = RemotesServer(host, port, seed=seed, verbose=verbose)
    threading.Thread(target=server.serve_forever, name="remotes", daemon=True).start()
    return server
