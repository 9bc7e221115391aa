"""Session fixtures that start the real local stack on random free loopback ports.

Each fixture starts its process the way `make run` does (through local.procs) and stops it
by PID at the end. Tests needing them are integration tests.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from local.connections import azurite_connection_string, servicebus_connection_string
from local.procs import REPO_ROOT, Proc, free_port

QUEUE_CONFIG = REPO_ROOT / "infra" / "servicebus-config.json"
AZURITE_BIN = REPO_ROOT / "node_modules" / ".bin" / "azurite-table"


@dataclass
class Endpoint:
    proc: Proc
    host: str
    port: int
    connection_string: str


def start_servicebus(data_dir: Path, port: int | None = None, config: Path = QUEUE_CONFIG) -> Endpoint:
    port = port or free_port()
    proc = Proc(
        "servicebus",
        [sys.executable, "-m", "local.servicebus", "--config", str(config),
         "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)],
    ).start("ready", timeout=60)
    return Endpoint(proc, "127.0.0.1", port, servicebus_connection_string("127.0.0.1", port))


def start_azurite(port: int | None = None) -> Endpoint:
    port = port or free_port()
    proc = Proc(
        "azurite",
        [str(AZURITE_BIN), "--tableHost", "127.0.0.1", "--tablePort", str(port),
         "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck"],
    ).start("successfully listening", timeout=60)
    return Endpoint(proc, "127.0.0.1", port, azurite_connection_string("127.0.0.1", port))


@pytest.fixture(scope="session")
def servicebus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    ep = start_servicebus(tmp_path_factory.mktemp("servicebus"))
    yield ep
    ep.proc.stop()


@pytest.fixture(scope="session")
def azurite() -> Iterator[Endpoint]:
    ep = start_azurite()
    yield ep
    ep.proc.stop()
