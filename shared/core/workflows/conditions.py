"""A step's ``when``: a condition over the order's fields, in a small declarative form (no eval).

A condition is a mapping with exactly one key:

* ``all`` / ``any``: a non-empty list of conditions (every one holds / at least one does);
* ``not``: one condition;
* a field of the order, with exactly one comparison:

  =============  ===============================  =========================================
  field          comparisons                      compared with
  =============  ===============================  =========================================
  ``total``      ``eq ne gt gte lt lte``          a number (the order's total, exactly)
  ``currency``   ``eq ne in``                     a string, or a non-empty list (``in``)
  ``priority``   ``eq ne in``                     ``low``, ``normal`` or ``high``
  ``customerId`` ``eq ne in``                     a string, or a non-empty list (``in``)
  ``items``      ``contains``                     a SKU: some item of the order has it
  =============  ===============================  =========================================

For example ``{total: {gt: 1000}}``, or ``{all: [{currency: {eq: EUR}}, {not: {priority: {eq:
low}}}]}``. :func:`parse` refuses anything else with the reason (the loader names the file and
the step, and the app does not start); :func:`holds` evaluates a parsed condition, and never fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

NUMBER_OPS = ("eq", "ne", "gt", "gte", "lt", "lte")
TEXT_OPS = ("eq", "ne", "in")
FIELDS: dict[str, tuple[str, ...]] = {"total": NUMBER_OPS, "currency": TEXT_OPS, "priority": TEXT_OPS,
                                      "customerId": TEXT_OPS, "items": ("contains",)}
MAX_DEPTH = 8


class ConditionError(ValueError):
    """A ``when`` that is not a condition this form allows; the message says why."""


@dataclass(frozen=True)
class Compare:
    field: str
    op: str
    value: Any  # Decimal for total, str, or a tuple of str for ``in``


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Condition, ...]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Condition, ...]


@dataclass(frozen=True)
class Not:
    part: Condition


Condition = Compare | AllOf | AnyOf | Not


def parse(raw: Any, depth: int = 0) -> Condition:
    """The condition ``raw`` (as read from YAML) declares; :class:`ConditionError` otherwise."""
    if depth > MAX_DEPTH:
        raise ConditionError(f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise ConditionError("must be a mapping with exactly one key: all, any, not, or a field "
                             f"({', '.join(FIELDS)})")
    [(key, value)] = raw.items()
    if key in ("all", "any"):
        if not isinstance(value, list) or not value:
            raise ConditionError(f"{key}: must be a non-empty list of conditions")
        parts = tuple(parse(v, depth + 1) for v in value)
        return AllOf(parts) if key == "all" else AnyOf(parts)
    if key == "not":
        return Not(parse(value, depth + 1))
    if key not in FIELDS:
        raise ConditionError(f"unknown key {key!r}: use all, any, not, or a field ({', '.join(FIELDS)})")
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ConditionError(f"{key}: must be a mapping with exactly one comparison ({', '.join(FIELDS[key])})")
    [(op, operand)] = value.items()
    if op not in FIELDS[key]:
        raise ConditionError(f"{key}: unknown comparison {op!r} (use {', '.join(FIELDS[key])})")
    return Compare(key, op, _operand(key, op, operand))


def _operand(field: str, op: str, operand: Any) -> Any:
    if field == "total":
        if isinstance(operand, bool) or not isinstance(operand, int | float | str):
            raise ConditionError(f"total.{op}: must be a number")
        try:
            number = Decimal(str(operand))
        except InvalidOperation:
            raise ConditionError(f"total.{op}: must be a number") from None
        if not number.is_finite():
            raise ConditionError(f"total.{op}: must be a finite number")
        return number
    if op == "in":
        if not isinstance(operand, list) or not operand or not all(isinstance(v, str) for v in operand):
            raise ConditionError(f"{field}.in: must be a non-empty list of strings")
        return tuple(operand)
    if not isinstance(operand, str):
        raise ConditionError(f"{field}.{op}: must be a string")
    return operand


def holds(condition: Condition, order: Mapping[str, Any]) -> bool:
    """Whether ``condition`` holds for ``order`` (its fields as the agents receive them: total a
    decimal string, items a list of ``{"sku", ...}``, plus priority and customerId)."""
    match condition:
        case AllOf(parts):
            return all(holds(p, order) for p in parts)
        case AnyOf(parts):
            return any(holds(p, order) for p in parts)
        case Not(part):
            return not holds(part, order)
        case Compare(field="items", value=sku):
            return any(isinstance(item, Mapping) and item.get("sku") == sku for item in order.get("items") or [])
        case Compare(field="total", op=op, value=number):
            try:
                total = Decimal(str(order.get("total")))
            except InvalidOperation:
                return False
            return {"eq": total == number, "ne": total != number, "gt": total > number, "gte": total >= number,
                    "lt": total < number, "lte": total <= number}[op]
        case Compare(field=field, op=op, value=value):
            actual = order.get(field)
            return actual in value if op == "in" else (actual == value) == (op == "eq")
    raise AssertionError(f"not a condition: {condition!r}")


def to_json(condition: Condition) -> dict[str, Any]:
    """The condition in its declared form (for ``GET /api/workflows``)."""
    match condition:
        case AllOf(parts):
            return {"all": [to_json(p) for p in parts]}
        case AnyOf(parts):
            return {"any": [to_json(p) for p in parts]}
        case Not(part):
            return {"not": to_json(part)}
        case Compare(field=field, op=op, value=value):
            shown = list(value) if isinstance(value, tuple) else (
                int(value) if isinstance(value, Decimal) and value == value.to_integral_value() else
                float(value) if isinstance(value, Decimal) else value)
            return {field: {op: shown}}
    raise AssertionError(f"not a condition: {condition!r}")
