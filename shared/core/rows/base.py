"""An entity and its keys, how a property is read and written (``Codec``), a write (``Op``) and
the typed row every row of the store is (``Row``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, TypeVar

from shared.core.jsonio import dumps, loads
from shared.core.lease import Lease
from shared.core.times import iso, parse_iso
from shared.core.workflows import DEFAULT_WORKFLOW, LEGACY_VERSION

# An entity as the store has it (PascalCase properties, keys, ETag under ETAG); each row below reads and writes one.
Entity = dict[str, Any]
R = TypeVar("R", bound="Row")

# The keys of an order's partition (StateTable, PartitionKey = the order id)
ORDER_ROW = "order"
STATE_ROW = "state"
HISTORY_PREFIX = "history-"
HISTORY_END = "history."  # the first key after every history row ('.' follows '-')
# The forward path reads an order's partition from here on: ``order``, ``state``, ``step-*``;
# its history rows (``history-*``) sort before it and are read only to show them.
LIVE_ROWS_FROM = ORDER_ROW


def step_row_key(index: int, name: str) -> str:
    return f"step-{index:02d}-{name}"


def history_row_key(seq: int) -> str:
    return f"{HISTORY_PREFIX}{seq:08d}"


@dataclass(frozen=True)
class Codec:
    """How one property is read from and written to an entity."""

    load: Callable[[Any], Any]
    dump: Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _enum(kind: Callable[[Any], Any], absent: Any = None) -> Codec:
    return Codec(lambda v: kind(v) if v is not None else absent, str)


TEXT = Codec(_same, _same)
INT = Codec(lambda v: int(v) if v is not None else 0, int)
OPTIONAL_INT = Codec(lambda v: None if v is None else int(v), int)
FLAG = Codec(bool, bool)
TIME = Codec(parse_iso, iso)
JSON = Codec(lambda v: loads(v) if v else None, dumps)
LEASE = Codec(Lease.parse, str)
# An order written before workflows were recorded has neither property: it ran order v1.
WORKFLOW_NAME = Codec(lambda v: v or DEFAULT_WORKFLOW, str)
WORKFLOW_VERSION = Codec(lambda v: LEGACY_VERSION if v is None else int(v), int)


ETAG = "_etag"  # where an entity read from the store carries its ETag


@dataclass(frozen=True)
class Op:
    """One write of a transaction. ``row`` holds RowKey and properties (no PartitionKey)."""

    kind: Literal["create", "replace", "delete"]
    row: Entity
    etag: str | None = None  # required for replace/delete: the ETag the decision was made on

    @property
    def row_key(self) -> str:
        return str(self.row["RowKey"])


class Row:
    """A typed row: ``PROPS`` maps each field to its property name and codec."""

    __slots__ = ()
    PROPS: ClassVar[tuple[tuple[str, str, Codec], ...]]
    etag: str | None

    @property
    def row_key(self) -> str:
        raise NotImplementedError

    @classmethod
    def from_entity(cls: type[R], entity: Mapping[str, Any]) -> R:
        values = {attr: codec.load(entity.get(prop)) for attr, prop, codec in cls.PROPS}
        return cls(**values, etag=entity.get(ETAG))  # type: ignore[call-arg]

    def to_entity(self) -> Entity:
        out: Entity = {"RowKey": self.row_key}
        for attr, prop, codec in self.PROPS:
            value = getattr(self, attr)
            if value is not None:
                out[prop] = codec.dump(value)
        return out

    def create(self) -> Op:
        """Write this row as new (409 if it exists)."""
        return Op("create", self.to_entity())

    def replacing(self, old: Row) -> Op:
        """Write this row over ``old``, only if ``old`` is what the store still has (ETag)."""
        return Op("replace", self.to_entity(), etag=old.etag)


def props_of(cls: type, names: Mapping[str, tuple[str, Codec]]) -> tuple[tuple[str, str, Codec], ...]:
    declared = {f.name for f in fields(cls)} - {"etag", "legacy"}  # legacy: where a SearchRow was read, not a property
    assert declared == set(names), f"{cls.__name__}: {declared ^ set(names)}"
    return tuple((attr, prop, codec) for attr, (prop, codec) in names.items())
