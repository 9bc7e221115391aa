"""The console in a real browser: Debian's Chromium driven by selenium against the real local stack.

`make test` installs chromium and chromium-driver when missing and sets ``REQUIRE_BROWSER=1``: there, a
missing browser fails the tests. Run otherwise (plain pytest), a missing browser skips them, saying why.
A failing test leaves a screenshot of the page; its path is in the failure output.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from local.browser import missing_browser, new_driver
from local.demo import FAILING_CUSTOMER, SOLD_OUT_SKU, failing_body, set_demo_faults
from local.procs import REPO_ROOT
from local.stack import Stack, demo_order

FAST = {"SupervisorSchedule": "*/2 * * * * *", "StepTimeoutSeconds": "5", "UnclaimedGraceSeconds": "5",
        "BackoffBaseSeconds": "1",
        # a remote taken down (``PUT /_faults/shipping {"down": true}``) opens its breaker at its first
        # attempt's second failure, and its waiting step is probed every 10 s (no seeded order fails so)
        "BreakerFailureThreshold": "2", "BreakerCoolDownSeconds": "10",
        # delivery (the digital workflow's pivot, which no seeded order reaches) is called at most
        # once every 10.5 s by every instance together: of digital orders posted at once, all but
        # the first wait for their slot
        "RemoteRateLimits": "delivery=0.1/s"}
SCREENSHOTS = REPO_ROOT / ".local" / "screenshots"
ORDINARY = 8
OUT_OF_STOCK = {"sku": SOLD_OUT_SKU, "quantity": 2, "unitPrice": "5.00"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = missing_browser()
    if reason is None:
        return
    if os.environ.get("REQUIRE_BROWSER") == "1":
        return  # make test installed the browser: its absence fails the tests (``require_browser``)
    for item in items:
        if "tests/browser/" in str(item.path).replace(os.sep, "/") and "driver" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.skip(reason=f"no browser: {reason}"))


def require_browser() -> None:
    reason = missing_browser()
    if reason is not None:
        pytest.fail(f"REQUIRE_BROWSER=1 (make test) but {reason}", pytrace=False)


@dataclass
class Seeded:
    """The stack and the orders the browser tests look at."""

    stack: Stack
    processed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # in attention: out of stock, failed

    def api(self, path: str, **params: Any) -> Any:
        r = self.stack.session().get(f"{self.stack.api_url}{path}", params=params, timeout=30)
        r.raise_for_status()
        return r.json()


def fetches(driver: Any) -> list[tuple[str, int]]:
    """(URL, status) of every API call the page made since it was loaded, in order (not its own
    files), from the browser's Resource Timing entries (``responseStatus``)."""
    return [(url, int(status)) for url, status in driver.execute_script(
        "return performance.getEntriesByType('resource')"
        ".filter((e) => e.initiatorType === 'fetch').map((e) => [e.name, e.responseStatus]);")]


def wait_until(what: str, check: Callable[[], bool], timeout: float = 90.0, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """A stack with ordinary orders Processed and two out-of-stock orders in attention."""
    require_browser()  # before starting a stack for nothing
    with Stack(tmp_path_factory.mktemp("browser-stack"), persistent=False, instances=2,
               settings_overrides=FAST) as stack:
        with stack.remotes as remotes:
            set_demo_faults(remotes)
        seeded = Seeded(stack)
        rng = random.Random(12)
        session = stack.session()
        for _ in range(ORDINARY):
            seeded.processed.append(stack.post_order(demo_order(rng), session=session))
        for _ in range(2):
            body = {**failing_body_like(), "items": [OUT_OF_STOCK]}
            seeded.failed.append(stack.post_order(body, session=session))

        def settled() -> bool:
            states = {oid: stack.get_order(oid, session=session) for oid in seeded.processed + seeded.failed}
            return (all(states[o]["processState"] == "Processed" for o in seeded.processed)
                    and all(states[o]["category"] == "attention" for o in seeded.failed))

        wait_until("the seeded orders to settle", settled)
        yield seeded


def failing_body_like() -> dict[str, Any]:
    """A failing demo order's body (customer c-failing), items to be replaced."""
    from local.demo import FAILING_KINDS

    body = failing_body(FAILING_KINDS[0])
    assert body["customerId"] == FAILING_CUSTOMER
    return body


@pytest.fixture
def driver(request: pytest.FixtureRequest) -> Iterator[Any]:
    require_browser()
    drv = new_driver()
    request.node.browser_driver = drv
    yield drv
    drv.quit()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failure with a browser open: a screenshot (and the page's HTML) next to each other."""
    outcome = yield
    report = outcome.get_result()
    drv = getattr(item, "browser_driver", None)
    if report.when != "call" or not report.failed or drv is None:
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    stem = SCREENSHOTS / f"{item.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        drv.save_screenshot(str(stem.with_suffix(".png")))
        Path(stem.with_suffix(".html")).write_text(drv.page_source, encoding="utf-8")
        note = (f"screenshot: {stem.with_suffix('.png')}\npage source: {stem.with_suffix('.html')}\n"
                f"URL: {drv.current_url}")
    except Exception as exc:  # the browser may be what failed
        note = f"no screenshot: {exc!r}"
    report.sections.append(("browser", note))
