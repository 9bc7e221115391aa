"""The pure core of webhooks (shared.core.webhooks): the signature against the Standard Webhooks
spec's own test vector, the settings' forms, the watch row's key, and the delivery decisions."""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.core.effects import DeleteIndex, PutWatch, Reindex, Send, Transact
from shared.core.webhooks import (
    COVER,
    DELIVERED,
    FAILED,
    PENDING,
    HookWatch,
    WebhookSettingError,
    decide_resend,
    decide_tried,
    decide_watch,
    delivery_message,
    due_now,
    failed_key,
    headers,
    new_hook,
    parse_failed_key,
    parse_schedule,
    parse_secret,
    read_ask,
    sign,
)

T0 = datetime(2026, 11, 22, 8, 0, 0, tzinfo=UTC)
OID = "0123456789abcdef0123456789abcdef"


def test_sign_matches_the_specs_test_vector() -> None:
    """standard-webhooks/standard-webhooks, libraries/python/tests/test_webhooks.py, test_sign_function."""
    key = parse_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    assert sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, '{"test": 2432232314}') == \
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_headers_verify_by_the_specs_algorithm_written_apart() -> None:
    key = b"k" * 24
    h = headers(key, "evt_1", 1700000000, '{"a":1}')
    assert (h["webhook-id"], h["webhook-timestamp"]) == ("evt_1", "1700000000")
    version, sig = h["webhook-signature"].split(",", 1)
    expected = hmac.new(key, b'evt_1.1700000000.{"a":1}', hashlib.sha256).digest()
    assert version == "v1" and base64.b64decode(sig) == expected


@pytest.mark.parametrize("raw", ["", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not base64!", "whsec_AAAA",
                                 "@Microsoft.KeyVault(SecretUri=https://v.vault.azure.net/secrets/WebhookSecret)"])
def test_a_bad_secret_is_refused(raw: str) -> None:
    with pytest.raises(WebhookSettingError):
        parse_secret(raw)


def test_schedule_forms() -> None:
    assert parse_schedule("5s,5m,2h,1") == (5.0, 300.0, 7200.0, 1.0)
    assert len(parse_schedule("")) == 7  # the default: 8 tries over about 27 hours
    assert sum(parse_schedule("")) > 24 * 3600
    for bad in ("5x", "-1s", "m"):
        with pytest.raises(WebhookSettingError):
            parse_schedule(bad)


def test_the_watch_row_is_read_back() -> None:
    w = HookWatch(OID, "hook-00000007", T0 + COVER)
    assert HookWatch.from_row(w.row.row_key, w.row.due) == w
    assert w.row.bucket.startswith("202611220801-")  # the due minute's shards, as an order's row
    assert HookWatch.from_row(f"{OID}:20261122T080100000000", T0) is None  # an order's own row
    assert HookWatch.from_row("webhook:broken", T0) is None
    assert parse_failed_key(failed_key(OID, "hook-00000007")) == (OID, "hook-00000007")


def _hook(**kw):  # type: ignore[no-untyped-def]
    hook = new_hook(OID, 7, "order.processed", '{"type":"order.processed"}', T0)

    return replace(hook, etag="e1", **kw)


def test_a_message_for_another_try_is_stale() -> None:
    hook = _hook()
    ask = read_ask(delivery_message("webhooks", OID, hook).body)
    assert ask is not None and due_now(ask, hook)

    assert not due_now(ask, replace(hook, attempt=2))
    assert not due_now(ask, replace(hook, round=2))
    assert not due_now(ask, replace(hook, status=DELIVERED))
    assert not due_now(ask, None)
    assert read_ask({"kind": "status"}) is None


def test_a_2xx_delivers_and_drops_the_watch() -> None:
    hook = _hook()
    effects = decide_tried(OID, hook, None, T0 + timedelta(seconds=1), (5.0,), "webhooks")
    [tx] = [e for e in effects if isinstance(e, Transact)]
    assert tx.ops[0].row["Status"] == DELIVERED and tx.ops[0].etag == "e1"
    watch = HookWatch(OID, hook.key, T0 + COVER).row
    assert isinstance(effects[-1], DeleteIndex) and effects[-1].row_key == watch.row_key


def test_a_failed_try_puts_its_next_watch_first_then_schedules_the_next_try() -> None:
    hook = _hook()
    now = T0 + timedelta(seconds=2)
    effects = decide_tried(OID, hook, "HTTP 500", now, (5.0, 60.0), "webhooks")
    kinds = [type(e).__name__ for e in effects]
    assert kinds == ["PutWatch", "Transact", "Send", "Log", "DeleteIndex"]
    put, tx, send = effects[0], effects[1], effects[2]
    assert isinstance(put, PutWatch) and isinstance(tx, Transact) and isinstance(send, Send)
    row = tx.ops[0].row
    assert (row["Status"], row["Attempt"], row["Tries"], row["LastError"]) == (PENDING, 2, 1, "HTTP 500")
    assert send.message.scheduled_enqueue_time == now + timedelta(seconds=5)
    assert send.message.message_id == f"{hook.webhook_id}:1:2"
    assert put.row.due == now + timedelta(seconds=5) + COVER


def test_the_last_try_fails_the_delivery_and_lists_it() -> None:

    hook = replace(_hook(), attempt=3, tries=2)
    effects = decide_tried(OID, hook, "HTTP 503", T0, (5.0, 60.0), "webhooks")
    assert [type(e).__name__ for e in effects] == ["Transact", "Reindex", "Log", "DeleteIndex"]
    assert effects[0].ops[0].row["Status"] == FAILED  # type: ignore[union-attr]
    assert effects[1].puts[0].key == failed_key(OID, hook.key)  # type: ignore[union-attr]


def test_a_due_watch() -> None:
    hook = _hook()
    watch = HookWatch(OID, hook.key, hook.cover_at)  # type: ignore[arg-type]
    now = watch.due + timedelta(seconds=1)

    # no delivery (the ending never committed), delivered, or a newer watch: the watch goes
    assert [type(e) for e in decide_watch(watch, None, now, "webhooks")] == [DeleteIndex]
    assert [type(e) for e in decide_watch(watch, replace(hook, status=DELIVERED), now, "webhooks")] == [DeleteIndex]
    newer = replace(hook, cover_at=watch.due + timedelta(minutes=5))
    assert [type(e) for e in decide_watch(watch, newer, now, "webhooks")] == [DeleteIndex]
    # failed: its listing is written again
    assert [type(e) for e in decide_watch(watch, replace(hook, status=FAILED), now, "webhooks")] == \
        [Reindex, DeleteIndex]
    # pending and this is its watch: the try was lost; sent again under an id of its own
    effects = decide_watch(watch, hook, now, "webhooks")
    assert [type(e).__name__ for e in effects] == ["PutWatch", "Transact", "Send", "Log", "DeleteIndex"]
    send = effects[2]
    assert isinstance(send, Send) and send.message.message_id.startswith(f"{hook.webhook_id}:1:1:")


def test_a_resend_is_a_new_round_with_the_same_webhook_id() -> None:

    hook = replace(_hook(), status=FAILED, attempt=8, tries=8)
    effects = decide_resend(OID, hook, T0 + timedelta(days=1), "webhooks")
    assert [type(e).__name__ for e in effects] == ["PutWatch", "Transact", "Reindex", "Send"]
    row = effects[1].ops[0].row  # type: ignore[union-attr]
    assert (row["Status"], row["Round"], row["Attempt"], row["WebhookId"]) == (PENDING, 2, 1, hook.webhook_id)
    assert effects[3].message.message_id == f"{hook.webhook_id}:2:1"  # type: ignore[union-attr]
