"""Webhook deliveries, the shell of ``shared.core.webhooks``: a try (the delivery function), a due
watch (the Supervisor), an operator's resend and the list of failed deliveries.

A try POSTs the delivery row's body to ``WebhookUrl`` (the setting: never a URL of an order),
signed (Standard Webhooks), with a timeout, no redirect followed and no retry inside the try; a
2xx delivers it. It is never made inside an order's transaction: the ending committed before its
message was sent, and the try's own writes touch only the delivery row (ETag-conditioned).

Seen as the agents' calls are: the try in a CONSUMER span of the order's trace (the message carries
the context of the ending that sent it, so it follows the order's sampling), the POST in a CLIENT
span (``http.url`` without its query: a receiver's token stays out of the telemetry), and the
``orders.webhooks`` metric counts each try by outcome, whatever the sampling.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import urllib3

from shared.core import webhooks
from shared.core.effects import Send
from shared.core.messages import PoisonMessage
from shared.core.webhooks import HookRow, HookWatch
from shared.observability import metrics, telemetry
from shared.observability.logs import log_event
from shared.runtime import Runtime
from shared.settings import WebhookTarget

# (target, webhook-id, body) -> None when delivered, else why not
Post = Callable[[WebhookTarget, str, str, datetime], "str | None"]

_pool = urllib3.PoolManager(num_pools=4, maxsize=16, retries=False)


def post(target: WebhookTarget, msg_id: str, body: str, now: datetime) -> str | None:
    """One signed POST, in its CLIENT span; None on a 2xx, else what went wrong (a status, or the
    error's name)."""
    headers = webhooks.headers(target.key, msg_id, int(now.timestamp()), body)
    timeout = urllib3.Timeout(connect=5.0, read=webhooks.TRY_TIMEOUT.total_seconds())
    try:
        with telemetry.client_span("POST", shown_url(target.url), headers) as call:
            r = _pool.request("POST", target.url, body=body.encode("utf-8"), headers=call.headers, timeout=timeout,
                              redirect=False, retries=False, preload_content=True)
            call.answered(r.status)
    except urllib3.exceptions.HTTPError as exc:  # recorded on the span, which it left
        return f"{type(exc).__name__}: {exc}"
    return None if 200 <= r.status < 300 else f"HTTP {r.status}"


def shown_url(url: str) -> str:
    """``url`` as telemetry shows it: no user, password, query or fragment (a token may be there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _read(rt: Runtime, order_id: str, key: str) -> HookRow | None:
    entity = rt.store.read_row(order_id, key)
    return HookRow.from_entity(entity) if entity is not None else None


def handle_delivery(rt: Runtime, body: Any, *, send: Post = post, message_id: str | None = None,
                    traceparent: str | None = None) -> str:
    """The delivery function's message (its JSON body, bytes or parsed; its id and the context it
    carries): make the try it asks for, if it is the one due (a message that is not a delivery is
    poison). Returns what was done (for logs and tests): ``stale``, ``delivered``, ``retry`` or
    ``failed``; a try's outcome is counted (``orders.webhooks``)."""
    with telemetry.consumer_span("process webhooks", traceparent, **{"messaging.message.id": message_id}):
        outcome = _deliver(rt, body, send)
    if outcome != "stale":
        metrics.webhooks.add(1, {"outcome": outcome})
    return outcome


def _deliver(rt: Runtime, body: Any, send: Post) -> str:
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except ValueError:
            body = None
    ask = webhooks.read_ask(body)
    if ask is None:  # never one: dead-lettered at once, with the reason (functions/settlement.py)
        raise PoisonMessage("not a webhook delivery message (kind webhook, orderId, hook, round, attempt)",
                            reason="NotADelivery")
    hook = _read(rt, ask.order_id, ask.key)
    if not webhooks.due_now(ask, hook):
        return "stale"  # a copy, an earlier round's, or a delivery that ended
    assert hook is not None
    now = rt.clock()
    target = rt.webhook
    error = send(target, hook.webhook_id, hook.body, now) if target is not None else "WebhookUrl is not set"
    effects = webhooks.decide_tried(ask.order_id, hook, error, rt.clock(), rt.config.webhook_schedule,
                                    rt.config.queues["WebhooksQueue"])
    outcome = rt.run(effects)
    if outcome.lost_race:
        return "stale"  # another copy of the try (the Supervisor's re-send) recorded it first
    if error is None:
        return "delivered"
    return "retry" if hook.attempt <= len(rt.config.webhook_schedule) else "failed"


def handle_watch(rt: Runtime, watch: HookWatch, now: datetime) -> str:
    """A due watch (the sweep): what ``decide_watch`` decides, done."""
    effects = webhooks.decide_watch(watch, _read(rt, watch.order_id, watch.key), now,
                                    rt.config.queues["WebhooksQueue"])
    outcome = rt.run(effects)
    if outcome.lost_race:
        return "lost_race"  # the try recorded itself meanwhile: this watch stays due, looked at again
    return "resent" if any(isinstance(e, Send) for e in effects) else "deleted"


def failed_deliveries(rt: Runtime, limit: int = 100) -> list[dict[str, Any]]:
    """The deliveries that gave up, newest listing first, as the operator's API shows them; a
    listing whose delivery is no longer failed (sent again, or purged) is left out."""
    out: list[dict[str, Any]] = []
    for row in rt.store.query_index(webhooks.FAILED_PREFIX, webhooks.FAILED_END, limit):
        keys = webhooks.parse_failed_key(row.key)
        hook = _read(rt, *keys) if keys is not None else None
        if keys is None or hook is None or hook.status != webhooks.FAILED:
            if hook is None:  # its order was purged (retention): the listing goes too, best effort
                _forget(rt, row.key)
            continue
        out.append(view_of(keys[0], hook))
    out.sort(key=lambda d: d.get("updatedAt") or "", reverse=True)
    return out


def order_deliveries(rt: Runtime, order_id: str, limit: int = 100) -> list[dict[str, Any]]:
    """Every delivery of one order (one range query of its partition), its latest ending first."""
    rows = rt.store.read_range(order_id, webhooks.HOOK_PREFIX, webhooks.HOOK_END, limit)
    return [view_of(order_id, HookRow.from_entity(e)) for _k, e in sorted(rows.items(), reverse=True)]


def _forget(rt: Runtime, key: str) -> None:
    try:
        rt.store.write_index((), (), stale=(key,))
    except Exception as exc:  # noqa: BLE001 - the next listing tries again
        log_event(logging.WARNING, "webhook.listing_delete_failed", row=key, error=repr(exc))


def view_of(order_id: str, hook: HookRow) -> dict[str, Any]:
    """A delivery as the API shows it (its body is the event, as sent)."""
    return {"orderId": order_id, "webhookId": hook.webhook_id, "delivery": hook.key, "type": hook.type,
            "status": hook.status, "round": hook.round, "attempt": hook.attempt, "tries": hook.tries,
            "lastError": hook.last_error, "nextTryAt": hook.next_try_at.isoformat() if hook.next_try_at else None,
            "createdAt": hook.created_at.isoformat() if hook.created_at else None,
            "updatedAt": hook.updated_at.isoformat() if hook.updated_at else None}


def resend(rt: Runtime, order_id: str, key: str) -> dict[str, Any] | None:
    """Send a failed delivery again (a new round, the same webhook-id). None: no such delivery;
    a delivery that is not failed is returned as it is (nothing to do)."""
    hook = _read(rt, order_id, key) if key.startswith(webhooks.HOOK_PREFIX) else None
    if hook is None:
        return None
    if hook.status != webhooks.FAILED:
        return view_of(order_id, hook)
    effects = webhooks.decide_resend(order_id, hook, rt.clock(), rt.config.queues["WebhooksQueue"])
    outcome = rt.run(effects)
    if outcome.lost_race:
        fresh = _read(rt, order_id, key)
        return view_of(order_id, fresh) if fresh is not None else None
    log_event(logging.WARNING, "webhook.resent", order_id=order_id, webhookId=hook.webhook_id, round=hook.round + 1)
    again = _read(rt, order_id, key)
    return view_of(order_id, again) if again is not None else None
