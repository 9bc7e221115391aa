"""Dead letters and queue depths, read by peeking: ``GET /api/deadletters`` and the overview's queues.

Everything here peeks (``ServiceBusReceiver.peek_messages``): nothing is received, locked or
settled, and the app's identity needs no management rights (Azure Service Bus Data Receiver
suffices). Each peek is one management request (one Service Bus operation) on the worker's
receiver of that queue or dead-letter queue, kept from one view to the next
(``shared.console.receivers``): a view opens no link once the worker has served one.

* ``peek_dead_letters``: a page of a queue's dead-letter queue from a sequence number on
  (dead-lettered messages keep the sequence number they had in the queue), with the reason and
  description Service Bus or the dead-lettering receiver gave, the order id (application
  property or JSON body field ``orderId``) and the body as text, at most ``MAX_BODY_CHARS``.
* ``queue_depths``: per queue setting, the messages in the queue and in its dead-letter queue,
  counted by peeking up to ``cap`` (so a count is exact up to ``cap``, else ``capped``). The
  queue's count includes scheduled and deferred messages (a peek returns them too).
* ``get_dead_letters``: the HTTP side: validates the query (400 problem+json naming the
  parameter), 503 when Service Bus cannot be reached.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from shared.api.http import HttpResult, problem, unknown_query
from shared.console.receivers import peek_receivers
from shared.runtime import Runtime

MAX_BODY_CHARS = 2000
DEFAULT_LIMIT = 20
MAX_LIMIT = 50
DEPTH_CAP = 100
MAX_SEQUENCE = 2**63 - 1  # a Service Bus sequence number is a signed 64-bit integer
PEEK_TIMEOUT_SECONDS = 10.0  # the SDK's whole budget for one peek: open, retries and the request
DEPTH_WORKERS = 14  # peeks at once, of the 28 (a few ms each on kept receivers; a worker's first opens them)

log = logging.getLogger(__name__)


class ServiceBusUnavailable(RuntimeError):
    """Service Bus could not be reached (or is not configured): the reason is the message."""


def service_bus_of(rt: Runtime) -> Any:
    """The ``ServiceBusClient`` of ``rt`` (the worker's, or a test's), else the worker's
    (``shared.runtime.clients.get_clients``)."""
    from shared.runtime.clients import get_clients

    return (rt.service_bus or get_clients().service_bus)()


def _utc_text(value: datetime | None) -> str | None:
    if value is None:
        return None
    when = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def text_of(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def body_text(message: Any) -> str:
    """The message's body as text: data sections joined and decoded (UTF-8, bad bytes
    replaced); an AMQP value or sequence body as JSON."""
    from azure.servicebus.amqp import AmqpMessageBodyType

    body = message.body
    if message.body_type == AmqpMessageBodyType.DATA:
        return b"".join(bytes(section) for section in body).decode("utf-8", "replace")
    if message.body_type == AmqpMessageBodyType.SEQUENCE:
        body = list(body)
    return json.dumps(body, default=text_of, ensure_ascii=False)


def order_id_of(properties: Mapping[Any, Any] | None, body: str) -> str | None:
    """``orderId`` from the application properties, else from the JSON body, if a string."""
    for key, value in (properties or {}).items():
        if text_of(key) == "orderId" and isinstance(value, (str, bytes)):
            return text_of(value)
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    found = parsed.get("orderId") if isinstance(parsed, dict) else None
    return found if isinstance(found, str) else None


def dead_letter_view(message: Any) -> dict[str, Any]:
    """One peeked dead letter as the API shows it."""
    body = body_text(message)
    return {
        "sequenceNumber": message.sequence_number,
        "messageId": text_of(message.message_id),
        "enqueuedAt": _utc_text(message.enqueued_time_utc),
        "deliveryCount": message.delivery_count,
        "reason": message.dead_letter_reason,
        "description": message.dead_letter_error_description,
        "orderId": order_id_of(message.application_properties, body),
        "subject": text_of(message.subject),
        "body": body[:MAX_BODY_CHARS],
        "bodyTruncated": len(body) > MAX_BODY_CHARS,
    }


def _peek(client: Any, queue: str, count: int, from_seq: int, dead_letter: bool) -> list[Any]:
    """Up to ``count`` messages of ``queue`` (or its dead-letter queue) from ``from_seq`` on: one
    peek request on the worker's kept receiver of it. Raises ``ServiceBusUnavailable``."""
    from azure.core.exceptions import AzureError

    try:
        return peek_receivers(client).peek(queue, count, max(1, from_seq), dead_letter=dead_letter,
                                           timeout=PEEK_TIMEOUT_SECONDS)
    except AzureError as exc:  # ServiceBusError and the credential's errors
        where = f"{queue}/$DeadLetterQueue" if dead_letter else queue
        raise ServiceBusUnavailable(f"peeking {where} failed: {type(exc).__name__}: {exc}") from exc


def client_or_default(rt: Runtime, client: Any | None) -> Any:
    if client is not None:
        return client
    try:
        return service_bus_of(rt)
    except (KeyError, ValueError) as exc:  # no connection setting, or a malformed one
        raise ServiceBusUnavailable(f"Service Bus is not configured: {exc}") from exc


def peek_dead_letters(rt: Runtime, queue: str, limit: int = DEFAULT_LIMIT, from_seq: int = 0, *,
                      client: Any | None = None) -> dict[str, Any]:
    """A page of ``queue``'s dead letters from sequence number ``from_seq`` on, oldest first;
    ``next`` is the sequence number the next page starts at, or None when there is none. One
    peek (of ``limit + 1``, to know whether more follow). Raises ``ServiceBusUnavailable``."""
    setting = next((name for name, value in rt.config.queues.items() if value == queue), None)
    peeked = _peek(client_or_default(rt, client), queue, limit + 1, from_seq, dead_letter=True)
    page = peeked[:limit]
    following = peeked[limit].sequence_number if len(peeked) > limit else None
    return {"queue": queue, "setting": setting, "messages": [dead_letter_view(m) for m in page], "next": following,
            "queues": [{"setting": name, "name": value} for name, value in rt.config.queues.items()]}


def queue_depths(rt: Runtime, cap: int = DEPTH_CAP, *, client: Any | None = None) -> list[dict[str, Any]]:
    """Per queue setting (in ``QUEUE_SETTINGS`` order): the messages in the queue and in its
    dead-letter queue, by peeking ``cap + 1`` of each (one request each, all in parallel); a
    count over ``cap`` is shown as ``cap``, ``...Capped``. Raises ``ServiceBusUnavailable``
    when any peek fails."""
    from shared.settings import QUEUE_SETTINGS

    sb = client_or_default(rt, client)
    queues = [(spec.name, rt.config.queues.get(spec.name) or spec.default or "") for spec in QUEUE_SETTINGS]
    with ThreadPoolExecutor(max_workers=DEPTH_WORKERS) as pool:
        counts = [(pool.submit(_peek, sb, name, cap + 1, 0, False), pool.submit(_peek, sb, name, cap + 1, 0, True))
                  for _, name in queues]
        out = []
        for (setting, name), (active_peek, dead_peek) in zip(queues, counts, strict=True):
            active, dead = len(active_peek.result()), len(dead_peek.result())
            out.append({"setting": setting, "name": name, "active": min(active, cap), "deadLetter": min(dead, cap),
                        "activeCapped": active > cap, "deadLetterCapped": dead > cap})
        return out


def _bad(field: str, message: str) -> HttpResult:
    return problem(400, "invalid-query", "Invalid dead-letter query", f"{field}: {message}",
                   errors=[{"field": field, "message": message}])


def whole_number(raw: str, digits: int) -> int | None:
    """A whole number written in at most ``digits`` ASCII digits, else None."""
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= digits else None


def resolve_queue(rt: Runtime, raw: str | None) -> tuple[str, str] | None:
    """(setting, queue name) for a queue setting's name or a queue's name (either in any case)."""
    wanted = (raw or "").lower()
    for setting, name in rt.config.queues.items():
        if wanted and wanted in (setting.lower(), name.lower()):
            return setting, name
    return None


def get_dead_letters(rt: Runtime, params: Mapping[str, str], *, client: Any | None = None) -> HttpResult:
    """``GET /api/deadletters?queue=&limit=&from=``: a page of a queue's dead letters."""
    unknown = unknown_query(params, ("queue", "limit", "from"), "Invalid dead-letter query")
    if unknown is not None:
        return unknown
    known = ", ".join(sorted(rt.config.queues))
    queue = resolve_queue(rt, params.get("queue"))
    if queue is None:
        return _bad("queue", f"must be a queue setting ({known}) or the name of one of those queues")
    limit = whole_number(params.get("limit", str(DEFAULT_LIMIT)), 2)
    if limit is None or not 1 <= limit <= MAX_LIMIT:
        return _bad("limit", f"must be a whole number from 1 to {MAX_LIMIT}")
    from_seq = whole_number(params.get("from", "0"), 19)
    if from_seq is None or from_seq > MAX_SEQUENCE:
        return _bad("from", f"must be a sequence number: a whole number from 0 to {MAX_SEQUENCE}")
    try:
        page = peek_dead_letters(rt, queue[1], limit, from_seq, client=client)
    except ServiceBusUnavailable as exc:
        log.warning("dead letters of %s: %s", queue[1], exc)
        return problem(503, "service-bus-unavailable", "Service Bus unavailable", str(exc))
    return HttpResult(200, page)
