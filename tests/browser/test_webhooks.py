"""The console's Webhooks view in a real browser (Debian's Chromium) against the local stack: a
receiver that is down makes every delivery give up; the view lists each failed delivery, its nav
tab is highlighted, and an operator's Resend (confirmed) starts the delivery again. An ended order's
page shows its deliveries."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from local.browser import console_url
from local.stack import Stack
from tests.browser.conftest import FAST, require_browser, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
BODY = {"customerId": "c-1", "currency": "EUR", "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": "9.99"}]}


def closed_port() -> int:
    """A loopback port nothing listens on: every POST to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, list[str]]]:
    require_browser()
    settings = {**FAST, "WebhookUrl": f"http://127.0.0.1:{closed_port()}/hooks", "WebhookSecret": SECRET,
                "WebhookRetrySchedule": "1s"}
    with Stack(tmp_path_factory.mktemp("webhooks-browser-stack"), persistent=False, instances=1,
               settings_overrides=settings) as s:
        session = s.session()
        orders = [s.post_order(BODY, session=session) for _ in range(2)]
        wait_until("both deliveries to give up", lambda: len(_failed(s)) == 2, timeout=120)
        yield s, orders


def _failed(stack: Stack) -> list[dict[str, Any]]:
    r = stack.session().get(f"{stack.api_url}/webhooks", params={"state": "failed"}, timeout=30)
    r.raise_for_status()
    deliveries: list[dict[str, Any]] = r.json()["deliveries"]
    return deliveries


def test_the_failed_deliveries_are_listed_and_one_is_sent_again(stack: tuple[Stack, list[str]], driver: Any) -> None:
    s, orders = stack
    assert s.keys is not None
    driver.get(console_url(s.api_url, "/webhooks", code=s.keys.master))
    table = WebDriverWait(driver, 30).until(lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid='webhooks'] table"))
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert sorted(r.find_element(By.CSS_SELECTOR, "td a").text for r in rows) == sorted(orders)
    assert all("order.processed" in r.text for r in rows)
    assert [a.get_attribute("data-nav") for a in driver.find_elements(By.CSS_SELECTOR, "header nav a[aria-current]")] \
        == ["webhooks"]
    # Resend one: confirmed in the dialog, the API's answer shown; it is pending again (round 2).
    rows[0].find_element(By.CSS_SELECTOR, "[data-testid='webhook-resend']").click()
    dialog = driver.find_element(By.ID, "confirm-dialog")
    WebDriverWait(driver, 10).until(lambda d: dialog.is_displayed())
    dialog.find_element(By.CSS_SELECTOR, "[data-testid='confirm']").click()
    status = driver.find_element(By.CSS_SELECTOR, "[data-testid='webhook-status']")
    WebDriverWait(driver, 30).until(lambda d: "resent" in status.text)
    assert "round 2" in status.text and "ok" in (status.get_attribute("class") or "")
    # The receiver is still down: it gives up again, round 2, and is listed again.
    wait_until("the resent delivery to give up again",
               lambda: sorted(d["round"] for d in _failed(s)) == [1, 2], timeout=60)


def test_an_orders_page_shows_its_deliveries(stack: tuple[Stack, list[str]], driver: Any) -> None:
    """An ended order's page has a Webhooks panel: its delivery, failed, with its tries, its last
    error and its webhook-id, and Resend for an operator."""
    s, orders = stack
    assert s.keys is not None
    order_id = orders[1]
    [delivery] = [d for d in _failed(s) if d["orderId"] == order_id]
    driver.get(console_url(s.api_url, f"/orders/{order_id}", code=s.keys.master))
    panel = WebDriverWait(driver, 30).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid='order-webhooks']"))
    [row] = panel.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert row.get_attribute("data-status") == "failed"
    assert "order.processed" in row.text and delivery["webhookId"] in row.text and str(delivery["tries"]) in row.text
    assert row.find_elements(By.CSS_SELECTOR, "[data-testid='webhook-resend']")
