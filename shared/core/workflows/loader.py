"""Loading ``workflows/<name>.v<version>.yaml`` at start-up: a broken file stops the app.

Each problem names the file, the path inside it (``steps[1].timeoutSeconds``) and the reason;
every problem of every file is reported at once (:class:`WorkflowError`). Rejected: invalid
YAML (duplicate keys too), anything the schema forbids (unknown keys, wrong types, duplicate
step names, a pivot with a compensation), an unknown agent, a file name that does not match
its name and version, two files of the same (name, version), two wait steps for one event, a
step's ``when`` that is not a condition (``shared.core.workflows.conditions``), a workflow whose
every step has a ``when``, and a workflow whose largest transaction would not fit 100 entities
(``shared.core.workflows.bounds``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from shared.core.workflows.bounds import MAX_STEPS, TRANSACTION_ENTITIES, largest_write
from shared.core.workflows.conditions import ConditionError, parse
from shared.core.workflows.durations import parse_duration
from shared.core.workflows.model import Retry, Step, Workflow
from shared.core.workflows.registry import Registry
from shared.core.workflows.schema import StepFile, WorkflowFile


@dataclass(frozen=True)
class Problem:
    file: str
    path: str  # inside the file: "steps[1].timeoutSeconds", or "(file)"
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.reason}"


class WorkflowError(ValueError):
    """Workflow files the app cannot start with; ``problems`` lists every one."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid workflow files:\n  " + "\n  ".join(str(p) for p in problems))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice (PyYAML keeps the last)."""


def _mapping_without_duplicates(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def field_path(loc: tuple[Any, ...]) -> str:
    """pydantic loc -> ``steps[1].retry.maxFailureCount``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "(file)"


def parse_file(path: Path, agents: Mapping[str, object]) -> tuple[Workflow | None, list[Problem]]:
    """One file: the workflow, or None and its problems."""
    name = path.name
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Problem(name, "(file)", f"cannot be read: {exc}")]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"(line {mark.line + 1}, column {mark.column + 1})" if mark is not None else "(file)"
        return None, [Problem(name, where, f"not valid YAML: {getattr(exc, 'problem', None) or exc}")]
    try:
        spec = WorkflowFile.model_validate(raw)
    except ValidationError as exc:
        return None, [Problem(name, field_path(e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]
    problems = _context_problems(name, spec, agents)
    return (None, problems) if problems else (_workflow(spec), [])


def _context_problems(file: str, spec: WorkflowFile, agents: Mapping[str, object]) -> list[Problem]:
    problems: list[Problem] = []
    expected = f"{spec.name}.v{spec.version}.yaml"
    if file not in (expected, f"{spec.name}.v{spec.version}.yml"):
        problems.append(Problem(file, "(file)", f"the file name must be {expected} (its name and version)"))
    seen: set[str] = set()
    events: dict[str, str] = {}
    for i, step, where in _every_step(spec):
        if step.name in seen:
            problems.append(Problem(file, f"{where}.name", f"duplicate step name {step.name!r}"))
        seen.add(step.name)
        if step.kind == "wait" and step.event is not None:
            if step.event in events:
                problems.append(Problem(file, f"steps[{i}].event", f"event {step.event!r} is also awaited by "
                                        f"{events[step.event]!r}: one wait step per event"))
            events.setdefault(step.event, step.name)
        if step.agent is not None and step.agent not in agents:
            problems.append(Problem(file, f"{where}.agent",
                                    f"unknown agent {step.agent!r} (agents: {', '.join(sorted(agents))})"))
    for i, step in enumerate(spec.steps):
        if step.when is not None:
            try:
                parse(step.when)
            except ConditionError as exc:
                problems.append(Problem(file, f"steps[{i}].when", str(exc)))
    if all(step.when is not None for step in spec.steps):
        problems.append(Problem(file, "steps", "every step has a when: at least one must run for every order"))
    rows = sum(len(step.branches or ()) or 1 for step in spec.steps)
    if rows > MAX_STEPS:
        problems.append(Problem(file, "steps", f"{rows} steps: its largest transaction would write "
                                f"{largest_write(rows)} entities, over the {TRANSACTION_ENTITIES} of one entity-group "
                                f"transaction (at most {MAX_STEPS} steps, each branch of a parallel step counting)"))
    return problems


def _every_step(spec: WorkflowFile) -> list[tuple[int, StepFile, str]]:
    """Every step and branch, with its index in ``steps`` and its path in the file."""
    out: list[tuple[int, StepFile, str]] = []
    for i, step in enumerate(spec.steps):
        out.append((i, step, f"steps[{i}]"))
        out += [(i, branch, f"steps[{i}].branches[{j}]") for j, branch in enumerate(step.branches or ())]
    return out


def _steps(step: StepFile) -> list[Step]:
    """A step as the core reads it: one, or a parallel step's branches (each with its group's when)."""
    if step.kind != "parallel":
        return [_step(step)]
    when = parse(step.when) if step.when is not None else None
    return [replace(_step(branch), group=step.name, when=when) for branch in step.branches or ()]


def _step(step: StepFile) -> Step:
    r = step.retry
    kind = "call" if step.kind == "parallel" else step.kind  # a parallel step itself is never one (``_steps``)
    delay = parse_duration(step.duration) if step.duration is not None else (
        parse_duration(step.until.plus) if step.until is not None and step.until.plus != "PT0S" else timedelta(0))
    return Step(name=step.name, agent=step.agent or "", operation=step.operation or "",
                timeout_seconds=step.timeoutSeconds or 0, kind=kind, event=step.event, decision=step.decision,
                on_timeout=step.onTimeout, delay=delay if step.kind == "delay" else None,
                until=step.until.field if step.until is not None else None,
                compensation=step.compensation, on_failure=step.onFailure, pivot=step.pivot,
                when=parse(step.when) if step.when is not None else None,
                retry=Retry(agent_attempts=r.agentAttempts, agent_backoff_seconds=r.agentBackoffSeconds,
                            max_failure_count=r.maxFailureCount, backoff_base_seconds=r.backoffBaseSeconds))


def _workflow(spec: WorkflowFile) -> Workflow:
    return Workflow(name=spec.name, version=spec.version, description=spec.description,
                    steps=tuple(s for step in spec.steps for s in _steps(step)))


def load_directory(directory: Path, agents: Mapping[str, object]) -> Registry:
    """Every ``*.yaml`` / ``*.yml`` file of ``directory``; raises :class:`WorkflowError`."""
    if not directory.is_dir():
        raise WorkflowError([Problem(str(directory), "(directory)", "no such directory")])
    problems: list[Problem] = []
    loaded: dict[tuple[str, int], tuple[str, Workflow]] = {}
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    for path in files:
        workflow, found = parse_file(path, agents)
        problems += found
        if workflow is None:
            continue
        if workflow.key in loaded:
            problems.append(Problem(path.name, "(file)", f"{workflow.label} is also declared by "
                                    f"{loaded[workflow.key][0]}"))
            continue
        loaded[workflow.key] = (path.name, workflow)
    if not loaded and not problems:
        problems.append(Problem(str(directory), "(directory)", "no workflow file (*.yaml)"))
    if problems:
        raise WorkflowError(problems)
    return Registry.of(wf for _, wf in loaded.values())
