"""workflows/agents.json, the one declaration of the agents: loaded, validated, and the source of
every agent's settings. A broken file stops the start naming the file, the path and the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from local.procs import REPO_ROOT
from shared.core.workflows.catalog import AGENTS, AGENTS_BY_NAME, AGENTS_FILE, Agent, CatalogError, load_agents
from shared.settings import QUEUE_SETTINGS, REQUIRED_SETTINGS, SETTINGS

GOOD = {"name": "gifts", "queueSetting": "GiftsQueue", "serviceUrlSetting": "GiftsServiceUrl"}


def write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "agents.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_the_shipped_catalog() -> None:
    assert AGENTS == (
        Agent("inventory", "InventoryQueue", "InventoryServiceUrl"),
        Agent("payment", "PaymentQueue", "PaymentServiceUrl"),
        Agent("shipping", "ShippingQueue", "ShippingServiceUrl"),
        Agent("delivery", "DeliveryQueue", "DeliveryServiceUrl"),
    )
    assert AGENTS_BY_NAME["delivery"].default_queue == "agent-delivery"
    assert AGENTS_FILE.relative_to(REPO_ROOT).as_posix() == "workflows/agents.json"


def test_every_agent_brings_its_queue_setting_and_its_required_url() -> None:
    queues = {s.name: s.default for s in QUEUE_SETTINGS}
    required = {s.name for s in REQUIRED_SETTINGS}
    for agent in AGENTS:
        assert queues[agent.queue_setting] == f"agent-{agent.name}"
        assert agent.service_url_setting in required
    assert required == {a.service_url_setting for a in AGENTS} | {"TokenKeys"}  # the one required non-URL
    assert len({s.name for s in SETTINGS}) == len(SETTINGS)


def test_a_valid_file_loads(tmp_path: Path) -> None:
    assert load_agents(write(tmp_path, {"agents": [GOOD]})) == (Agent("gifts", "GiftsQueue", "GiftsServiceUrl"),)


@pytest.mark.parametrize(("doc", "path", "reason"), [
    ({"agents": []}, "agents", "at least 1 item"),
    ({}, "agents", "Field required"),
    ({"agents": [GOOD], "more": 1}, "more", "Extra inputs are not permitted"),
    ({"agents": [{**GOOD, "queue": "x"}]}, "agents[0].queue", "Extra inputs are not permitted"),
    ({"agents": [GOOD, {k: v for k, v in GOOD.items() if k != "serviceUrlSetting"}]},
     "agents[1].serviceUrlSetting", "Field required"),
    ({"agents": [{**GOOD, "name": "Gifts"}]}, "agents[0].name", "should match pattern"),
    ({"agents": [{**GOOD, "name": "gift cards"}]}, "agents[0].name", "should match pattern"),
    ({"agents": [{**GOOD, "queueSetting": "GiftsQ"}]}, "agents[0].queueSetting", "should match pattern"),
    ({"agents": [{**GOOD, "serviceUrlSetting": "GiftsUrl"}]}, "agents[0].serviceUrlSetting", "should match pattern"),
    ({"agents": [{**GOOD, "name": 3}]}, "agents[0].name", "valid string"),
    ({"agents": [GOOD, {**GOOD, "queueSetting": "OtherQueue", "serviceUrlSetting": "OtherServiceUrl"}]},
     "agents[1].name", "'gifts' is already declared by agents[0]"),
    ({"agents": [GOOD, {**GOOD, "name": "other", "serviceUrlSetting": "OtherServiceUrl"}]},
     "agents[1].queueSetting", "'GiftsQueue' is already declared by agents[0]"),
    ({"agents": [GOOD, {**GOOD, "name": "other", "queueSetting": "OtherQueue"}]},
     "agents[1].serviceUrlSetting", "'GiftsServiceUrl' is already declared by agents[0]"),
    ('{"agents": [', "line 1 column 13", "not JSON"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_broken_file_names_the_file_the_path_and_the_reason(tmp_path: Path, doc: object, path: str,
                                                              reason: str) -> None:
    file = write(tmp_path, doc)
    with pytest.raises(CatalogError) as broken:
        load_agents(file)
    assert (broken.value.file, broken.value.path) == (str(file), path)
    assert reason in broken.value.reason
    assert str(broken.value).startswith(f"{file}: {path}: ")


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"agents\.json: cannot be read"):
        load_agents(tmp_path / "agents.json")


def test_the_app_does_not_start_with_a_broken_catalog(tmp_path: Path) -> None:
    """The catalog is read when the app imports it: a broken one stops function_app's import."""
    app = tmp_path / "app"
    package = app / "shared" / "core" / "workflows"
    package.mkdir(parents=True)
    (app / "workflows").mkdir()
    root = REPO_ROOT
    for folder in (app / "shared", app / "shared" / "core", package):
        (folder / "__init__.py").write_text("")
    for module in ("catalog.py", "ratelimits.py"):  # the catalog and the rate limits it declares
        (package / module).write_text((root / "shared" / "core" / "workflows" / module).read_text())
    (app / "workflows" / "agents.json").write_text(json.dumps({"agents": [{**GOOD, "serviceUrlSetting": 7}]}))
    script = "import sys; sys.path.insert(0, '.'); import shared.core.workflows.catalog"
    proc = subprocess.run([sys.executable, "-I", "-c", script], cwd=app, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "shared.core.workflows.catalog.CatalogError: workflows/agents.json: agents[0].serviceUrlSetting: "
        "Input should be a valid string")
