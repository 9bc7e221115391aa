"""The simulator serves every remote call a shipped workflow makes: each step's operation and
compensation, on the service of the step's agent (the path the local stack gives its URL)."""

from __future__ import annotations

from pathlib import Path

import yaml

from local.remotes.server import SERVICES
from local.stack import SERVICE_PATHS
from shared.core.workflows.catalog import AGENTS, AGENTS_BY_NAME

WORKFLOWS = Path(__file__).resolve().parents[3] / "workflows"


def test_every_agent_has_a_simulated_service() -> None:
    assert set(SERVICE_PATHS) == {a.service_url_setting for a in AGENTS}
    assert set(SERVICE_PATHS.values()) == set(SERVICES)


def test_every_step_of_every_workflow_is_served() -> None:
    files = sorted(p for p in WORKFLOWS.iterdir() if p.suffix in (".yaml", ".yml"))
    assert {p.name.split(".")[0] for p in files} >= {"order", "digital"}, files
    for path in files:
        steps = yaml.safe_load(path.read_text())["steps"]
        for step in [b for s in steps for b in s.get("branches", [s])]:  # a parallel step's branches
            if step.get("kind", "call") != "call":
                continue  # a wait or a delay calls no remote
            service = SERVICE_PATHS[AGENTS_BY_NAME[step["agent"]].service_url_setting]
            for operation in (step["operation"], step.get("compensation")):
                if operation is not None:
                    assert operation in SERVICES[service], f"{path.name} {step['name']}: {service}/{operation}"
