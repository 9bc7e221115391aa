"""A viewer sees no buttons: the console with App Service authentication (OperatorAuth=appService,
OperatorRole=Operator, ViewerRole=Viewer), the browser sending the principal App Service would
(X-MS-CLIENT-PRINCIPAL, injected with Chrome's ``Network.setExtraHTTPHeaders``) and no key, while
the host checks keys as in Azure: every route the console calls (the page, who is looking, the
overview, the search, an order, its history, the dead letters) answers a signed-in user without one.

The viewer reads everything (an order in attention, an order awaiting its approval event, the
search, the dead letters) and is offered no action anywhere; the same pages, for an operator, offer
them (so the viewer's empty pages are the console honouring ``canAct`` of GET /api/console/caller,
not missing data). An order waiting for its customer's room (``CustomerMaxInFlight`` 1) says so in
the search's list and on its page.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from local.browser import console_url
from local.demo import set_demo_faults
from local.screenshots import ROLES, principal, send_poison
from local.stack import Stack, demo_order
from tests.browser.conftest import FAST, OUT_OF_STOCK, failing_body_like, fetches, require_browser, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVER_1000 = [{"sku": "SKU-5", "quantity": 10, "unitPrice": "129.95"}]
ACTION_BUTTONS = ("button.action, button[data-action], [data-testid='deadletter-actions'], [data-testid='event-form'], "
                  "[data-testid='actions']")


# one order in flight per customer: the awaiting order (c-approve's) holds its customer's slot
ONE_AT_A_TIME = {"CustomerMaxInFlight": "1"}
VIEWER = principal("vera", "Viewer")
OPERATOR = principal("otto", "Operator")


class Seeded:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.attention = ""
        self.awaiting = ""
        self.dead_seq = 0

    def api(self, path: str, who: str = VIEWER, **params: Any) -> Any:
        r = requests.get(f"{self.stack.api_url}{path}", params=params, headers={"X-MS-CLIENT-PRINCIPAL": who},
                         timeout=30)
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """An order in attention (out of stock), one awaiting its approval, one Processed, a dead letter."""
    import random

    require_browser()
    with Stack(tmp_path_factory.mktemp("viewer-stack"), persistent=False, instances=1,
               settings_overrides={**FAST, **ROLES, **ONE_AT_A_TIME}) as stack:
        with stack.remotes as remotes:
            set_demo_faults(remotes)
        seeded = Seeded(stack)
        processed = stack.post_order(demo_order(random.Random(3)))
        seeded.attention = stack.post_order({**failing_body_like(), "items": [OUT_OF_STOCK]})
        seeded.awaiting = stack.post_order({"customerId": "c-approve", "currency": "EUR", "priority": "normal",
                                            "statusQueue": None, "items": OVER_1000})
        poison = f"poison-{uuid.uuid4().hex[:8]}"
        send_poison(stack, poison)
        wait_until("the orders settled and the dead letter there", lambda: (
            stack.get_order(processed)["processState"] == "Processed"
            and stack.get_order(seeded.attention)["category"] == "attention"
            and (stack.get_order(seeded.awaiting)["awaiting"] or {}).get("event") == "approval"
            and any(m["messageId"] == poison for m in seeded.api("/deadletters", queue="scheduler")["messages"])))
        seeded.dead_seq = next(m["sequenceNumber"] for m in seeded.api("/deadletters", queue="scheduler")["messages"]
                               if m["messageId"] == poison)
        yield seeded


def as_who(driver: Any, who: str) -> None:
    """Every request of the page, from now on, carries ``who`` as App Service's principal."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"X-MS-CLIENT-PRINCIPAL": who}})


def shown(driver: Any, seeded: Seeded, route: str, ready: str) -> list[str]:
    """Open ``route``, wait for ``ready`` (a CSS selector of its data), and the action elements shown
    (data-action / data-testid of each)."""
    driver.get(console_url(seeded.stack.api_url, route))
    WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, ready))
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='error']"), route
    return [e.get_attribute("data-action") or e.get_attribute("data-testid") or e.tag_name
            for e in driver.find_elements(By.CSS_SELECTOR, ACTION_BUTTONS)]


def pages(seeded: Seeded) -> list[tuple[str, str]]:
    """(route, a selector of the data it must show) for each view that offers actions to an operator."""
    return [(f"/orders/{seeded.attention}", "[data-testid='history'] tr"),
            (f"/orders/{seeded.awaiting}", "[data-testid='awaiting']"),
            # a row's actions are filled in with its reason, after the list: wait for the reason
            ("/attention", f"[data-testid='orders'] tr:has(a[href$='{seeded.attention}']) [data-testid='reason']"),
            ("/search?customerId=c-failing", f"[data-testid='orders'] a[href$='{seeded.attention}']"),
            ("/deadletters/scheduler", "[data-testid='deadletters'] tr td:first-child")]


def test_a_viewer_sees_the_data_and_no_buttons(seeded: Seeded, driver: Any) -> None:
    # The host checks keys, and the clients' own routes want one: the console must not call them.
    assert seeded.stack.keys is not None
    client_route = requests.get(f"{seeded.stack.api_url}/orders/{seeded.attention}",
                                headers={"X-MS-CLIENT-PRINCIPAL": VIEWER}, timeout=30)
    assert client_route.status_code == 401, client_route.text
    assert seeded.api("/console/caller") == {"by": "vera", "canAct": False}  # what the console reads
    overview = seeded.api("/overview")
    assert overview["caller"] == {"by": "vera", "canAct": False}  # kept, for the API's other readers
    unsigned = requests.get(f"{seeded.stack.api_url}/console/caller", timeout=30)  # no principal: 401, no one named
    assert unsigned.status_code == 401 and "canAct" not in unsigned.text, unsigned.text
    # what an operator would be offered on those pages: the orders' actions, the awaited event, the dead letter
    assert {"retry", "cancel"} <= set(seeded.stack.get_order(seeded.attention)["actions"])
    assert seeded.stack.get_order(seeded.awaiting)["awaiting"]["event"] == "approval"
    # ...and what the viewer's requests would get: 403, not an action
    r = requests.post(f"{seeded.stack.api_url}/deadletters/scheduler/{seeded.dead_seq}/discard",
                      headers={"X-MS-CLIENT-PRINCIPAL": VIEWER}, timeout=30)
    assert r.status_code == 403, r.text
    as_who(driver, VIEWER)
    for route, ready in pages(seeded):
        assert shown(driver, seeded, route, ready) == [], route
    table = driver.find_element(By.CSS_SELECTOR, "[data-testid='deadletters'] table")
    assert str(seeded.dead_seq) in table.text and "Actions" not in table.text
    # the views with nothing to offer: the overview and the failed webhooks
    assert shown(driver, seeded, "/", f"[data-testid='newest'] a[href$='{seeded.attention}']") == []
    assert shown(driver, seeded, "/webhooks", "[data-testid='no-webhooks']") == []
    # every call the console made on those views, keyless, was answered (none 401 or 403)
    answers = fetches(driver)
    called = {re.sub(r"/[0-9a-f]{32}|\?.*$", "", url.removeprefix(seeded.stack.api_url)) for url, _ in answers}
    assert {"/console/caller", "/overview", "/orders", "/console/orders", "/webhooks", "/deadletters"} <= called, called
    assert all("code=" not in url and 200 <= status < 300 for url, status in answers), answers
    # (an order's page reads its history's later pages only when it has more than the first: the route it calls)
    assert seeded.api(f"/console/orders/{seeded.attention}/history", limit=1)["history"]


def test_an_operator_sees_the_buttons_on_the_same_pages(seeded: Seeded, driver: Any) -> None:
    """The control: the viewer's pages are empty of actions because of the role, not the data."""
    assert seeded.api("/console/caller", who=OPERATOR) == {"by": "otto", "canAct": True}
    assert seeded.api("/overview", who=OPERATOR)["caller"] == {"by": "otto", "canAct": True}
    as_who(driver, OPERATOR)
    offered = {route: shown(driver, seeded, route, ready) for route, ready in pages(seeded)}
    assert {"retry", "cancel"} <= set(offered[f"/orders/{seeded.attention}"]), offered
    assert "event-form" in offered[f"/orders/{seeded.awaiting}"], offered
    assert {"retry", "cancel"} <= set(offered["/attention"]), offered
    # (the search page offers no action to anyone, yet: the viewer's check above keeps it honest when it does)
    assert {"resubmit", "discard", "deadletter-actions"} <= set(offered["/deadletters/scheduler"]), offered


def test_an_order_waiting_for_its_customers_room_says_so_in_the_list_and_on_its_page(seeded: Seeded,
                                                                                      driver: Any) -> None:
    """``CustomerMaxInFlight`` is 1: c-approve's first order holds its customer's one slot while it
    awaits its approval, so a second one waits for the room. The search says so (``waitingFor``,
    read from the state row it reads anyway) and the console shows it in the list, not only on the
    order's page."""
    second = seeded.stack.post_order({"customerId": "c-approve", "currency": "EUR", "priority": "normal",
                                      "statusQueue": None, "items": OVER_1000})
    found = {o["orderId"]: o for o in seeded.api("/orders", customerId="c-approve")["orders"]}
    assert found[second]["waitingFor"] == {"kind": "customer", "customerId": "c-approve",
                                           "since": found[second]["createdAt"]}, found[second]
    assert found[seeded.awaiting]["waitingFor"] is None
    as_who(driver, VIEWER)
    row = "[data-testid='orders'] tr:has(a[href$='{}']) [data-testid='waiting-room']"
    assert shown(driver, seeded, "/search?customerId=c-approve", row.format(second)) == []
    assert not driver.find_elements(By.CSS_SELECTOR, row.format(seeded.awaiting))  # it holds the slot
    assert shown(driver, seeded, f"/orders/{second}", "[data-testid='waiting-room']") == []
