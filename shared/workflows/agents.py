"""The agents a step may name: declared in workflows/agents.json, loaded by ``shared.agent_catalog``."""

from shared.agent_catalog import AGENTS, AGENTS_BY_NAME, Agent  # noqa: F401  (re-export)
