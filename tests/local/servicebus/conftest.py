"""Fixtures for the emulator's conformance suite, which drives the emulator only through the unmodified
azure-servicebus SDK.

- ``sb``: one emulator for the whole package, started with this folder's Config.json (one queue per test).
- ``client``: a fresh SDK client per test (see support.CLIENT_OPTIONS); its handlers close in the background.
- ``scenarios``: runs a module's waiting-dominated tests concurrently (see support.Scenarios); the durability
  scenarios start their own emulators on their own data dirs and ports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from azure.servicebus import ServiceBusClient

from tests.conftest import Endpoint, start_servicebus
from tests.local.servicebus.support import (
    CLIENT_OPTIONS,
    CONFIG,
    QuickCloseClient,
    ScenarioRun,
    close_client_in_background,
    join_background_closes,
)

_EMULATORS: list[Endpoint] = []


@pytest.fixture(scope="session")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    ep = start_servicebus(tmp_path_factory.mktemp("sb-conformance"), config=CONFIG)
    _EMULATORS.append(ep)
    yield ep
    join_background_closes()
    ep.proc.stop()
    _EMULATORS.remove(ep)


@pytest.fixture
def client(sb: Endpoint) -> Iterator[ServiceBusClient]:
    """A client of the unmodified SDK; its senders/receivers (and itself) close in the background."""
    c = ServiceBusClient.from_connection_string(sb.connection_string, **CLIENT_OPTIONS)
    yield QuickCloseClient(c)  # type: ignore[misc]
    close_client_in_background(c)


@pytest.fixture(scope="module")
def scenarios(request: pytest.FixtureRequest, sb: Endpoint) -> Iterator[ScenarioRun]:
    """Start the module's registered scenarios (``SCENARIOS``) whose tests are selected, all at once."""
    registry = request.module.SCENARIOS
    selected = {item.name for item in request.session.items if getattr(item, "module", None) is request.module}
    fns = {name: fn for name, fn in registry.fns.items() if f"test_{name}" in selected}

    def call(fn: Callable[..., None]) -> None:
        if registry.arg == "client":
            c = ServiceBusClient.from_connection_string(sb.connection_string, **CLIENT_OPTIONS)
            with QuickCloseClient(c) as client:
                fn(client)
        elif registry.arg == "endpoint":
            fn(sb)
        else:
            fn()

    run = ScenarioRun(call, fns)
    yield run
    run.join()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On failure, attach the tail of the shared emulator's output to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _EMULATORS:
        tail = "\n".join(list(_EMULATORS[-1].proc.lines)[-40:])
        report.sections.append(("emulator output (tail)", tail))
