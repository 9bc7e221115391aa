"""Workflows as data: ``workflows/<name>.v<version>.yaml``, validated at start-up.

* ``model``    - ``Workflow``, ``Step``, ``Retry`` (what the core reads)
* ``schema``   - the file format (pydantic, extra keys forbidden)
* ``loader``   - files -> a ``Registry``; a broken file raises ``WorkflowError`` (file, path, reason)
* ``registry`` - every loaded (name, version); ``UnknownWorkflow``
* ``bounds``   - the size bound: one decision's rows and events fit one transaction

An order records the (name, version) it started with and runs it to the end; every version
present in the directory is loaded. Removing a version file while orders use it is unsafe:
those orders are held (``shared.core.statemachine.binding``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from shared.core.workflows.catalog import AGENTS, AGENTS_BY_NAME, APP_ROOT, Agent
from shared.core.workflows.loader import Problem, WorkflowError, load_directory
from shared.core.workflows.model import DEFAULT_WORKFLOW, LEGACY_VERSION, OnFailure, Retry, Step, Workflow
from shared.core.workflows.registry import Registry, UnknownWorkflow

DEFAULT_PATH = "workflows"

_loaded: dict[Path, Registry] = {}
_by_setting: dict[str | None, Registry] = {}  # the setting's raw value -> its directory's registry
_lock = threading.Lock()


def workflows_directory(setting: str | None = None) -> Path:
    """The ``WorkflowsPath`` setting as a directory (relative: to the app's root). None: the
    process environment's value (the app setting, in the worker), else ``workflows``."""
    value = os.environ.get("WorkflowsPath") if setting is None else setting
    path = Path((value or "").strip() or DEFAULT_PATH)
    return path if path.is_absolute() else APP_ROOT / path


def load_registry(setting: str | None = None) -> Registry:
    """The workflows of the directory ``setting`` names (None: see :func:`workflows_directory`),
    loaded once per directory.

    Called for every agent request (its route check): after the first call with a given value of
    the setting, a lookup by that string, with no ``Path`` built, resolved or hashed and no lock.
    """
    value = os.environ.get("WorkflowsPath") if setting is None else setting
    registry = _by_setting.get(value)
    if registry is not None:
        return registry
    directory = workflows_directory(value)
    with _lock:
        if directory not in _loaded:
            _loaded[directory] = load_directory(directory, AGENTS_BY_NAME)
        _by_setting[value] = _loaded[directory]
        return _loaded[directory]


def agent_for(step: Step) -> Agent:
    return AGENTS_BY_NAME[step.agent]


__all__ = [
    "AGENTS", "AGENTS_BY_NAME", "APP_ROOT", "DEFAULT_WORKFLOW", "LEGACY_VERSION", "Agent", "OnFailure", "Problem",
    "Registry", "Retry", "Step", "UnknownWorkflow", "Workflow", "WorkflowError", "agent_for", "load_directory",
    "load_registry", "workflows_directory",
]
