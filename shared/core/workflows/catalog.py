"""The agents, declared once: ``workflows/agents.json``.

An agent is the app's adapter to one remote service: a Service Bus-triggered function reading
the request queue its ``queueSetting`` names, calling the service at the base URL its
``serviceUrlSetting`` holds. Everything else follows from this file: the two app settings
(``shared/settings.py``), the agent functions (``functions/agents.py``), the Bicep app settings
(``infra/modules/functionapp.bicep`` loops over the same file). The queue itself is declared in
``infra/servicebus-config.json`` under the name ``agent-{name}`` (the queue setting's default).

The file is JSON (Bicep reads it with ``loadJsonContent``)::

    {"agents": [
      {"name": "inventory", "queueSetting": "InventoryQueue", "serviceUrlSetting": "InventoryServiceUrl"}
    ]}

An agent may declare its remote's published rate limit, shared by every instance
(``shared.core.ratelimit``; the app setting ``RemoteRateLimits`` overrides it)::

      {"name": "payment", ..., "rateLimit": {"perSecond": 8, "burst": 1}}

The default files declare none: a limit costs table requests on every call (docs/workflows.md).

It is loaded and validated (pydantic) when this module is imported, that is when the app starts:
a broken file raises :class:`CatalogError` naming the file, the path inside it
(``agents[1].queueSetting``) and the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from shared.core.workflows.ratelimits import RateLimit

APP_ROOT = Path(__file__).resolve().parents[3]  # where function_app.py and workflows/ are
AGENTS_FILE = APP_ROOT / "workflows" / "agents.json"
QUEUE_PREFIX = "agent-"  # the queue of agent NAME is agent-NAME (infra/servicebus-config.json)


@dataclass(frozen=True)
class Agent:
    name: str
    queue_setting: str  # app setting naming the agent's request queue (%InventoryQueue%)
    service_url_setting: str  # app setting holding the remote service's base URL
    rate_limit: RateLimit | None = None  # declared calls per second to the remote (``RemoteRateLimits`` overrides)

    @property
    def default_queue(self) -> str:
        """The request queue's name: the queue setting's default."""
        return f"{QUEUE_PREFIX}{self.name}"


class CatalogError(ValueError):
    """``workflows/agents.json`` is broken: ``file``, ``path`` inside it and ``reason``."""

    def __init__(self, file: str, path: str, reason: str) -> None:
        self.file, self.path, self.reason = file, path, reason
        super().__init__(f"{file}: {path}: {reason}" if path else f"{file}: {reason}")


# Lowercase words joined by hyphens: it names the queue (agent-NAME) and the function (agent_NAME).
_AGENT_NAME = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"


class _RateLimitDeclaration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel)

    per_second: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)]
    burst: Annotated[int, Field(ge=1, le=10_000)] = 1


class _AgentDeclaration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel)

    name: Annotated[str, Field(pattern=_AGENT_NAME, max_length=40)]
    queue_setting: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]*Queue$")]
    service_url_setting: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]*ServiceUrl$")]
    rate_limit: _RateLimitDeclaration | None = None


class _Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: Annotated[list[_AgentDeclaration], Field(min_length=1)]


def _display(file: Path) -> str:
    try:
        return file.resolve().relative_to(APP_ROOT).as_posix()
    except ValueError:
        return str(file)


def _json_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as a path: ('agents', 1, 'queueSetting') -> agents[1].queueSetting."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _read(file: Path, shown: str) -> _Catalog:
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise CatalogError(shown, "", f"cannot be read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise CatalogError(shown, f"line {e.lineno} column {e.colno}", f"not JSON: {e.msg}") from None
    try:
        return _Catalog.model_validate(raw)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        raise CatalogError(shown, _json_path(tuple(errors[0]["loc"])), errors[0]["msg"] + more) from None


def load_agents(file: Path = AGENTS_FILE) -> tuple[Agent, ...]:
    """The agents ``file`` declares, validated; raises :class:`CatalogError`."""
    shown = _display(file)
    catalog = _read(file, shown)
    seen: dict[tuple[str, str], int] = {}
    for i, decl in enumerate(catalog.agents):
        for key, value in (("name", decl.name), ("queueSetting", decl.queue_setting),
                           ("serviceUrlSetting", decl.service_url_setting)):
            if (key, value) in seen:
                raise CatalogError(shown, f"agents[{i}].{key}",
                                   f"{value!r} is already declared by agents[{seen[(key, value)]}]")
            seen[(key, value)] = i
    return tuple(Agent(d.name, d.queue_setting, d.service_url_setting,
                       RateLimit(d.rate_limit.per_second, d.rate_limit.burst) if d.rate_limit else None)
                 for d in catalog.agents)


AGENTS: tuple[Agent, ...] = load_agents()
AGENTS_BY_NAME: dict[str, Agent] = {a.name: a for a in AGENTS}
