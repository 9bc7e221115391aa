"""The live line and the alert lines after the demo (local.watch), without a stack."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from local.watch import (
    CATEGORIES,
    Tally,
    Terminal,
    Watch,
    count_category,
    render_alert,
    render_tally,
    tally,
)
from shared.core.messages import AlertMessage, BreakerAlert

AT = datetime(2025, 3, 1, 12, 3, 4, tzinfo=UTC)
ORDERS_URL = "http://127.0.0.1:1/api/orders"


def _response(status: int, body: Any) -> requests.Response:
    r = requests.Response()
    r.status_code = status
    r._content = json.dumps(body).encode()
    return r


class FakeSearch:
    """``GET /api/orders?state=`` over a fixed number of orders per category, paged by token."""

    def __init__(self, sizes: dict[str, int], status: int = 200) -> None:
        self.sizes = sizes
        self.status = status
        self.calls: list[dict[str, Any]] = []

    def get(self, url: str, *, params: dict[str, Any], timeout: float) -> requests.Response:
        self.calls.append(dict(params))
        if self.status != 200:
            return _response(self.status, {"title": "nope"})
        start = int(params.get("continuationToken") or 0)
        end = min(start + int(params["limit"]), self.sizes.get(params["state"], 0))
        token = str(end) if end < self.sizes.get(params["state"], 0) else None
        return _response(200, {"orders": [{"orderId": f"o-{i}"} for i in range(start, end)],
                               "continuationToken": token})


def test_count_pages_through_continuation_tokens() -> None:
    search = FakeSearch({"processed": 450})
    assert count_category(search.get, ORDERS_URL, "processed") == (450, False)
    assert [c.get("continuationToken") for c in search.calls] == [None, "200", "400"]
    assert count_category(search.get, ORDERS_URL, "attention") == (0, False)


def test_count_stops_at_the_cap() -> None:
    search = FakeSearch({"processed": 5000})
    assert count_category(search.get, ORDERS_URL, "processed", cap=1000) == (1000, True)
    assert len(search.calls) == 5


def test_tally_and_its_line() -> None:
    t = tally(FakeSearch({"inFlight": 1, "attention": 3, "processed": 17}).get, ORDERS_URL)
    assert t == Tally({"inFlight": 1, "attention": 3, "processed": 17, "error": 0}, frozenset())
    assert render_tally(t, AT) == "12:03:04Z  orders: inFlight 1 · attention 3 · processed 17 · error 0"
    capped = Tally({c: 1000 if c == "processed" else 0 for c in CATEGORIES}, frozenset({"processed"}))
    assert "processed 1000+ ·" in render_tally(capped, AT)


def test_tally_says_why_there_are_no_counts() -> None:
    t = tally(FakeSearch({}, status=405).get, ORDERS_URL)
    assert render_tally(t, AT) == "12:03:04Z  orders: counts unavailable (GET /orders?state=inFlight: 405)"

    def refused(url: str, *, params: dict[str, Any], timeout: float) -> requests.Response:
        raise requests.ConnectionError("connection refused")

    assert "counts unavailable (connection refused)" in render_tally(tally(refused, ORDERS_URL), AT)


def test_alert_line() -> None:
    body = {"kind": "alert", "orderId": "o-42", "step": "create-shipment", "reason": "timed out",
            "failureCount": 3, "at": "2025-03-01T12:03:04.123456+00:00"}
    assert render_alert(json.dumps(body).encode()) == \
        "ALERT 12:03:04Z order o-42 step create-shipment (failures 3): timed out"
    rejected = {**body, "step": "charge-payment", "reason": "amount 1299.50 EUR exceeds the limit 1000",
                "failureCount": 0}
    assert render_alert(json.dumps(rejected)) == \
        "ALERT 12:03:04Z order o-42 step charge-payment: amount 1299.50 EUR exceeds the limit 1000"
    minimal = {"orderId": "o-1", "step": None, "reason": "compensation failed: 422"}
    assert render_alert(json.dumps(minimal)) == "ALERT order o-1: compensation failed: 422"


def test_an_order_alert_as_the_app_sends_it() -> None:
    body = AlertMessage(order_id="o-7", step="create-shipment", reason="timed out (attempt 3)\nfailure count 3",
                        failure_count=3, at=AT).to_body()
    assert render_alert(json.dumps(body).encode()) == \
        "ALERT 12:03:04Z order o-7 step create-shipment (failures 3): timed out (attempt 3) failure count 3"


def test_a_breaker_that_opened() -> None:
    body = BreakerAlert(remote="payment", state="open", at=AT, opens=2, reason="HTTP 503 from /charge",
                        failures=5, retry_at=datetime(2025, 3, 1, 12, 3, 34, tzinfo=UTC)).to_body()
    assert render_alert(json.dumps(body).encode()) == \
        "ALERT 12:03:04Z breaker payment opened (failures 5): HTTP 503 from /charge; next probe 12:03:34Z"


@pytest.mark.parametrize(("seconds", "shown"), [(66.2, "1 min 6 s"), (12.345, "12.3 s"), (7501.0, "2 h 5 min")])
def test_a_breaker_that_closed_says_how_long_it_was_open(seconds: float, shown: str) -> None:
    body = BreakerAlert(remote="shipping", state="closed", at=AT, opens=1, reason="HTTP 503",
                        open_seconds=seconds).to_body()
    assert render_alert(json.dumps(body)) == f"ALERT 12:03:04Z breaker shipping closed after {shown} open"


def test_a_field_the_model_does_not_know_changes_nothing() -> None:
    body = {**BreakerAlert(remote="payment", state="open", at=AT, opens=1, reason="down", failures=3,
                           retry_at=AT).to_body(), "region": "westeurope"}
    assert render_alert(json.dumps(body)) == \
        "ALERT 12:03:04Z breaker payment opened (failures 3): down; next probe 12:03:04Z"
    order = {**AlertMessage(order_id="o-1", step=None, reason="gone", failure_count=0, at=AT).to_body(), "new": 1}
    assert render_alert(json.dumps(order)) == "ALERT 12:03:04Z order o-1: gone"


def test_a_partial_breaker_alert_is_read_field_by_field() -> None:
    assert render_alert(json.dumps({"kind": "breaker", "remote": "inventory", "state": "open"})) == \
        "ALERT breaker inventory opened"
    assert render_alert(json.dumps({"kind": "breaker", "remote": "inventory", "state": "closed",
                                    "openSeconds": "long"})) == "ALERT breaker inventory closed after long open"
    assert render_alert(json.dumps({"kind": "breaker", "remote": "inventory", "state": "half-open"})) == \
        "ALERT breaker inventory half-open"


def test_an_alert_of_another_kind_is_shown_with_its_kind() -> None:
    assert render_alert(json.dumps({"kind": "quota", "left": 3})) == 'ALERT (kind quota) {"kind": "quota", "left": 3}'


@pytest.mark.parametrize("body", [b"not json", b'{"reason": "no order id"}', b"[1, 2]", b"\xff\xfe",
                                  b'{"kind": "breaker", "state": "open"}', b'{"kind": "breaker", "remote": "x"}',
                                  b'{"kind": ["breaker"], "remote": "x", "state": "open"}', b'"breaker"'])
def test_an_unreadable_alert_is_shown_as_it_is(body: bytes) -> None:
    assert render_alert(body).startswith("ALERT (unreadable) ")


def test_an_unreadable_alert_is_one_line() -> None:
    assert render_alert(b"line one\nline two") == "ALERT (unreadable) line one line two"


def test_terminal_redraws_in_place_and_prints_alerts_above() -> None:
    out = io.StringIO()
    term = Terminal(out, tty=True)
    term.live("counts 1")
    term.live("counts 2")
    term.say("ALERT x")
    term.end()
    assert out.getvalue() == "\rcounts 1\x1b[K\rcounts 2\x1b[K\r\x1b[KALERT x\ncounts 2\n"


def test_terminal_without_tty_prints_whole_lines() -> None:
    out = io.StringIO()
    term = Terminal(out, tty=False)
    term.live("counts 1")
    term.say("ALERT x")
    term.end()
    assert out.getvalue() == "counts 1\nALERT x\n"


def _watch(search: FakeSearch, tty: bool) -> tuple[Watch, io.StringIO]:
    out = io.StringIO()
    watch = Watch("http://127.0.0.1:1/api", {"ServiceBusConnection": "unused", "AlertsQueue": "alerts"}, out, tty)
    watch.session.get = search.get  # type: ignore[method-assign]
    return watch, out


def test_without_tty_a_line_only_when_the_counts_change() -> None:
    search = FakeSearch({"inFlight": 2})
    watch, out = _watch(search, tty=False)
    watch.refresh()
    watch.refresh()
    search.sizes = {"inFlight": 1, "attention": 1}
    watch.refresh()
    watch.refresh()
    lines = out.getvalue().splitlines()
    assert [line.split("  ", 1)[1] for line in lines] == [
        "orders: inFlight 2 · attention 0 · processed 0 · error 0",
        "orders: inFlight 1 · attention 1 · processed 0 · error 0",
    ]


def test_on_a_tty_every_refresh_redraws() -> None:
    watch, out = _watch(FakeSearch({"processed": 3}), tty=True)
    watch.refresh()
    watch.refresh()
    assert out.getvalue().count("\r") == 2 and "\n" not in out.getvalue()
