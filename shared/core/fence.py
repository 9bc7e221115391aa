"""Fencing tokens: the order's live rows, as a write left them, carried by a request and its reply.

The transaction that dispatches a step (or a compensation) knows every live row of the order
(``order``, ``state``, ``step-*``) and, from the store's answer, their new ETags. The request
carries them in its ``fence`` field, the agent echoes it unchanged in the reply, and the
Scheduler decides on the reply with these rows instead of reading the partition. Its write is
conditioned on the ETags, as after a read: it commits only if nothing changed since the token's
write (any change to the order writes its state row, so its ETag fences every row), else it
loses (412, ``Conflict``) and the Scheduler reads and decides again. A token is never
trusted beyond that: it only saves the read when the read would have returned the same rows.

A token is base64url of a 16-byte MAC and the zlib-compressed JSON ``{"o": orderId, "r":
{RowKey: entity}}`` (each entity with its ETag under ``shared.core.rows.ETAG``). The MAC (by the
``TokenKeys`` app setting, like ``shared.api.tokens``, under its own label: the current key signs,
a token by the previous key is still read) refuses a corrupted, cut or foreign token, or one by a
key no longer held, and the reply is then decided on a read. It does not keep the rows secret (the
request already carries the order). The agents echo a token unchanged, and check its MAC only
to use its rows for their own check (``shared.storage.views.current_view``); the trust boundary
stays the Service Bus namespace (managed identity only). Every ETag must be one a store issued
(``W/"..."``), never ``*``: a token's write is always conditional. A token longer than
``MAX_FENCE_LENGTH`` is not issued (the reply path reads instead).

This module is the token's one home, from its rows to its reading; its callers only call it:

* built: :func:`carried`, the rows a request is fenced by as its decision leaves them (the core's
  request, ``shared.core.statemachine.dispatch``, puts them on its ``Send``); :class:`Written`,
  what a run's transactions wrote, with the ETags the store answered (the executor records each
  committed ``Transact``); :func:`fenced`, the request with the token of both (the executor, as
  it sends);
* sealed: :func:`encode`;
* read: :func:`decode` (``shared.storage.views``: an agent's check, the reply's decision).

Pure, like the rest of the core: the keys are given, and nothing is read or written here.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shared.core import sealed
from shared.core.effects import Transact
from shared.core.messages import MAX_FENCE_LENGTH, OutMessage
from shared.core.rows import ETAG, ORDER_ROW, STATE_ROW, Row

# The kind of token the MAC is taken under (not a key): a continuation token never reads as one.
_LABEL = b"orders-fencing-token-v1"
_MAX_JSON_BYTES = 1024 * 1024  # decompressed: a bound against a crafted token
# An ETag as Table Storage (and MemoryStore) issue them: weak, quoted. '*' would make the write
# unconditional, so a token holding one is refused.
_STORE_ETAG = re.compile(r'W/"[^"*]+"')

Entities = dict[str, dict[str, Any]]
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # one, not one per token


class InvalidFence(ValueError):
    """The token was not issued by this app for this order, or is damaged."""


def live_row(row_key: str) -> bool:
    """A row a token carries: ``order``, ``state`` or a ``step-*`` row."""
    return row_key in (ORDER_ROW, STATE_ROW) or row_key.startswith("step-")


def carried(rows: Iterable[Row | None]) -> Entities:
    """The rows a request's token carries: the order's live rows as its decision leaves them, each
    with the ETag it was read with (:func:`fenced` replaces the rows the decision's transaction
    wrote with what it wrote and their new ETags)."""
    return {r.row_key: {**r.to_entity(), ETAG: r.etag} for r in rows if r is not None}


@dataclass
class Written:
    """What the committed ``Transact`` effects of a run wrote on one order: RowKey -> entity with
    its new ETag (None: deleted, or no ETag came back). A write on another order starts over."""

    order_id: str | None = None
    rows: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def record(self, eff: Transact, etags: Mapping[str, str] | None) -> None:
        if eff.order_id != self.order_id:
            self.order_id, self.rows = eff.order_id, {}
        for op in eff.ops:
            etag = (etags or {}).get(op.row_key)
            if live_row(op.row_key):
                self.rows[op.row_key] = None if op.kind == "delete" or not etag else {**op.row, ETAG: etag}


def fenced(keys: sealed.Keys, message: OutMessage, rows: Mapping[str, Mapping[str, Any]],
           written: Written) -> OutMessage:
    """``message`` with the fencing token of ``rows`` (:func:`carried`) overlaid with what this run
    wrote; unchanged (no token) unless this run committed the order's state row with an ETag for
    every row it wrote."""
    order_id = message.body.get("orderId")
    if written.order_id != order_id or written.rows.get(STATE_ROW) is None:
        return message
    merged: dict[str, Mapping[str, Any]] = {}
    for key in {*rows, *written.rows}:
        if key in written.rows:
            row = written.rows[key]
            if row is None:  # written without an ETag back (or deleted): no token
                return message
            merged[key] = row
        else:
            merged[key] = rows[key]
    token = encode(keys, str(order_id), merged)
    if token is None:
        return message
    return replace(message, body={**message.body, "fence": token})


def encode(keys: sealed.Keys, order_id: str, rows: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The token for ``rows`` (RowKey -> entity with its ETag), or None when it cannot be one:
    a row without an ETag, a value JSON cannot hold, no state row, or too long."""
    if STATE_ROW not in rows or ORDER_ROW not in rows:
        return None
    if any(not live_row(k) or not isinstance(e.get(ETAG), str) or not e[ETAG] for k, e in rows.items()):
        return None
    try:
        text = _ENCODER.encode({"o": order_id, "r": rows})
    except (TypeError, ValueError):
        return None
    packed = zlib.compress(text.encode("utf-8"), 1)
    token = sealed.seal(keys, _LABEL, packed)
    return token if len(token) <= MAX_FENCE_LENGTH else None


def decode(keys: sealed.Keys, order_id: str, token: str) -> Entities:
    """The rows a token issued for ``order_id`` (by either key) carries; ``InvalidFence`` for anything else."""
    try:
        packed = sealed.unseal(keys, _LABEL, token, MAX_FENCE_LENGTH, foreign="MAC does not match")
    except sealed.Unsealed as exc:
        raise InvalidFence(str(exc)) from exc
    inflate = zlib.decompressobj()
    try:
        text = inflate.decompress(packed, _MAX_JSON_BYTES)
    except zlib.error as exc:
        raise InvalidFence("unreadable") from exc
    if inflate.unconsumed_tail or not inflate.eof:
        raise InvalidFence("too large or cut")
    try:
        data = json.loads(text)
    except ValueError as exc:  # pragma: no cover - a MAC we issued covers JSON we wrote
        raise InvalidFence("unreadable") from exc
    return _checked(order_id, data)


def _checked(order_id: str, data: Any) -> Entities:
    if not isinstance(data, dict) or data.get("o") != order_id:
        raise InvalidFence("issued for another order")
    rows = data.get("r")
    if not isinstance(rows, dict) or STATE_ROW not in rows or ORDER_ROW not in rows:
        raise InvalidFence("no order or state row")
    out: Entities = {}
    for key, entity in rows.items():
        if not live_row(key) or not isinstance(entity, dict) or entity.get("RowKey") != key:
            raise InvalidFence(f"row {key!r} is not a live row")
        if not isinstance(entity.get(ETAG), str) or not _STORE_ETAG.fullmatch(entity[ETAG]):
            raise InvalidFence(f"row {key!r} has no ETag a store issued")  # never '*' (unconditional)
        out[key] = {**entity, "PartitionKey": order_id}
    return out
