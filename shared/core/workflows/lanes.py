"""Priority lanes, declared once: ``workflows/lanes.json``.

A lane is a set of work queues that carries the messages of the orders whose ``priority`` it
lists. The FIRST lane is the default: it uses the work queues as they are (``scheduler``,
``replies``, ``agent-{name}``) and takes any priority no lane lists (an order stored before
priorities were read, or none). Every other lane has a copy of each work queue, named
``{queue}-{lane}``, read through the setting ``{Setting}{Lane}`` (``SchedulerQueueHigh``,
``InventoryQueueHigh``: default ``scheduler-high``, ``agent-inventory-high``), and one trigger per
copy (``functions/scheduler.py``, ``functions/agents.py``)::

    {"lanes": [
      {"name": "normal", "priorities": ["normal", "low"]},
      {"name": "high",   "priorities": ["high"]}
    ]}

The work queues are the Scheduler's (``SchedulerQueue``), the replies (``RepliesQueue``) and each
agent's request queue (``workflows/agents.json``); alerts and status queues have no lanes. A lane
only changes WHERE a message waits: every function handles a message from any lane the same
way, so a message on the wrong lane (or one sent before lanes existed) is just slower or faster.

From this file follow the settings (``shared/settings.py``), the triggers, the lane queues of
the Service Bus emulator (:func:`with_lane_queues` over ``infra/servicebus-config.json``, each a
copy of its base queue's properties) and of Bicep (``infra/main.bicep`` loads the same file).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.core.workflows.catalog import AGENTS, APP_ROOT

LANES_FILE = APP_ROOT / "workflows" / "lanes.json"
PRIORITIES = ("low", "normal", "high")  # the order contract's priorities (shared/core/orders.py)


@dataclass(frozen=True)
class Lane:
    name: str
    priorities: tuple[str, ...]
    default: bool  # the first lane: the work queues themselves

    def setting(self, base_setting: str) -> str:
        """This lane's copy of a work-queue setting (``SchedulerQueue`` -> ``SchedulerQueueHigh``)."""
        return base_setting if self.default else f"{base_setting}{self.name.capitalize()}"

    def queue(self, base_queue: str) -> str:
        """This lane's copy of a work queue (``scheduler`` -> ``scheduler-high``)."""
        return base_queue if self.default else f"{base_queue}-{self.name}"

    def function(self, base_function: str) -> str:
        """The name of the trigger on this lane's copy (``scheduler`` -> ``scheduler_high``)."""
        return base_function if self.default else f"{base_function}_{self.name}"


class LanesError(ValueError):
    """``workflows/lanes.json`` is broken."""


class _LaneDeclaration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9]*$", max_length=12)]
    priorities: Annotated[list[str], Field(min_length=1)]


class _Lanes(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lanes: Annotated[list[_LaneDeclaration], Field(min_length=1)]


def load_lanes(file: Path = LANES_FILE) -> tuple[Lane, ...]:
    """The lanes ``file`` declares, validated: every priority in exactly one lane."""
    try:
        declared = _Lanes.model_validate(json.loads(file.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, ValidationError) as e:
        raise LanesError(f"{file.name}: {e}") from None
    names = [d.name for d in declared.lanes]
    listed = [p for d in declared.lanes for p in d.priorities]
    if len(set(names)) != len(names):
        raise LanesError(f"{file.name}: a lane is declared twice: {names}")
    if sorted(listed) != sorted(PRIORITIES):
        raise LanesError(f"{file.name}: every priority of {list(PRIORITIES)} must be in exactly one lane, "
                         f"not {listed}")
    return tuple(Lane(d.name, tuple(d.priorities), i == 0) for i, d in enumerate(declared.lanes))


LANES: tuple[Lane, ...] = load_lanes()
DEFAULT_LANE = LANES[0]
FAST_LANES = LANES[1:]  # the lanes with queues of their own
# The work queues that have a copy per lane: (setting, default queue name).
LANED_QUEUES: tuple[tuple[str, str], ...] = (
    ("SchedulerQueue", "scheduler"), ("RepliesQueue", "replies"),
    *((a.queue_setting, a.default_queue) for a in AGENTS),
)


def lane_of(priority: str | None) -> Lane:
    """The lane of an order of ``priority`` (the default lane for none or an unknown one)."""
    return next((lane for lane in LANES if priority in lane.priorities), DEFAULT_LANE)


def with_lane_queues(config: dict[str, Any]) -> dict[str, Any]:
    """An emulator Config.json (``infra/servicebus-config.json``) with each lane's copy of every
    work queue added after the declared queues: the base queue's properties, the lane's name."""
    out = copy.deepcopy(config)
    for namespace in out["UserConfig"]["Namespaces"]:
        queues = namespace["Queues"]
        by_name = {q["Name"]: q for q in queues}
        for lane in FAST_LANES:
            for _, base in LANED_QUEUES:
                if base in by_name and lane.queue(base) not in by_name:
                    queues.append({"Name": lane.queue(base), "Properties": copy.deepcopy(by_name[base]["Properties"])})
    return out
