"""The README's pictures of the operator console, taken from the real local stack.

    .venv/bin/python -m local.screenshots [--out docs] [--orders 40]

Starts a throw-away stack (in-memory Azurite, fast Supervisor), posts the demo's orders with
its failing ones (a payment declined, a shipment that hangs until held, an item out of stock),
sends one poison message to the scheduler queue (dead-lettered after MaxDeliveryCount), waits
for all of it to show, opens the shipping service's circuit breaker (its row written as the
agents' gate writes it, with steps waiting on it: the overview's red chip), then saves
``console-{overview,attention,order,search,deadletters}.png`` at 1280x800 with headless
Chromium (``local.browser``), and ``console-parallel.png``: an ``express`` order whose parallel
step's charge is declined while its reservation still runs (stopped, then released). Last,
``console-bulk.png``: the search for state=attention after "Retry all N" was confirmed, its
operation's progress followed to done (it retries the failing orders, so it comes after the rest).

The stack runs with App Service authentication (``OperatorAuth=appService``, ``ROLES``): the
browser sends an operator's principal (``X-MS-CLIENT-PRINCIPAL``, as App Service would) for
those pictures, and a viewer's for ``console-viewer.png``, the same order's page with no action.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests

from local.browser import console_url, missing_browser, new_driver
from local.demo import FAILING_CUSTOMER, demo
from local.procs import REPO_ROOT
from local.stack import Stack

FAST = {"SupervisorSchedule": "*/2 * * * * *", "StepTimeoutSeconds": "5", "UnclaimedGraceSeconds": "5",
        "BackoffBaseSeconds": "1"}
POISON = '{"orderId": "0f8fad5bd9cb469fa16570867728950e", "seq": "not a number"}'
ROLES = {"OperatorAuth": "appService", "OperatorRole": "Operator", "ViewerRole": "Viewer"}


def principal(name: str, *roles: str) -> str:
    """An App Service principal (``X-MS-CLIENT-PRINCIPAL``: base64 JSON of its claims)."""
    claims = [{"typ": "name", "val": name}, *({"typ": "roles", "val": role} for role in roles)]
    return base64.b64encode(json.dumps({"auth_typ": "aad", "claims": claims}).encode()).decode()


OPERATOR = {"X-MS-CLIENT-PRINCIPAL": principal("ana@contoso.com", "Operator")}
VIEWER = {"X-MS-CLIENT-PRINCIPAL": principal("vera@contoso.com", "Viewer")}


def wait_for(what: str, check: Callable[[], bool], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(1.0)


def get(stack: Stack, path: str, **params: Any) -> Any:
    """GET an operator route as the signed-in operator (no key: the console's routes need none in
    this mode; an order is read through ``/console/orders/{id}``, the clients' route wants a key)."""
    r = requests.get(f"{stack.api_url}{path}", params=params, headers=OPERATOR, timeout=30)
    r.raise_for_status()
    return r.json()


def send_poison(stack: Stack, message_id: str | None = None) -> str:
    """A schedule message no order has: abandoned on every delivery, then dead-lettered."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    queue = stack.settings["SchedulerQueue"]
    with ServiceBusClient.from_connection_string(stack.servicebus_connection_string) as client, \
            client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(POISON, content_type="application/json",
                                               message_id=message_id or uuid.uuid4().hex))
    return queue


def approve_waiting(stack: Stack) -> bool:
    """Approve the failing orders that wait for their approval, as an operator (the demo's own
    approval is refused: it sends no principal, and this stack asks App Service's). True."""
    for summary in get(stack, "/orders", customerId=FAILING_CUSTOMER)["orders"]:
        if (get(stack, f"/console/orders/{summary['orderId']}")["awaiting"] or {}).get("event") == "approval":
            requests.post(f"{stack.api_url}/orders/{summary['orderId']}/events/approval", headers=OPERATOR,
                          json={"approved": True, "by": "demo"}, timeout=30).raise_for_status()
    return True


def seed(stack: Stack, orders: int) -> tuple[str, str]:
    """Demo orders (failing ones too) and a dead letter; returns (a compensated order, the queue)."""
    demo(stack, orders, 10.0, True, sys.stdout, seed=7)
    queue = send_poison(stack)
    wait_for("the held shipment and the dead letter", lambda: (
        approve_waiting(stack)
        and get(stack, "/overview")["live"]["attention"]["count"] >= 3
        and any(q["deadLetter"] for q in get(stack, "/overview")["queues"])))
    failing = [get(stack, f"/console/orders/{o['orderId']}")
               for o in get(stack, "/orders", customerId=FAILING_CUSTOMER)["orders"]]
    # the most telling order page: one whose completed steps were compensated (the payment declined)
    failing.sort(key=lambda o: (o["compensation"]["total"], len(o["history"])), reverse=True)
    chosen = failing[0]["orderId"]
    time.sleep(6)  # the stats rows' last flush (every 5 s)
    return chosen, queue


def express_declined(stack: Stack) -> str:
    """An ``express`` order over the payment limit, its two branches slowed down so that they are
    seen side by side: the charge is declined after 0.8 s while the reservation (1.5 s) is still
    in flight, so the reservation is stopped and then released. The faults are put back after."""
    with stack.remotes as remotes:
        before = remotes.faults()
        remotes.set_faults("payment", **{**before["payment"], "rejectAmountOver": "1000", "latencyMs": 800})
        remotes.set_faults("inventory", **{**before["inventory"], "latencyMs": 1500})
    try:
        order_id = stack.post_order({"customerId": "c-express", "currency": "EUR", "priority": "normal",
                                     "statusQueue": None, "workflow": "express",
                                     "items": [{"sku": "SKU-5", "quantity": 10, "unitPrice": "129.95"}]})
        wait_for("the express order compensated",
                 lambda: get(stack, f"/console/orders/{order_id}")["category"] != "inFlight")
    finally:
        with stack.remotes as remotes:
            for service in ("payment", "inventory"):
                remotes.set_faults(service, **before[service])
    return order_id


def open_breaker(stack: Stack, remote: str = "shipping", waiting: int = 3) -> None:
    """``remote``'s breaker open for 10 minutes (no probe before the pictures are taken) with
    ``waiting`` steps waiting on it. The stack is thrown away after: nothing puts it back."""
    from azure.data.tables import TableServiceClient

    from shared.core.breaker.state import BreakerRow, BreakerState
    from shared.core.breaker.waiting import WaitingStep
    from shared.storage.breakers import read_breaker, write_breaker
    from shared.storage.table_store import TableStore
    from shared.storage.waiting import register_waiting

    with TableServiceClient.from_connection_string(stack.settings["StateStorage"]) as service:
        store = TableStore.of(service.get_table_client(stack.settings["StateTable"]),
                              service.get_table_client(stack.settings["DeadlineTable"]))
        now = datetime.now(UTC)
        etag = read_breaker(store, remote).etag
        write_breaker(store, BreakerRow(remote, BreakerState.OPEN, failures=5, window_start=now - timedelta(seconds=4),
                                        opened_at=now - timedelta(seconds=2), retry_at=now + timedelta(minutes=10),
                                        opens=1, last_fault="ReadTimeout", changed_at=now, etag=etag))
        for _ in range(waiting):
            register_waiting(store, remote, WaitingStep(uuid.uuid4().hex, 1, "create-shipment"), now)


def _present(by: str, css: str) -> Callable[[Any], Any]:
    return lambda driver: driver.find_elements(by, css)


def shoot(stack: Stack, out: Path, order_id: str, queue: str, express_id: str) -> list[Path]:
    views = [("overview", "/", "[data-testid='chart'] canvas"),
             ("attention", "/attention", "[data-testid='reason']"),
             ("order", f"/orders/{order_id}", "[data-testid='gantt']"),
             ("parallel", f"/orders/{express_id}", "[data-testid='gantt-group']"),
             ("search", "/search?limit=15", "[data-testid='orders']"),
             ("deadletters", f"/deadletters/{queue}", "[data-testid='deadletters'] table")]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    views.append(("viewer", f"/orders/{order_id}", "[data-testid='gantt']"))
    driver = new_driver()
    driver.execute_cdp_cmd("Network.enable", {})
    saved = []
    try:
        for name, route, ready in views:
            who = VIEWER if name == "viewer" else OPERATOR
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": who})
            driver.get("about:blank")  # a new page load: the console reads its caller once per load
            driver.get(console_url(stack.api_url, route))
            WebDriverWait(driver, 30).until(_present(By.CSS_SELECTOR, ready))
            if name == "deadletters":  # show the first message's body
                driver.execute_script("document.querySelector('[data-testid=deadletters] details').open = true")
            time.sleep(1.0)  # the rest of the page's reads (the attention reasons, fonts)
            path = out / f"console-{name}.png"
            driver.save_screenshot(str(path))
            saved.append(path)
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        if severe:
            raise RuntimeError(f"the console logged errors: {severe}")
    finally:
        driver.quit()
    return saved


def shoot_bulk(stack: Stack, out: Path) -> Path:
    """"Retry all N" on the search for state=attention, confirmed, and its progress once done."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def testid(name: str) -> str:
        return f"[data-testid='{name}']"

    driver = new_driver()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": OPERATOR})
    try:
        driver.get(console_url(stack.api_url, "/search?state=attention"))
        WebDriverWait(driver, 30).until(_present(By.CSS_SELECTOR, testid("orders")))
        driver.find_element(By.CSS_SELECTOR, testid("bulk-retry")).click()
        WebDriverWait(driver, 30).until(_present(By.CSS_SELECTOR, testid("bulk-confirm")))[0].click()
        WebDriverWait(driver, 120).until(lambda d: [e for e in d.find_elements(By.CSS_SELECTOR, testid("bulk-state"))
                                                    if e.text == "done"])
        time.sleep(1.0)  # the results read again under the dialog
        path = out / "console-bulk.png"
        driver.save_screenshot(str(path))
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        if severe:
            raise RuntimeError(f"the console logged errors: {severe}")
    finally:
        driver.quit()
    return path


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m local.screenshots", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO_ROOT / "docs"), help="folder for the PNGs (default docs)")
    ap.add_argument("--orders", type=int, default=40, help="demo orders to post (default 40)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    reason = missing_browser()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="console-shots-") as tmp, \
            Stack(Path(tmp) / "stack", persistent=False, settings_overrides={**FAST, **ROLES}) as stack:
        order_id, queue = seed(stack, args.orders)
        express_id = express_declined(stack)
        open_breaker(stack)
        for path in shoot(stack, out, order_id, queue, express_id):
            print(f"saved {path}")
        print(f"saved {shoot_bulk(stack, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
