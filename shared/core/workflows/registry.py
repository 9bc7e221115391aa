"""Every loaded workflow, by (name, version): what an order runs is looked up here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared.core.workflows.model import Workflow


class UnknownWorkflow(LookupError):
    """An order names a (name, version) that is not loaded (its file was removed: unsafe)."""

    def __init__(self, name: str, version: int | None = None) -> None:
        self.name = name
        self.version = version
        label = name if version is None else f"{name} v{version}"
        super().__init__(f"workflow {label} is not deployed")


@dataclass(frozen=True)
class Registry:
    """Immutable: built once at start-up from the workflow files."""

    by_key: Mapping[tuple[str, int], Workflow] = field(default_factory=dict)

    @classmethod
    def of(cls, workflows: Iterable[Workflow]) -> Registry:
        by_key: dict[tuple[str, int], Workflow] = {}
        for wf in workflows:
            if wf.key in by_key:
                raise ValueError(f"workflow {wf.label} is declared twice")
            by_key[wf.key] = wf
        return cls(by_key)

    def get(self, name: str, version: int) -> Workflow:
        """The workflow, or :class:`UnknownWorkflow`."""
        found = self.by_key.get((name, version))
        if found is None:
            raise UnknownWorkflow(name, version)
        return found

    def latest(self, name: str) -> Workflow:
        """The highest version of ``name`` (what a new order of that name runs)."""
        versions = [wf for (n, _), wf in self.by_key.items() if n == name]
        if not versions:
            raise UnknownWorkflow(name)
        return max(versions, key=lambda wf: wf.version)

    def names(self) -> list[str]:
        return sorted({name for name, _ in self.by_key})

    def all(self) -> list[Workflow]:
        """Every loaded version, by name then version."""
        return [self.by_key[key] for key in sorted(self.by_key)]

    def __contains__(self, key: object) -> bool:
        return key in self.by_key
