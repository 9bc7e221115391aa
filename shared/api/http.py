"""HTTP, framework-neutral: what every route answers with (``HttpResult``, problem+json), and
the checks every request body and order id goes through before anything reads the store.

* Rejections are ``application/problem+json`` (RFC 9457) with ``type``, ``title``, ``status``,
  ``detail`` and, for bad fields, ``errors`` naming each one.
* A body declared JSON: 413 over MaxRequestBytes, 415 unless the Content-Type is JSON (UTF-8),
  400 when it is not valid UTF-8 JSON (``invalid-json``, saying where) or nests too deeply.
* Ids (32 lower-case hex, or a UUID with dashes in any case: the same order) are brought to
  their stored form before any table call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core.jsonio import DuplicateKeyError, dumps, loads, too_deep
from shared.core.orders import ORDER_ID_FORMS, parse_order_id

PROBLEM = "application/problem+json"
PROBLEM_BASE = "https://errors.orders.example/"


@dataclass
class HttpResult:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"

    def encoded(self) -> bytes:
        return b"" if self.body is None else dumps(self.body).encode("utf-8")

    def json(self) -> Any:
        return self.body


# An order nests three levels ({items: [{...}]}); anything far deeper is hostile, and is named
# before the recursive JSON parser could exhaust its stack on it.
MAX_JSON_DEPTH = 32


def problem(status: int, kind: str, title: str, detail: str, errors: list[dict[str, str]] | None = None,
            **extra: Any) -> HttpResult:
    body: dict[str, Any] = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    body.update(extra)
    return HttpResult(status, body, content_type=PROBLEM)


# The function key, which the Functions host reads from the query string (``?code=``) and leaves
# in it: a query parameter of every route whatever else the route takes.
FUNCTION_KEY = "code"


def unknown_query(params: Mapping[str, str], accepted: tuple[str, ...], title: str) -> HttpResult | None:
    """The 400 (``invalid-query``) naming each query parameter not in ``accepted`` (nor the
    function key), with the accepted ones; None when there is none. A parameter a route does not
    take is refused, never ignored: a misspelt filter would be answered as if there were none."""
    unknown = sorted(name for name in params if name not in accepted and name != FUNCTION_KEY)
    if not unknown:
        return None
    message = f"not a parameter of this query (it takes {', '.join(accepted)})"
    return problem(400, "invalid-query", title, "; ".join(f"{name}: {message}" for name in unknown),
                   errors=[{"field": name, "message": message} for name in unknown])


def lower_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in (headers or {}).items()}


def _is_json_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    parts = [p.strip().lower() for p in content_type.split(";")]
    media = parts[0]
    if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
        return False
    for p in parts[1:]:
        if p.startswith("charset=") and p.split("=", 1)[1].strip('"') not in ("utf-8", "utf8"):
            return False
    return True


def resolve_id(raw: str | None) -> str | HttpResult:
    """The stored form of an order id from a route (either API form), or the 400 showing them."""
    order_id = parse_order_id(raw)
    if order_id is not None:
        return order_id
    return problem(400, "invalid-order-id", "Invalid order id", f"an order id is {ORDER_ID_FORMS}",
                   errors=[{"field": "id", "message": f"must be {ORDER_ID_FORMS}"}])


def invalid_json(reason: str) -> HttpResult:
    """400 for a body declared JSON that is not (RFC 8259: UTF-8 JSON text): the reason, where."""
    return problem(400, "invalid-json", "Invalid JSON", f"the body is not valid JSON: {reason}",
                   errors=[{"field": "(body)", "message": f"invalid JSON: {reason}"}])


def parse_json_body(body: bytes, h: Mapping[str, str], max_bytes: int,
                    title: str = "Invalid order") -> tuple[Any, HttpResult | None]:
    """The parsed JSON body, or its rejection: 413 too large, 415 not declared JSON, 400 not JSON
    (``title``: what a 400 for a valid JSON text says is invalid)."""
    declared = h.get("content-length")
    if len(body) > max_bytes or (declared and declared.isdigit() and int(declared) > max_bytes):
        return None, problem(413, "too-large", "Request body too large", f"the body must be at most {max_bytes} bytes")
    if not _is_json_type(h.get("content-type")):
        return None, problem(415, "unsupported-media-type", "Unsupported media type",
                             "the body must be JSON (Content-Type: application/json, UTF-8)")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, invalid_json(f"byte 0x{body[exc.start]:02x} at offset {exc.start} is not UTF-8 "
                                  "(JSON is UTF-8 text)")
    if not text.strip():
        return None, invalid_json("the body is empty; expected a JSON object")
    if text.startswith("\ufeff"):
        return None, invalid_json("it starts with a byte order mark (U+FEFF); send UTF-8 without one")
    deep = too_deep(text, MAX_JSON_DEPTH)
    if deep is not None:
        return None, problem(400, "validation", title, f"JSON nests deeper than {MAX_JSON_DEPTH} levels",
                             errors=[{"field": deep, "message": f"nests deeper than {MAX_JSON_DEPTH} levels"}])
    try:
        return loads(text), None
    except DuplicateKeyError as exc:
        return None, problem(400, "validation", title, str(exc),
                             errors=[{"field": "(body)", "message": str(exc)}])
    except json.JSONDecodeError as exc:
        return None, invalid_json(f"{exc.msg} at line {exc.lineno}, column {exc.colno}")
    except ValueError as exc:  # NaN, Infinity
        return None, invalid_json(str(exc))
    except RecursionError:  # nesting deep enough to exhaust the parser's stack, yet under the size limit
        return None, problem(400, "validation", title, "the JSON nests too deeply",
                             errors=[{"field": "(body)", "message": "nests too deeply"}])
