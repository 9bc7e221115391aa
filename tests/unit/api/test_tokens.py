"""Continuation tokens (``shared.api.tokens``) and how the search and history endpoints refuse a
token they did not issue for the query: 400 ``invalid-continuation-token``, before any read."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from shared.api.http import HttpResult
from shared.api.orders import get_history
from shared.api.search import SearchQuery, parse_query
from shared.api.tokens import MAX_TOKEN_LENGTH, InvalidToken, issue, redeem
from shared.core import sealed
from shared.core.statemachine import Category
from tests.unit.api.test_search import Agents, LossyRuntime, all_pages, bad, make, new_order, ok, probe, search
from tests.unit.harness import TEST_KEYS as KEYS

SCOPE = "orders-scope"
POSITION = {"k": "all-99999999999999999-0123456789abcdef0123456789abcdef"}


def _bytes(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def _text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


# ---------------------------------------------------------------------------------------------
# The token itself
def test_round_trip_is_opaque_url_safe_text() -> None:
    token = issue(KEYS, SCOPE, POSITION)
    assert redeem(KEYS, SCOPE, token) == POSITION
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert "all-" not in token and "=" not in token
    assert issue(KEYS, SCOPE, POSITION) == token  # deterministic: the same page gives the same token


def test_a_token_is_bound_to_its_scope() -> None:
    token = issue(KEYS, SCOPE, POSITION)
    for other in ("", "orders-scop", SCOPE + " ", SCOPE.upper(), "history:" + SCOPE):
        with pytest.raises(InvalidToken):
            redeem(KEYS, other, token)


def test_every_bit_flip_of_the_content_is_refused() -> None:
    raw = _bytes(issue(KEYS, SCOPE, POSITION))
    for i in range(len(raw)):
        for bit in range(8):
            flipped = raw[:i] + bytes([raw[i] ^ (1 << bit)]) + raw[i + 1:]
            with pytest.raises(InvalidToken):
                redeem(KEYS, SCOPE, _text(flipped))


def test_truncated_or_extended_tokens_are_refused() -> None:
    token = issue(KEYS, SCOPE, POSITION)
    raw = _bytes(token)
    for n in range(len(token)):
        with pytest.raises(InvalidToken):
            redeem(KEYS, SCOPE, token[:n])
    for n in range(len(raw)):
        with pytest.raises(InvalidToken):
            redeem(KEYS, SCOPE, _text(raw[:n]))
    for extra in (b"\x00", b" ", b"}", b"A" * 40):
        with pytest.raises(InvalidToken):
            redeem(KEYS, SCOPE, _text(raw + extra))


@pytest.mark.parametrize("token", ["", "=", "====", "A", "AA", "!!!!", " ", "\n", "null", "{}", "\u00e9" * 40,
                                   "\U0001f600", "A" * (MAX_TOKEN_LENGTH + 1), "A" * 10**6])
def test_malformed_tokens_are_refused(token: str) -> None:
    with pytest.raises(InvalidToken):
        redeem(KEYS, SCOPE, token)


def test_a_mac_over_something_other_than_an_object_is_refused() -> None:
    # a token built with the app's key but holding a JSON list: still not a position
    from shared.api.tokens import _label

    with pytest.raises(InvalidToken):
        redeem(KEYS, SCOPE, sealed.seal(KEYS, _label(SCOPE), b"[1,2]"))


def test_a_token_in_another_spelling_of_the_same_bytes_is_refused() -> None:
    """BUG (shared/api/tokens.py ``redeem``): ``base64.urlsafe_b64decode`` is lenient: it accepts
    '=' padding the issuer never writes, '+' and '/' for '-' and '_', and ignores the unused low
    bits of the last character, so several strings that are not the issued token decode to it
    and are accepted (no harm to the content, which the MAC covers, but a token that was changed
    is not refused as the contract says). A strict decode (``validate=True``) plus a check that
    re-encoding gives back the token would refuse them."""
    token = issue(KEYS, SCOPE, {"k": "all-123"})  # 42 characters: the last one has 4 unused bits
    assert len(token) % 4 == 2
    spellings = {token + "=", token + "==", token + "====", token[:-1] + chr(ord(token[-1]) ^ 1)}
    if "-" in token or "_" in token:
        spellings.add(token.replace("-", "+").replace("_", "/"))
    accepted = []
    for spelling in spellings - {token}:
        try:
            redeem(KEYS, SCOPE, spelling)
            accepted.append(spelling)
        except InvalidToken:
            pass
    assert accepted == []


def test_a_token_by_the_previous_key_is_redeemed_until_that_key_is_dropped() -> None:
    """Two-key rotation: new tokens are by the current key; one by the previous key still pages."""
    old, new, stranger = b"o" * 32, b"n" * 32, b"s" * 32
    token = issue(sealed.Keys(old), SCOPE, POSITION)
    rotated = sealed.Keys(current=new, previous=old)
    assert redeem(rotated, SCOPE, token) == POSITION
    assert issue(rotated, SCOPE, POSITION) == issue(sealed.Keys(new), SCOPE, POSITION) != token
    for keys in (sealed.Keys(new), sealed.Keys(stranger, previous=new), sealed.Keys(stranger)):
        with pytest.raises(InvalidToken, match="not issued for this query"):  # as a changed token
            redeem(keys, SCOPE, token)


def test_every_single_character_change_is_refused() -> None:
    """Fails with the bug above: changing the last character's unused bits is accepted."""
    token = issue(KEYS, SCOPE, POSITION)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    accepted = []
    for i, c in enumerate(token):
        for other in alphabet + "=+/!.~ ":
            if other != c:
                try:
                    redeem(KEYS, SCOPE, token[:i] + other + token[i + 1:])
                    accepted.append((i, other))
                except InvalidToken:
                    pass
    assert accepted == []


# ---------------------------------------------------------------------------------------------
# Through the endpoints
@pytest.fixture(scope="module")
def orders() -> tuple[LossyRuntime, list[str]]:
    """12 orders, newest last: 6 processed, 6 held (attention)."""
    rt = make()
    agents = Agents(rt)
    made = []
    for i in range(12):
        rt.clock.advance(1)
        made.append(new_order(rt, agents, "processed" if i % 2 else "held", customer=f"c-{i % 2}"))
    return rt, made


def _token(rt: LossyRuntime, **params: Any) -> str:
    body = ok(rt, **params)
    assert body["continuationToken"] is not None
    return str(body["continuationToken"])


def _refused(rt: LossyRuntime, token: str, **params: Any) -> None:
    store = probe(rt)
    store.reset_counts()
    bad(search(rt, continuationToken=token, **params), "continuationToken", "invalid-continuation-token")
    assert store.reads == []  # refused before anything reads the store


def test_tampered_search_tokens_are_400_before_any_read(orders: Any) -> None:
    rt, _made = orders
    token = _token(rt, limit=3)
    raw = _bytes(token)
    tampered = [
        _text(raw[:-1] + bytes([raw[-1] ^ 1])),  # a bit of the position
        _text(bytes([raw[0] ^ 0x80]) + raw[1:]),  # a bit of the MAC
        token[:-1], token[:-2], token[: len(token) // 2], token[1:],  # truncated
        token + "A", token + "AAAA", "AAAA" + token,  # extended
        "", " ", token + "\u00e9", "\u00e9" + token[1:], "\U0001f600", "A" * 100_000, "A" * (MAX_TOKEN_LENGTH + 4),
        token.upper(), token.lower(), token[::-1],
        base64.urlsafe_b64encode(json.dumps({"k": "all-"}).encode()).decode(),  # a forged position, no MAC
    ]
    for t in tampered:
        if t != token:
            _refused(rt, t, limit=3)


def test_a_token_of_another_query_is_400(orders: Any) -> None:
    rt, _made = orders
    everything = _token(rt, limit=2)
    of_attention = _token(rt, state="attention", limit=2)
    of_customer = _token(rt, customerId="c-0", limit=2)
    dated = _token(rt, createdFrom="2026-11-22", limit=2)
    _refused(rt, everything, state="attention", limit=2)
    _refused(rt, of_attention, limit=2)
    _refused(rt, of_attention, state="processed", limit=2)
    _refused(rt, of_customer, customerId="c-1", limit=2)
    _refused(rt, of_customer, customerId="c-0", state="attention", limit=2)
    _refused(rt, dated, limit=2)
    _refused(rt, dated, createdFrom="2026-11-21", limit=2)
    _refused(rt, everything, createdTo="2026-11-23", limit=2)


def test_history_and_search_tokens_do_not_cross(orders: Any) -> None:
    rt, made = orders
    oid, other = made[0], made[1]
    page = get_history(rt, oid, {"limit": "1"})
    assert page.status == 200
    history_token = page.body["continuationToken"]
    assert history_token
    _refused(rt, history_token)
    _refused(rt, history_token, limit=1)
    search_token = _token(rt, limit=1)
    for token, order in ((search_token, oid), (history_token, other)):
        store = probe(rt)
        store.reset_counts()
        r = get_history(rt, order, {"continuationToken": token})
        bad(r, "continuationToken", "invalid-continuation-token")
        assert store.reads == []
    assert get_history(rt, oid, {"continuationToken": history_token}).status == 200


def test_after_a_rotation_a_token_of_the_previous_key_pages_and_an_unknown_key_is_400(orders: Any) -> None:
    rt, made = orders
    first = ok(rt, limit=3)  # by the tests' key
    try:
        rt.keys = sealed.Keys(current=b"n" * 32, previous=KEYS.current)
        second = ok(rt, limit=3, continuationToken=first["continuationToken"])
        assert [o["orderId"] for o in second["orders"]] == list(reversed(made))[3:6]
        assert redeem(sealed.Keys(b"n" * 32), parse_query({}).scope, second["continuationToken"])  # by the new key
        rt.keys = sealed.Keys(current=b"n" * 32)  # the previous key dropped
        _refused(rt, first["continuationToken"], limit=3)
        assert ok(rt, limit=3, continuationToken=second["continuationToken"])["orders"] != []
    finally:
        rt.keys = KEYS


def test_a_forged_position_outside_the_query_range_is_400(orders: Any) -> None:
    """Whoever holds the key (TokenKeys) can forge a token: it still only pages within its query."""
    rt, _made = orders
    query = parse_query({"state": "attention"})
    assert isinstance(query, SearchQuery) and query.category is Category.ATTENTION
    for position in ({"k": "all-0"}, {"k": "cat-processed-0"}, {"k": "cat-attention."}, {"k": "fin-"},
                     {"k": 5}, {"k": None}, {"k": ["cat-attention-0"]}, {}, {"after": 1}):
        _refused(rt, issue(KEYS, query.scope, position), state="attention")
    low, _high = query.key_range()
    r = search(rt, state="attention", continuationToken=issue(KEYS, query.scope, {"k": low}))
    assert r.status == 200 and len(r.body["orders"]) == 6  # a position in range is only a position


def test_a_valid_token_works_with_another_limit(orders: Any) -> None:
    rt, made = orders
    newest_first = list(reversed(made))
    first = ok(rt, limit=3)
    assert [o["orderId"] for o in first["orders"]] == newest_first[:3]
    second = ok(rt, limit=7, continuationToken=first["continuationToken"])
    assert [o["orderId"] for o in second["orders"]] == newest_first[3:10]
    third = ok(rt, limit=200, continuationToken=second["continuationToken"])
    assert [o["orderId"] for o in third["orders"]] == newest_first[10:]
    assert third["continuationToken"] is None
    # the same token twice gives the same page (tokens are positions, not cursors)
    again = ok(rt, limit=7, continuationToken=first["continuationToken"])
    assert again["orders"] == second["orders"]


def test_a_token_survives_new_orders_and_misses_nothing_older(orders: Any) -> None:
    rt, made = orders
    first = ok(rt, limit=4)
    rt.clock.advance(60)
    newer = new_order(rt, Agents(rt), "processed", customer="c-0")  # newer than every listed order
    try:
        rest = ok(rt, limit=200, continuationToken=first["continuationToken"])
        listed = [o["orderId"] for o in first["orders"] + rest["orders"]]
        assert listed == list(reversed(made))  # the new order is on a new first page, not here
        assert [o["orderId"] for o in ok(rt, limit=1)["orders"]] == [newer]
    finally:
        made.append(newer)


def test_tokens_page_every_filter_to_the_end(orders: Any) -> None:
    rt, made = orders
    for params in ({}, {"state": "attention"}, {"customerId": "c-1"}, {"customerId": "c-0", "state": "attention"}):
        pages = all_pages(rt, limit=1, **params)
        ids = [o["orderId"] for p in pages for o in p]
        assert len(ids) == len(set(ids)), params


def test_history_limit_and_token_errors() -> None:
    rt = make()
    oid = new_order(rt, Agents(rt), "processed")
    for limit in ("0", "-1", "1001", "abc", " 5", "", "1e3", "10000000000"):
        r: HttpResult = get_history(rt, oid, {"limit": limit})
        bad(r, "limit")
    events = get_history(rt, oid, {"limit": "1000"}).body["history"]
    pages, token = [], None
    while True:
        body = get_history(rt, oid, {"limit": "2", **({"continuationToken": token} if token else {})}).body
        pages.append(body["history"])
        token = body["continuationToken"]
        if token is None:
            break
    assert [e for p in pages for e in p] == events and len(pages) == (len(events) + 1) // 2
    for unknown in ("after", "Limit", "from", "$top", "state"):
        detail = bad(get_history(rt, oid, {"limit": "2", unknown: "1"}), unknown)
        assert "limit, continuationToken" in detail
    assert get_history(rt, oid, {"limit": "2", "code": "x"}).status == 200  # the function key
    forged = issue(KEYS, f"history:{oid}", {"after": -1})
    bad(get_history(rt, oid, {"continuationToken": forged}), "continuationToken", "invalid-continuation-token")
    not_a_number = issue(KEYS, f"history:{oid}", {"after": True})
    bad(get_history(rt, oid, {"continuationToken": not_a_number}), "continuationToken", "invalid-continuation-token")
