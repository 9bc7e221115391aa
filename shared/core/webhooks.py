"""Webhooks when an order ends: the delivery row, its Supervisor watch, the signature, and the
pure decisions of a delivery (docs/operating.md, "Webhooks").

When an order ends (Processed, failed, held for an operator, terminated or cancelled), the ending
decision (``shared.core.statemachine.webhook``) writes a **delivery row** in the order's own
partition, in the ending's one transaction (RowKey ``hook-{seq}``, ``seq`` the first history event
that transaction writes: unique to the ending, the same when the decision is re-run on the same
view). So an ending that committed always has its delivery, and one that did not has none.

Before that transaction, a **watch** row is put in the deadline index (``webhook:...``, due a
little after the try is due, ``COVER`` later): the Supervisor's cover, as an order's own deadline
row covers its step. After the transaction, a message to ``WebhooksQueue`` asks the delivery
function for try 1 (not critical: the watch covers a lost one). Every later try is a scheduled
message, put by the try before it, with a new watch put first. Message ids are
``{webhookId}:{round}:{attempt}``: the same try sent twice is dropped by duplicate detection.

The delivery row says where a delivery is: ``pending`` (``attempt`` due at ``nextTryAt``, its
watch at ``coverAt``), ``delivered``, or ``failed`` (every try of the schedule failed; listed in
the search index under ``whfail-`` for the operator, who may send it again: a new ``round``, the
same ``webhook-id`` and body). Every write of it is ETag-conditioned.

A watch that falls due (``decide_watch``) finds the delivery row: gone or not pending (delivered,
or a failed one whose listing is written): the watch is deleted; a newer watch exists (the row's
``coverAt`` is later): deleted; pending and this is its watch: the try was lost (a crash, a
dead-lettered message), so it is sent again, with a new watch.

Signing: Standard Webhooks (standardwebhooks.com): ``webhook-signature: v1,<base64 of
HMAC-SHA256(key, "{id}.{timestamp}.{body}")>``, the key the base64 after ``whsec_``. About 20
lines (``sign``), checked against the spec's own test vector (tests/unit/core/test_webhooks.py),
so the app takes no dependency for it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from shared.core.effects import DeleteIndex, Effect, Log, PutWatch, Reindex, Send, Transact, order_bucket
from shared.core.messages import OutMessage
from shared.core.rows import IndexRow, SearchRow
from shared.core.rows.base import INT, TEXT, TIME, Row, props_of

HOOK_PREFIX = "hook-"
HOOK_END = "hook."  # the first key after every delivery row ('.' follows '-')
WATCH_PREFIX = "webhook:"
FAILED_PREFIX = "whfail-"  # a failed delivery's row in the search index (OrderIndexTable)
FAILED_END = "whfail."
SECRET_PREFIX = "whsec_"
# A try's watch falls due this long after the try is due: the POST's timeout (TRY_TIMEOUT), the
# queue's latency and a lock's redelivery fit in it. A watch due is a lost try: it is sent again.
COVER = timedelta(seconds=60)
TRY_TIMEOUT = timedelta(seconds=10)
# The delays after each failed try (Standard Webhooks' own example schedule, about 27 hours in all):
# 8 tries. ``WebhookRetrySchedule`` overrides it.
DEFAULT_SCHEDULE = "5s,5m,30m,2h,5h,10h,10h"
MAX_ERROR = 512  # characters of a try's error kept on the row
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
_STAMP = "%Y%m%dT%H%M%S%f"


def hook_key(seq: int) -> str:
    return f"{HOOK_PREFIX}{seq:08d}"


def webhook_id(order_id: str, seq: int) -> str:
    """The delivery's ``webhook-id``: the same on every try and every round."""
    return f"evt_{order_id}_{seq}"


# ---- settings -------------------------------------------------------------------------------------

class WebhookSettingError(ValueError):
    """A webhook setting the app cannot use (``shared.settings`` names it)."""


def parse_secret(raw: str) -> bytes:
    """The HMAC key of ``whsec_<base64>`` (standard base64, padding optional), at least 16 bytes."""
    if raw.startswith("@Microsoft.KeyVault("):
        raise WebhookSettingError("the Key Vault reference was not resolved (does the secret exist, and may the "
                                  "app's identity read it?)")
    if not raw.startswith(SECRET_PREFIX):
        raise WebhookSettingError(f"it does not start with {SECRET_PREFIX}; expected {SECRET_PREFIX}<the base64 of "
                                  "at least 16 random bytes>")
    text = raw[len(SECRET_PREFIX):].strip().rstrip("=")
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookSettingError(f"the part after {SECRET_PREFIX} is not base64") from None
    if len(key) < 16:
        raise WebhookSettingError(f"the key has {len(key)} bytes, fewer than 16")
    return key


_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_schedule(raw: str) -> tuple[float, ...]:
    """``5s,5m,30m,2h``: the delay after each failed try, in seconds (a try more than delays)."""
    out: list[float] = []
    for item in (p.strip() for p in (raw or DEFAULT_SCHEDULE).split(",")):
        unit = item[-1:] if item[-1:] in _UNITS else "s"
        number = item[:-1] if item[-1:] in _UNITS else item
        try:
            value = float(number) * _UNITS[unit]
        except ValueError:
            raise WebhookSettingError(f"{item!r} is not a delay (N, Ns, Nm or Nh)") from None
        if value < 0:
            raise WebhookSettingError(f"{item!r} is negative")
        out.append(value)
    return tuple(out)


# ---- signing (Standard Webhooks) ------------------------------------------------------------------

def sign(key: bytes, msg_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` header: ``v1,`` + base64 HMAC-SHA256 of ``id.timestamp.body``."""
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(key: bytes, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The headers of a try (the timestamp is the try's: a receiver checks it is recent)."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(key, msg_id, timestamp, body), "content-type": "application/json"}


# ---- rows -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class HookRow(Row):
    """A delivery (the order's partition, RowKey ``hook-{seq}``)."""

    key: str
    webhook_id: str
    type: str
    body: str  # the JSON body, fixed when the order ended: every try sends the same bytes
    status: str = PENDING
    round: int = 1  # 1, then one more per operator resend
    attempt: int = 1  # the try due (pending), or the last one made
    next_try_at: datetime | None = None
    cover_at: datetime | None = None  # the watch covering the try due
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_error: str | None = None
    tries: int = 0  # tries made, every round
    etag: str | None = None

    @property
    def row_key(self) -> str:
        return self.key


HookRow.PROPS = props_of(HookRow, {
    "key": ("RowKey", TEXT), "webhook_id": ("WebhookId", TEXT), "type": ("Type", TEXT), "body": ("Body", TEXT),
    "status": ("Status", TEXT), "round": ("Round", INT), "attempt": ("Attempt", INT),
    "next_try_at": ("NextTryAt", TIME), "cover_at": ("CoverAt", TIME), "created_at": ("CreatedAt", TIME),
    "updated_at": ("UpdatedAt", TIME), "last_error": ("LastError", TEXT), "tries": ("Tries", INT),
})


@dataclass(frozen=True)
class HookWatch:
    """The Supervisor looks at delivery ``key`` of ``order_id`` at ``due`` (a deadline index row)."""

    order_id: str
    key: str
    due: datetime

    @property
    def row(self) -> IndexRow:
        row_key = f"{WATCH_PREFIX}{self.order_id}:{self.key}:{self.due.strftime(_STAMP)}"
        return IndexRow(order_bucket(self.due, self.order_id), row_key, None, self.due)

    @classmethod
    def from_row(cls, row_key: str, due: datetime | None) -> HookWatch | None:
        """The watch an index row is, or None (another kind of row, or a malformed one)."""
        if not row_key.startswith(WATCH_PREFIX) or due is None:
            return None
        order_id, _, rest = row_key[len(WATCH_PREFIX):].rpartition(":")  # rest: the stamp
        order_id, _, key = order_id.rpartition(":")
        if not order_id or not key.startswith(HOOK_PREFIX) or not rest:
            return None
        return cls(order_id, key, due)


def watch_of(order_id: str, hook: HookRow) -> HookWatch | None:
    return HookWatch(order_id, hook.key, hook.cover_at) if hook.cover_at is not None else None


def failed_key(order_id: str, key: str) -> str:
    return f"{FAILED_PREFIX}{order_id}:{key}"


def parse_failed_key(row_key: str) -> tuple[str, str] | None:
    order_id, _, key = row_key[len(FAILED_PREFIX):].rpartition(":")
    return (order_id, key) if row_key.startswith(FAILED_PREFIX) and order_id and key.startswith(HOOK_PREFIX) else None


# ---- messages -------------------------------------------------------------------------------------

def delivery_message(queue: str, order_id: str, hook: HookRow, *, at: datetime | None = None,
                     again: str | None = None) -> OutMessage:
    """The message that asks for ``hook``'s try due (``at``: scheduled for then). ``again``: the
    Supervisor's re-send of a lost try, unique to its watch (the lost try's id may still be in the
    duplicate detection window)."""
    message_id = f"{hook.webhook_id}:{hook.round}:{hook.attempt}" + (f":{again}" if again else "")
    body = {"kind": "webhook", "orderId": order_id, "hook": hook.key, "round": hook.round, "attempt": hook.attempt}
    return OutMessage(queue=queue, body=body, message_id=message_id, correlation_id=order_id, subject="webhook",
                      scheduled_enqueue_time=at, application_properties={"kind": "webhook"})


@dataclass(frozen=True)
class DeliveryAsk:
    """A delivery message's body, read (``None`` from ``read_ask``: not one)."""

    order_id: str
    key: str
    round: int
    attempt: int


def read_ask(body: Any) -> DeliveryAsk | None:
    if not isinstance(body, dict) or body.get("kind") != "webhook":
        return None
    order_id, key, rnd, attempt = body.get("orderId"), body.get("hook"), body.get("round"), body.get("attempt")
    if not (isinstance(order_id, str) and isinstance(key, str) and key.startswith(HOOK_PREFIX)
            and isinstance(rnd, int) and isinstance(attempt, int)):
        return None
    return DeliveryAsk(order_id, key, rnd, attempt)


# ---- decisions ------------------------------------------------------------------------------------

def due_now(ask: DeliveryAsk, hook: HookRow | None) -> bool:
    """Is the try the message asks for the one the delivery row has due? Else it is stale (a copy of
    a try already made, a try of an earlier round, a delivery that ended): nothing is done."""
    return hook is not None and hook.status == PENDING and (hook.round, hook.attempt) == (ask.round, ask.attempt)


def _failed_row(order_id: str, hook: HookRow, now: datetime) -> SearchRow:
    return SearchRow(key=failed_key(order_id, hook.key), order_id=order_id, updated_at=now)


def decide_tried(order_id: str, hook: HookRow, error: str | None, now: datetime, schedule: tuple[float, ...],
                 queue: str) -> list[Effect]:
    """The effects of a try that ended: ``error`` None (a 2xx) or why it failed."""
    old = watch_of(order_id, hook)
    drop = [DeleteIndex(old.row.bucket, old.row.row_key)] if old is not None else []
    tries = hook.tries + 1
    if error is None:
        done = replace(hook, status=DELIVERED, tries=tries, updated_at=now, next_try_at=None, cover_at=None,
                       last_error=None)
        return [
            # Crash after this: delivered; the watch falls due and the sweep deletes it.
            Transact(order_id, (done.replacing(hook),), note="webhook delivered"),
            Log(logging.INFO, "webhook.delivered", order_id, None,
                {"webhookId": hook.webhook_id, "attempt": hook.attempt}),
            *drop,
        ]
    error = error[:MAX_ERROR]
    if hook.attempt <= len(schedule):  # a try is left: the next one, scheduled
        next_at = now + timedelta(seconds=schedule[hook.attempt - 1])
        later = replace(hook, attempt=hook.attempt + 1, tries=tries, next_try_at=next_at, cover_at=next_at + COVER,
                        updated_at=now, last_error=error)
        watch = watch_of(order_id, later)
        assert watch is not None
        return [
            # Crash after this: the row is unchanged: the message is redelivered and tried again
            # (a duplicate POST, the same webhook-id); this watch finds a newer one and goes.
            PutWatch(watch.row, note="webhook next try"),
            # Crash after this: the next try has no message; its watch falls due and re-sends it.
            Transact(order_id, (later.replacing(hook),), note="webhook try failed, next scheduled"),
            Send(delivery_message(queue, order_id, later, at=next_at), critical=False, what="webhook next try"),
            Log(logging.WARNING, "webhook.try_failed", order_id, None,
                {"webhookId": hook.webhook_id, "attempt": hook.attempt, "error": error,
                 "nextTryAt": next_at.isoformat()}),
            # Crash before this: the old watch falls due, finds a newer one, and goes.
            *drop,
        ]
    failed = replace(hook, status=FAILED, tries=tries, next_try_at=None, updated_at=now, last_error=error)
    return [
        # Crash after this: failed but not listed yet; the watch (kept) falls due and lists it.
        Transact(order_id, (failed.replacing(hook),), note="webhook gave up"),
        # A failure here keeps the watch (the executor skips the DeleteIndex after a failed Reindex).
        Reindex(order_id, (_failed_row(order_id, failed, now),)),
        Log(logging.ERROR, "webhook.failed", order_id, None,
            {"webhookId": hook.webhook_id, "tries": tries, "error": error}),
        *drop,
    ]


def decide_watch(watch: HookWatch, hook: HookRow | None, now: datetime, queue: str) -> list[Effect]:
    """A due watch of a delivery (module docstring). The last effect deletes the watch."""
    done = DeleteIndex(watch.row.bucket, watch.row.row_key)
    if hook is None or hook.cover_at is None or hook.cover_at > watch.due or hook.status == DELIVERED:
        # no delivery (its ending never committed, or the order was purged), a newer watch, or delivered
        return [done]
    if hook.status == FAILED:
        # given up: its listing may have been lost with a crash; written again (an upsert)
        return [Reindex(watch.order_id, (_failed_row(watch.order_id, hook, hook.updated_at or now),)), done]
    if hook.cover_at < watch.due:  # an older watch than the row's: a newer one covers it
        return [done]
    again = replace(hook, cover_at=now + TRY_TIMEOUT + COVER, updated_at=now)
    fresh = watch_of(watch.order_id, again)
    assert fresh is not None
    return [
        # Crash after this: nothing changed; this watch stays due and the next sweep redoes it.
        PutWatch(fresh.row, note="webhook try re-sent"),
        # Crash after this: the new watch covers the try; this one finds it newer and goes.
        Transact(watch.order_id, (again.replacing(hook),), note="webhook try lost, re-sent"),
        Send(delivery_message(queue, watch.order_id, again, again=watch.due.strftime(_STAMP)), critical=False,
             what="webhook try re-sent"),
        Log(logging.WARNING, "webhook.resent_lost_try", watch.order_id, None,
            {"webhookId": hook.webhook_id, "round": hook.round, "attempt": hook.attempt}),
        done,
    ]


def decide_resend(order_id: str, hook: HookRow, now: datetime, queue: str) -> list[Effect]:
    """An operator sends a failed delivery again: a new round from try 1, the same webhook-id and body."""
    again = replace(hook, status=PENDING, round=hook.round + 1, attempt=1, next_try_at=now, cover_at=now + COVER,
                    updated_at=now)
    watch = watch_of(order_id, again)
    assert watch is not None
    return [
        # Crash after this: still failed and listed; the operator's call failed: call again.
        PutWatch(watch.row, note="webhook resend"),
        # Crash after this: pending, the watch re-sends the try; the listing is dropped when read.
        Transact(order_id, (again.replacing(hook),), note="webhook resent by an operator"),
        Reindex(order_id, (), stale=(failed_key(order_id, hook.key),)),
        Send(delivery_message(queue, order_id, again), critical=False, what="webhook resend"),
    ]


def new_hook(order_id: str, seq: int, event_type: str, body: str, now: datetime) -> HookRow:
    """The delivery row an ending writes: try 1 due now, its watch ``COVER`` later."""
    return HookRow(key=hook_key(seq), webhook_id=webhook_id(order_id, seq), type=event_type, body=body,
                   next_try_at=now, cover_at=now + COVER, created_at=now, updated_at=now)
