"""A headless Chromium driven by selenium, for the console's browser tests and its screenshots.

Debian's ``chromium`` and ``chromium-driver`` with explicit paths (``Service(executable_path=...)``,
``options.binary_location``), so selenium never downloads a driver. ``make test`` installs them
when missing. The browser's console log is kept (``goog:loggingPrefs``) for the tests to read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CHROMIUM = Path(os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CONSOLE_CHROMEDRIVER", "/usr/bin/chromedriver"))
WINDOW = (1280, 800)


def missing_browser() -> str | None:
    """Why no browser can be started here (None when both binaries exist)."""
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if absent:
        return (f"{' and '.join(absent)} missing: `make test` installs Debian's chromium and chromium-driver "
                "(or: apt-get install chromium chromium-driver)")
    return None


def new_driver(window: tuple[int, int] = WINDOW) -> Any:
    """A headless Chromium at ``window`` (CSS pixels, scale 1) with its console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--force-device-scale-factor=1", "--hide-scrollbars", f"--window-size={window[0]},{window[1]}",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    fit_viewport(driver, window)
    return driver


def fit_viewport(driver: Any, viewport: tuple[int, int]) -> None:
    """Size the window so that the page's viewport (what a screenshot shows) is ``viewport``:
    headless Chromium keeps room for window decorations out of ``--window-size``."""
    driver.get("about:blank")
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    outer = driver.get_window_size()
    driver.set_window_size(outer["width"] + viewport[0] - int(inner[0]),
                           outer["height"] + viewport[1] - int(inner[1]))


def console_url(api_url: str, route: str = "/", code: str | None = None) -> str:
    """The console page's URL for a hash route (``/``, ``/attention``, ``/orders/<id>``...)."""
    query = f"?code={code}" if code else ""
    return f"{api_url.rstrip('/')}/console{query}#{route}"
