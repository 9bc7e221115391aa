"""Strict JSON with ``Decimal`` numbers: how every body and JSON property is read and written.

A float never holds an amount: non-integer numbers are parsed as ``Decimal`` and written back as
strings. NaN, Infinity and duplicate keys are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

JsonObject = dict[str, Any]  # a JSON object, as ``loads`` makes it and ``dumps`` writes it


class DuplicateKeyError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(data: bytes | str) -> Any:
    """Strict JSON: Decimal numbers, no NaN/Infinity, no duplicate keys."""
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data).decode("utf-8")
    return json.loads(data, parse_float=Decimal, parse_int=_parse_int, parse_constant=_reject_constant,
                      object_pairs_hook=_no_duplicates)


def too_deep(text: str, limit: int) -> str | None:
    """The field whose value nests JSON deeper than ``limit`` ("(body)" at the top), else None.

    An iterative scan, so that hostile nesting is named before the recursive parser sees it.
    """
    depth = 0
    in_string = escaped = False
    start = 0
    top_is_object = False
    last_string = top_key = None
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if depth == 1:
                    last_string = text[start + 1:i]
        elif ch == '"':
            in_string, start = True, i
        elif ch in "[{":
            if depth == 0:
                top_is_object = ch == "{"
            depth += 1
            if depth > limit:
                return top_key if top_is_object and top_key is not None else "(body)"
        elif ch in "]}":
            depth -= 1
        elif ch == ":" and depth == 1:
            top_key = last_string
    return None


def _parse_int(text: str) -> int | Decimal:
    # int() refuses more than 4300 digits (a ValueError that would read as "not JSON"): keep
    # such numbers as Decimal, so validation rejects the field that holds them, by name.
    return int(text) if len(text) <= 64 else Decimal(text)


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# one encoder for every body: json.dumps with any non-default argument builds one per call
_ENCODER = json.JSONEncoder(default=_default, separators=(",", ":"), ensure_ascii=False)


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def present(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` without the ones whose value is None: the one place the app leaves an absent value
    out of a body, an entity, a history event or a log line, instead of writing a null."""
    return {k: v for k, v in fields.items() if v is not None}
