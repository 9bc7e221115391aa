"""Function keys on the real local stack, route by route: every HTTP function the app indexes
(tests/indexed.py), called through the local host as Azure calls it.

* Each route has the level the API documents (functions/openapi.yaml, "Authentication"): the
  client's routes FUNCTION, the operator's ADMIN, the OpenAPI document, the console's assets and
  the fallback route's 404/405/OPTIONS answers ANONYMOUS (``EXPECTED``: a new route fails here
  until it is given its level).
* FUNCTION and ADMIN routes: without a key, with a wrong one (in the ``x-functions-key`` header
  or in ``?code=``), 401 with an empty body; the function key passes a FUNCTION route and gets
  401 on an ADMIN one; the master key passes both. ANONYMOUS routes answer without a key (and a
  wrong one changes nothing). ``?code=`` takes a key as the header does.
* stack.json names the keys (``host.keys.master``, ``host.keys.function``) as ``Stack.keys``
  holds them, and a client holding the function key only submits an order and follows it to
  Processed.

"Passes" is "not 401": what the function answers then (404 for the made-up ids, 415 for a POST
without a body, ...) is the other tests' business. No request here starts anything: the ids are
unknown and the POSTs have no body.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from local.host.keys import ADMIN, ANONYMOUS, FUNCTION, KEY_HEADER, KEY_PARAM, level_of, new_key
from local.stack import Stack
from tests.hostile.stackutil import ROUTE_LEVELS
from tests.indexed import indexed_functions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The levels the API documents, by (method, route): the keyed routes as the hostile tests send
# them (tests/hostile/stackutil.py), and the anonymous ones.
FALLBACK = "{*path}"
EXPECTED: dict[tuple[str, str], str] = {
    **{(method, route): level for method, route, level in ROUTE_LEVELS},
    ("GET", "openapi.yaml"): ANONYMOUS,
    ("GET", "console/assets/{name}"): ANONYMOUS,
    **{(method, FALLBACK): ANONYMOUS for method in ("GET", "POST", "DELETE", "HEAD", "PATCH", "PUT", "OPTIONS")},
}
# Plausible values of the route parameters: ids of nothing (32 hex digits), a dead letter that is
# not there, the event order v2 waits for, a file the console serves, a path no route takes.
UNKNOWN_ID = uuid.uuid4().hex
PARAMS = {"id": UNKNOWN_ID, "queue": "scheduler", "sequenceNumber": str(2**63 - 1), "name": "approval",
          "delivery": "hook-00000001",
          "path": "no-such-route"}
PARAMS_BY_ROUTE = {"console/assets/{name}": {"name": "app.js"}}
HOST_STATUS = "/admin/host/status"
ORDER = {"customerId": "c-keys", "currency": "EUR", "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 9.99}],
         "priority": "normal", "statusQueue": None}


def http_routes() -> list[tuple[str, str, str, str]]:
    """(function, method, route, authLevel) of every HTTP-triggered function the app indexes."""
    out = []
    for name, doc in sorted(indexed_functions().items()):
        for b in doc["bindings"]:
            if b.get("type") == "httpTrigger":
                for method in b.get("methods") or ():
                    out.append((name, str(method).upper(), str(b.get("route") or name), level_of(b.get("authLevel"))))
    return out


def fill(route: str) -> str:
    """``route`` with its parameters (``{id}``, ``{id:guid}``, ``{*path}``) given plausible values."""
    values = {**PARAMS, **PARAMS_BY_ROUTE.get(route, {})}

    def value(m: re.Match[str]) -> str:
        name = m.group(1).lstrip("*").split(":")[0].split("=")[0].rstrip("?")
        assert name in values, f"route {route!r}: no value for its parameter {name!r} (add one to PARAMS)"
        return values[name]

    return re.sub(r"\{([^{}]*)\}", value, route)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("keys") / "stack", persistent=False, instances=1,
               settings_overrides={"SupervisorSchedule": "*/5 * * * * *"}) as running:
        yield running


def call(stack: Stack, method: str, route: str, header: str | None = None, code: str | None = None) -> Any:
    """``method`` on ``/api/{route}`` (filled) with ``header`` as the key header and ``code`` as
    ``?code=`` (each only when given); the response."""
    return requests.request(method, f"{stack.api_url}/{fill(route)}", timeout=30,
                            headers={KEY_HEADER: header} if header is not None else {},
                            params={KEY_PARAM: code} if code is not None else None)


def refused(r: Any) -> bool:
    """The host's refusal: 401 with an empty body."""
    return bool(r.status_code == 401 and r.content == b"")


def test_every_http_function_has_its_documented_level() -> None:
    """The app's routes are exactly the documented ones, each with its level: a route given
    another level (an operator's made FUNCTION, a client's made ADMIN or ANONYMOUS) or a new route
    not given one fails here."""
    indexed = {(method, route): level for _, method, route, level in http_routes()}
    wrong = {k: (v, EXPECTED.get(k)) for k, v in indexed.items() if EXPECTED.get(k) != v}
    missing = sorted(set(EXPECTED) - set(indexed))
    assert not wrong and not missing, f"(indexed, documented) by (method, route): {wrong}; not indexed: {missing}"


def test_every_route_takes_the_keys_its_level_takes(stack: Stack) -> None:
    assert stack.keys is not None
    master, function, wrong = stack.keys.master, stack.keys.function, new_key()
    problems: list[str] = []

    def expect(where: str, what: str, r: Any, ok: bool) -> None:
        if not ok:
            problems.append(f"{where} {what}: got {r.status_code} {r.content[:120]!r}")

    routes = http_routes()
    for name, method, route, level in routes:
        where = f"{name} ({method} /api/{fill(route)}, {level})"
        if level == ANONYMOUS:
            for what, kw in (("no key", {}), ("a wrong key", {"header": wrong}), ("a wrong ?code=", {"code": wrong})):
                r = call(stack, method, route, **kw)
                expect(where, f"must answer with {what}", r, r.status_code != 401)
            continue
        for what, kw in (("no key", {}), ("a wrong key", {"header": wrong}), ("a wrong ?code=", {"code": wrong}),
                         ("an empty key", {"header": ""}), ("an empty ?code=", {"code": ""})):
            r = call(stack, method, route, **kw)
            expect(where, f"must refuse {what} (401, empty)", r, refused(r))
        for via in ("header", "code"):
            r = call(stack, method, route, **{via: function})
            if level == FUNCTION:
                expect(where, f"must take the function key ({via})", r, r.status_code != 401)
            else:
                expect(where, f"must refuse the function key ({via}; 401, empty)", r, refused(r))
            r = call(stack, method, route, **{via: master})
            expect(where, f"must take the master key ({via})", r, r.status_code != 401)
    assert not problems, "\n".join(problems)
    # every level was there to check
    assert {level for *_, level in routes} == {ANONYMOUS, FUNCTION, ADMIN}, routes


def test_the_hosts_status_takes_the_master_key_only(stack: Stack) -> None:
    assert stack.keys is not None
    url = f"{stack.base_url}{HOST_STATUS}"
    for headers in ({}, {KEY_HEADER: new_key()}, {KEY_HEADER: stack.keys.function}):
        r = requests.get(url, headers=headers, timeout=30)
        assert refused(r), (headers.keys(), r.status_code, r.content[:200])
    r = requests.get(url, headers=stack.key_headers(ADMIN), timeout=30)
    assert r.status_code == 200 and r.json()["state"] == "Running", (r.status_code, r.content[:200])
    r = requests.get(url, params={KEY_PARAM: stack.keys.master}, timeout=30)
    assert r.status_code == 200, (r.status_code, r.content[:200])


def test_stack_json_names_the_keys(stack: Stack) -> None:
    assert stack.keys is not None
    described = json.loads(stack.stack_json_path.read_text(encoding="utf-8"))
    keys = described["host"]["keys"]
    assert (keys["master"], keys["function"]) == (stack.keys.master, stack.keys.function), keys.keys()
    assert keys["master"] != keys["function"] and all(keys[k] for k in ("master", "function"))
    assert stack.key_headers(ADMIN) == {KEY_HEADER: keys["master"]}
    assert stack.key_headers(FUNCTION) == {KEY_HEADER: keys["function"]}
    assert stack.key_headers(ANONYMOUS) == {}


def test_the_key_in_code_works_like_the_header(stack: Stack) -> None:
    """The same requests with the key in ``?code=`` instead of the header get the same answers
    (the per-route test above does it on made-up ids; here on an order that exists)."""
    assert stack.keys is not None
    keys = stack.keys
    r = requests.post(f"{stack.api_url}/orders", json=ORDER, params={KEY_PARAM: keys.function}, timeout=30)
    assert r.status_code == 202, (r.status_code, r.content[:300])
    oid = r.json()["orderId"]
    reads = [(f"orders/{oid}", FUNCTION), (f"orders/{oid}/history", FUNCTION), (f"console/orders/{oid}", ADMIN),
             (f"console/orders/{oid}/history", ADMIN)]
    for route, level in reads:
        url = f"{stack.api_url}/{route}"
        key = keys.function if level == FUNCTION else keys.master
        by_header = requests.get(url, headers={KEY_HEADER: key}, timeout=30)
        by_code = requests.get(url, params={KEY_PARAM: key}, timeout=30)
        assert (by_header.status_code, by_code.status_code) == (200, 200), (route, by_header.content[:200],
                                                                           by_code.content[:200])
        assert by_header.json()["orderId"] == by_code.json()["orderId"] == oid, route
        assert refused(requests.get(url, params={KEY_PARAM: new_key()}, timeout=30)), route
        if level == ADMIN:
            assert refused(requests.get(url, params={KEY_PARAM: keys.function}, timeout=30)), route
    search = f"{stack.api_url}/orders"
    by_code = requests.get(search, params={"customerId": ORDER["customerId"], KEY_PARAM: keys.master}, timeout=30)
    assert by_code.status_code == 200 and "orders" in by_code.json(), by_code.content[:300]
    assert refused(requests.get(search, params={"customerId": ORDER["customerId"], KEY_PARAM: keys.function},
                                timeout=30))


def test_a_client_with_the_function_key_only_submits_and_follows_an_order(stack: Stack) -> None:
    """A client that holds the function key (and nothing else) posts an order and polls it to
    Processed, its history included; the operator's routes stay shut to it."""
    client = stack.session(FUNCTION)
    assert stack.keys is not None and dict(client.headers)[KEY_HEADER] == stack.keys.function
    r = client.post(f"{stack.api_url}/orders", json=ORDER, timeout=30)
    assert r.status_code == 202, (r.status_code, r.content[:300])
    oid = r.json()["orderId"]
    deadline = time.monotonic() + 90
    while True:
        r = client.get(f"{stack.api_url}/orders/{oid}", timeout=30)
        assert r.status_code == 200, (r.status_code, r.content[:300])
        view = r.json()
        if view["processState"] == "Processed" or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert view["processState"] == "Processed", view
    r = client.get(f"{stack.api_url}/orders/{oid}/history", timeout=30)
    assert r.status_code == 200 and r.json()["orderId"] == oid, (r.status_code, r.content[:300])
    for method, route in (("GET", f"console/orders/{oid}"), ("POST", f"orders/{oid}/retry"), ("GET", "orders")):
        assert refused(client.request(method, f"{stack.api_url}/{route}", timeout=30)), route
