"""Fencing tokens (``shared.core.fence``) and how the executor issues them (``shared.runtime.executor``)."""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Sequence
from typing import Any

import pytest

from shared.core import fence, sealed
from shared.core.effects import Send, Transact
from shared.core.messages import OutMessage
from shared.core.rows import ETAG, Op
from shared.messaging import MemoryBus
from shared.runtime.executor import execute
from shared.storage.memory import MemoryStore
from tests.unit.harness import TEST_KEYS as KEYS

OID = "a" * 32
OTHER = "b" * 32


def rows(etag: str = 'W/"1"') -> dict[str, dict[str, Any]]:
    return {"order": {"RowKey": "order", "Total": "1.00", ETAG: etag},
            "state": {"RowKey": "state", "OrderID": OID, "LeaseKey": "s:1", ETAG: etag},
            "step-00-s": {"RowKey": "step-00-s", "Name": "s", "Attempt": 1, ETAG: etag}}


# --------------------------------------------------------------------------- the codec
def test_round_trip_gives_the_rows_with_their_etags_and_partition() -> None:
    token = fence.encode(KEYS, OID, rows())
    assert token is not None and len(token) < 400
    assert fence.decode(KEYS, OID, token) == {k: {**v, "PartitionKey": OID} for k, v in rows().items()}


# Issued by the release before the token moved to ``shared.core.fence`` (then ``shared.storage.fence``),
# for ``rows()`` by ``TEST_KEYS``: a request in flight across a deploy still carries one like it.
ISSUED_BEFORE = ("DiiwaJcMxtRF6bzPM3wCqngBjU67CsJAEPyXqS96114n2IiiIIJNICy42BguZBeChPt3Nx5aBEW32hnmNSIhgn4cHH"
                 "rEEam_8PM5pmHLd3MWxuGUlG6Gw8J7UzesdDV4XtYINZAdREl5Cnl7C-NwmFI36_927JiES7fE8K2Ku8r7SmZ1L9Zh"
                 "T61tgZh_pcptp4jhw-ycH_HdWXM")


def test_a_token_issued_before_is_read_and_issued_alike() -> None:
    """The wire format is unchanged: a token in flight across a deploy is read, and the same rows
    make the same token."""
    assert fence.decode(KEYS, OID, ISSUED_BEFORE) == {k: {**v, "PartitionKey": OID} for k, v in rows().items()}
    assert fence.encode(KEYS, OID, rows()) == ISSUED_BEFORE


@pytest.mark.parametrize("damage", ["flip", "cut", "append", "padding", "empty"])
def test_a_damaged_token_is_refused(damage: str) -> None:
    token = fence.encode(KEYS, OID, rows())
    assert token is not None
    bad = {"flip": token[:30] + ("A" if token[30] != "A" else "B") + token[31:], "cut": token[:-4],
           "append": token + "AAAA", "padding": token + "==", "empty": ""}[damage]
    with pytest.raises(fence.InvalidFence):
        fence.decode(KEYS, OID, bad)


def test_a_token_of_another_order_is_refused() -> None:
    token = fence.encode(KEYS, OTHER, rows())
    assert token is not None
    with pytest.raises(fence.InvalidFence, match="another order"):
        fence.decode(KEYS, OID, token)


def test_a_token_made_with_another_key_is_refused() -> None:
    packed = zlib.compress(json.dumps({"o": OID, "r": rows()}).encode(), 1)
    forged = base64.urlsafe_b64encode(b"\0" * 16 + packed).rstrip(b"=").decode()
    with pytest.raises(fence.InvalidFence, match="MAC"):
        fence.decode(KEYS, OID, forged)


def test_a_token_by_the_previous_key_is_read_until_that_key_is_dropped() -> None:
    """Two-key rotation: the current key signs, a token by the previous key is still read."""
    old, new, stranger = b"o" * 32, b"n" * 32, b"s" * 32
    token = fence.encode(sealed.Keys(old), OID, rows())
    assert token is not None
    rotated = sealed.Keys(current=new, previous=old)
    assert fence.decode(rotated, OID, token) == fence.decode(sealed.Keys(old), OID, token)
    assert fence.encode(rotated, OID, rows()) == fence.encode(sealed.Keys(new), OID, rows())  # signed by the new
    for keys in (sealed.Keys(new), sealed.Keys(stranger, previous=new), sealed.Keys(stranger)):
        with pytest.raises(fence.InvalidFence, match="MAC does not match"):
            fence.decode(keys, OID, token)


def test_a_continuation_token_is_not_a_fencing_token() -> None:
    """One key serves both kinds: each is MAC'd under its own label, so neither passes as the other."""
    from shared.api import tokens

    payload = zlib.compress(json.dumps({"o": OID, "r": rows()}).encode(), 1)
    as_continuation = sealed.seal(KEYS, tokens._label(""), payload)
    with pytest.raises(fence.InvalidFence, match="MAC does not match"):
        fence.decode(KEYS, OID, as_continuation)
    with pytest.raises(tokens.InvalidToken):
        tokens.redeem(KEYS, "", fence.encode(KEYS, OID, rows()) or "")


@pytest.mark.parametrize("change", ["no-etag", "empty-etag", "history-row", "no-state", "no-order"])
def test_no_token_for_rows_it_cannot_vouch_for(change: str) -> None:
    r = rows()
    if change == "no-etag":
        del r["step-00-s"][ETAG]
    elif change == "empty-etag":
        r["state"][ETAG] = ""
    elif change == "history-row":
        r["history-00000001"] = {"RowKey": "history-00000001", ETAG: 'W/"1"'}
    else:
        del r[change.removeprefix("no-")]
    assert fence.encode(KEYS, OID, r) is None


def test_no_token_longer_than_the_bound() -> None:
    import secrets

    r = rows()
    r["step-00-s"]["Result"] = secrets.token_hex(fence.MAX_FENCE_LENGTH)  # incompressible
    assert fence.encode(KEYS, OID, r) is None


def test_a_token_whose_json_is_too_large_when_inflated_is_refused() -> None:
    packed = zlib.compress(json.dumps({"o": OID, "r": rows(), "pad": "x" * 2_000_000}).encode(), 9)
    token = sealed.seal(KEYS, fence._LABEL, packed)
    assert len(token) <= fence.MAX_FENCE_LENGTH
    with pytest.raises(fence.InvalidFence, match="too large"):
        fence.decode(KEYS, OID, token)


def test_a_token_costs_little_cpu() -> None:
    """About the size of a 3-step order's rows: encode + decode well under a millisecond each
    (measured for the report; asserted only against a generous bound, on CPU time, not wall)."""
    r = rows()
    r["order"]["Items"] = json.dumps([{"sku": f"SKU-{i}", "quantity": 2, "unitPrice": "9.99"} for i in range(5)])
    for i in range(3):
        r[f"step-0{i}-s"] = {"RowKey": f"step-0{i}-s", "Name": "s", "Result": '{"id":"x-1"}', ETAG: 'W/"2"'}
    start = time.process_time()
    for _ in range(200):
        fence.decode(KEYS, OID, fence.encode(KEYS, OID, r) or "")
    assert (time.process_time() - start) / 200 < 0.005


# --------------------------------------------------------------------------- the executor
class EtagDroppingStore(MemoryStore):
    """Returns no ETag for ``drop`` (a part whose ETag header was missing)."""

    def __init__(self, drop: str) -> None:
        super().__init__()
        self.drop = drop

    def transact(self, order_id: str, ops: Sequence[Op]) -> dict[str, str]:
        etags = super().transact(order_id, ops)
        etags.pop(self.drop, None)
        return etags


def _request(order_id: str = OID) -> OutMessage:
    return OutMessage(queue="agent", body={"orderId": order_id, "step": "s"}, message_id="m")


def _seed(store: MemoryStore) -> dict[str, dict[str, Any]]:
    store.transact(OID, [Op("create", {k: v for k, v in e.items() if k != ETAG}) for e in rows().values()])
    return store.read_partition(OID)


def _write_state(read: dict[str, dict[str, Any]]) -> Transact:
    new = {k: v for k, v in read["state"].items() if k not in (ETAG, "PartitionKey")} | {"LeaseKey": "s:2"}
    return Transact(OID, (Op("replace", new, etag=read["state"][ETAG]),))


def test_the_executor_fills_the_etags_the_transaction_returned() -> None:
    store, bus = MemoryStore(), MemoryBus()
    read = _seed(store)
    after = {k: {**v} for k, v in read.items()}
    after["state"]["LeaseKey"] = "s:2"  # what the decision leaves (its ETag still the read one)
    execute([_write_state(read), Send(_request(), fence=after)], store, bus, keys=KEYS)
    [sent] = bus.take("agent")
    assert fence.decode(KEYS, OID, sent.body["fence"]) == store.read_partition(OID)
    assert sent.body["fence"] != fence.encode(KEYS, OID, after)  # not the read ETag of the state row


def test_no_token_when_a_written_row_came_back_without_an_etag() -> None:
    store, bus = EtagDroppingStore("state"), MemoryBus()
    read = _seed(store)
    execute([_write_state(read), Send(_request(), fence=read)], store, bus, keys=KEYS)
    [sent] = bus.take("agent")
    assert "fence" not in sent.body


def test_an_unwritten_row_without_an_etag_back_does_not_matter() -> None:
    store, bus = EtagDroppingStore("order"), MemoryBus()  # order was not written by this run
    read = _seed(store)
    execute([_write_state(read), Send(_request(), fence=read)], store, bus, keys=KEYS)
    [sent] = bus.take("agent")
    assert fence.decode(KEYS, OID, sent.body["fence"]) == store.read_partition(OID)


@pytest.mark.parametrize("case", ["no-transaction", "send-first", "other-order", "lost-race"])
def test_no_token_unless_this_run_committed_the_orders_state_row(case: str) -> None:
    store, bus = MemoryStore(), MemoryBus()
    read = _seed(store)
    send = Send(_request(), fence=read)
    if case == "no-transaction":
        effects: list[Any] = [send]
    elif case == "send-first":
        effects = [send, _write_state(read)]
    elif case == "other-order":
        store.transact(OTHER, [Op("create", {"RowKey": "state"})])
        other = store.read_partition(OTHER)["state"]
        effects = [Transact(OTHER, (Op("replace", {"RowKey": "state", "X": 1}, etag=other[ETAG]),)), send]
    else:
        store.transact(OID, [_write_state(read).ops[0]])  # someone else wrote first
        effects = [_write_state(read), send]
    outcome = execute(effects, store, bus, keys=KEYS)
    sent = bus.take("agent")
    if case == "lost-race":
        assert outcome.lost_race and sent == []
    else:
        assert [s.body.get("fence") for s in sent] == [None]
