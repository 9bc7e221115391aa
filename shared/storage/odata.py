"""The Table service's REST wire format, as :class:`shared.storage.tables.RestTable` speaks it.

Entities are JSON with minimal metadata: strings, booleans and Int32 as they are, and Int64,
Double, DateTime and Binary by their ``@odata.type``. A ``$batch`` response is one
``application/http`` part per write of the changeset, each with its status line and its new ETag.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from shared.core.rows import ETAG, Entity

ACCEPT = "application/json;odata=minimalmetadata"
PART_HEADERS = f"DataServiceVersion: 3.0\r\nAccept: {ACCEPT}\r\n"
_PART_STATUS = re.compile(rb"\r\nHTTP/1\.1 (\d{3}) ")
_BOUNDARY_LINE = re.compile(rb"\r\n--[^\r\n]*")
_CONTENT_ID = re.compile(rb"^content-id:\s*(\d+)\s*$", re.IGNORECASE | re.MULTILINE)
_ETAG_HEADER = re.compile(rb"^etag:[ \t]*([^\r\n]+?)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)
_PARAMETER = re.compile(r"@(\w+)")
_INT32 = range(-2 ** 31, 2 ** 31)


def to_json(entity: Mapping[str, Any]) -> Entity:
    """An entity in the REST JSON format: a type annotation where JSON alone would be read otherwise."""
    out: Entity = {}
    for key, value in entity.items():
        if value is None:
            continue
        if isinstance(value, bool) or isinstance(value, str):
            out[key] = value
        elif isinstance(value, int):
            if value in _INT32:
                out[key] = value
            else:
                out[key], out[f"{key}@odata.type"] = str(value), "Edm.Int64"
        elif isinstance(value, float):
            out[key], out[f"{key}@odata.type"] = value, "Edm.Double"
        elif isinstance(value, datetime):
            out[key], out[f"{key}@odata.type"] = value.isoformat(), "Edm.DateTime"
        elif isinstance(value, bytes):
            out[key], out[f"{key}@odata.type"] = base64.b64encode(value).decode("ascii"), "Edm.Binary"
        else:
            raise TypeError(f"property {key}: a {type(value).__name__} cannot be stored")
    return out


def from_json(data: Mapping[str, Any]) -> Entity:
    """An entity read back (minimal metadata): typed by its annotations, with its ETag."""
    out: Entity = {}
    for key, value in data.items():
        if key.startswith("odata.") or "@odata." in key or key == "Timestamp":
            continue
        kind = data.get(f"{key}@odata.type")
        if kind == "Edm.Int64":
            value = int(value)
        elif kind == "Edm.Double":
            value = float(value)
        elif kind == "Edm.DateTime":
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        elif kind == "Edm.Binary":
            value = base64.b64decode(value)
        out[key] = value
    out[ETAG] = data.get("odata.etag")
    return out


def odata_literal(value: str) -> str:
    """A string as an OData literal: quoted, quotes doubled."""
    return "'" + value.replace("'", "''") + "'"


def key_path(partition_key: str, row_key: str) -> str:
    pk, rk = (quote(key.replace("'", "''"), safe="") for key in (partition_key, row_key))
    return f"(PartitionKey='{pk}',RowKey='{rk}')"


def bind(filter: str, parameters: Mapping[str, str]) -> str:
    """``filter`` with each ``@name`` replaced by its parameter as an OData literal."""
    return _PARAMETER.sub(lambda m: odata_literal(parameters[m.group(1)]), filter)


def failed_statuses(body: bytes) -> list[int]:
    """The statuses of 300 and above in a ``$batch`` response (the first is the changeset's failure)."""
    return [int(s) for s in _PART_STATUS.findall(body) if int(s) >= 300]


def batch_etags(body: bytes, count: int) -> list[str | None]:
    """The ETag of each of ``count`` writes in a successful ``$batch`` response, in the order of the
    request (a part that names its ``Content-ID``, among its MIME headers or, as the service
    writes it, among its HTTP headers, is placed by it; None: the part gave none), or an empty
    list when the parts cannot be matched to the writes."""
    found: list[str | None] = [None] * count
    parts = [p for p in _BOUNDARY_LINE.split(b"\r\n" + body) if b"HTTP/1.1 " in p]
    if len(parts) != count:
        return []
    seen: set[int] = set()
    for position, part in enumerate(parts):
        mime, _sep, http = part.partition(b"HTTP/1.1 ")
        headers = http.split(b"\r\n\r\n", 1)[0]
        cid = _CONTENT_ID.search(mime) or _CONTENT_ID.search(headers)
        index = int(cid.group(1)) if cid else position
        if not 0 <= index < count or index in seen:
            return []
        seen.add(index)
        etag = _ETAG_HEADER.search(headers)
        found[index] = etag.group(1).decode("latin-1") if etag else None
    return found
