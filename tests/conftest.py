"""Session fixtures that start the real local stack on random free loopback ports.

Each fixture starts its process the way `make run` does (through local.procs) and stops it
by PID at the end. Tests needing them are integration tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from local.azurite import start_azurite as start_azurite_proc
from local.connections import servicebus_connection_string
from local.procs import REPO_ROOT, Proc, free_port
from local.queueconfig import write_derived
from tests import telemetry_support

QUEUE_CONFIG = REPO_ROOT / "infra" / "servicebus-config.json"

# Hypothesis: the "ci" profile (HYPOTHESIS_PROFILE=ci, as `make test` sets it) keeps every
# test's example count (each @settings names its own, else Hypothesis's 100) and drops what a
# loaded machine turns into noise: no per-example deadline, no example database in a fresh clone,
# and a failure prints the blob that replays it (@reproduce_failure).
settings.register_profile("ci", deadline=None, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Real OpenTelemetry SDK providers (in memory) for the whole test process: spans get real ids, as
# with Azure Monitor; tests capture them with tests.telemetry_support.capture().
telemetry_support.install()


@dataclass
class Endpoint:
    proc: Proc
    host: str
    port: int
    connection_string: str


def start_servicebus(data_dir: Path, port: int | None = None, config: Path = QUEUE_CONFIG) -> Endpoint:
    port = port or free_port()
    config = write_derived(config, data_dir / "servicebus-config.json")  # with the priority lanes' queues
    proc = Proc(
        "servicebus",
        [sys.executable, "-m", "local.servicebus", "--config", str(config),
         "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)],
    ).start("ready", timeout=60)
    return Endpoint(proc, "127.0.0.1", port, servicebus_connection_string("127.0.0.1", port))


def start_azurite() -> Endpoint:
    """In-memory Azurite (tables only) on a free port, started by the stack's own launcher."""
    az = start_azurite_proc(in_memory=True, services=("table",))
    return Endpoint(az.proc, az.host, az.ports["table"], az.connection_string)


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
