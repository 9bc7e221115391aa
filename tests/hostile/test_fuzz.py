"""Generated requests (schemathesis, from functions/openapi.yaml) against the app on the local
host: 0 responses are 5xx, every 4xx is application/problem+json, no row is written for a
rejected request, every response conforms to the document, every search answers only what
its filters ask for, and no tampered continuation token is accepted.

FUZZ_REQUESTS sets the count (default 300, CI-sized); the 10,000-request run is
``python -m tests.hostile.fuzz --requests 10000`` (writes bench/results/fuzz.json).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from tests.hostile import fuzz
from tests.hostile.stackutil import raw_request, route_level

FUZZ_REQUESTS = int(os.environ.get("FUZZ_REQUESTS", "300"))
FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "0"))


@pytest.mark.integration
def test_generated_requests(hostile_stack: Any, tables: Any) -> None:
    report = fuzz.run(hostile_stack.base_url, tables, FUZZ_REQUESTS, FUZZ_SEED, keys=hostile_stack.keys)
    j = report.as_json()
    print(fuzz.summary(j))
    assert report.requests >= FUZZ_REQUESTS
    # The run must have exercised both sides: accepted orders and each kind of rejection.
    assert j["acceptedOrders"] > 0, j["byStatus"]
    assert {"400", "404"} <= set(j["byStatus"]), j["byStatus"]
    # ... and the query endpoints: searches that found orders, tokens sent back, hostile values.
    ops = j["byOperation"]
    for op in ("GET /orders 200", "GET /orders 400", "GET /orders/{id}/history 200", "GET /orders/{id}/history 400",
               "GET /deadletters 200", "GET /deadletters 400", "GET /console/assets/{name} 404"):
        assert ops.get(op), (op, ops)
    assert any(k.startswith("POST /orders/{id}/terminate ") for k in ops), ops
    # ... and the events route on real orders (202 taken or a copy, 409 refused by the order's state).
    events = {k.rsplit(" ", 1)[1] for k in ops if k.startswith("POST /orders/{id}/events/{name} ")}
    assert {"400", "404"} <= events and events & {"202", "409"}, (events, ops)
    assert j["search"]["orders"] > 0 and j["hostileQueries"], (j["search"], j["hostileQueries"])
    assert report.violations() == []
    assert j["5xx"] == 0 and j["problemJson"]["nonCompliant"] == 0
    assert j["rows"]["rowsOfRejected"] == 0 and j["rows"]["deadlineRowsOfRejected"] == 0
    assert j["rows"]["indexRowsOfRejected"] == 0 and j["rows"]["acceptedNotIndexed"] == 0
    assert j["search"]["filterViolations"] == 0 and j["continuationTokens"]["tamperedAccepted"] == 0
    assert j["rows"]["newStateRows"] == j["rows"]["expectedNewStateRows"]


@pytest.mark.integration
def test_the_fuzz_checks_catch_a_wrong_app(hostile_stack: Any, tables: Any) -> None:
    """The same checks over a wrong server: a 5xx, a plain-text 4xx and a row written for a
    rejected request are each reported (so the green run above means something)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    stray = "f" * 32
    wrote: list[bool] = []

    class Wrong(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(n)
            if self.command == "POST" and not wrote:
                wrote.append(True)  # "rejects" the request but writes a row, once
                tables.state.upsert_entity({"PartitionKey": stray, "RowKey": "order"})
                self.send_response(400)
                body = b"bad request"
                self.send_header("Content-Type", "text/plain")
            elif self.command == "POST":
                self.send_response(500)
                body = b""
            else:
                self.send_response(404)
                body = b"not found"
                self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815

    server = ThreadingHTTPServer(("127.0.0.1", 0), Wrong)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        before = tables.snapshot()
        report = fuzz.FuzzReport()
        fuzz.send_generated(f"http://127.0.0.1:{server.server_address[1]}", 30, report, include_openapi=False)
        fuzz.check_rows(tables, before, report)
    finally:
        server.shutdown()
        server.server_close()
        tables.state.delete_entity(partition_key=stray, row_key="order")
    j = report.as_json()
    assert j["5xx"] > 0
    assert j["problemJson"]["nonCompliant"] > 0
    assert j["rows"]["rowsOfRejected"] == 1
    assert report.conformance_failures > 0
    assert len(report.violations()) >= 3


@pytest.mark.integration
def test_openapi_document_is_served(hostile_stack: Any) -> None:
    """GET /api/openapi.yaml serves functions/openapi.yaml as application/yaml, anonymously."""
    import yaml

    assert fuzz.function_app_registers_openapi(), "function_app.py must register functions.openapi.bp"
    r = raw_request(hostile_stack.base_url, "GET", "/api/openapi.yaml")
    assert r.status == 200
    assert r.content_type.split(";")[0] == "application/yaml"
    assert r.body == fuzz.SPEC_PATH.read_bytes()
    doc = yaml.safe_load(r.body)
    assert doc["openapi"].startswith("3.1")
    paths = {"/orders", "/orders/{id}", "/orders/{id}/history", "/orders/{id}/retry", "/orders/{id}/cancel",
             "/orders/{id}/terminate", "/orders/{id}/events/{name}", "/openapi.yaml"}
    assert paths <= set(doc["paths"])


def test_openapi_blueprint_in_process() -> None:
    """functions/openapi.py's function returns the document (independent of registration)."""
    import azure.functions as func

    from functions import openapi

    names = [f.get_function_name() for f in openapi.bp.get_functions()] if hasattr(openapi.bp, "get_functions") \
        else None
    resp = openapi.openapi(func.HttpRequest("GET", "http://localhost/api/openapi.yaml", body=b""))
    assert resp.status_code == 200
    assert resp.mimetype == "application/yaml"
    assert resp.get_body() == fuzz.SPEC_PATH.read_bytes()
    if names is not None:
        assert names == ["openapi"]


def test_openapi_document_is_valid() -> None:
    """The document loads as OpenAPI 3.1 and its examples validate against its own schemas."""
    import schemathesis
    import yaml

    raw = yaml.safe_load(fuzz.SPEC_PATH.read_text(encoding="utf-8"))
    assert raw["openapi"] == "3.1.0"
    schema = schemathesis.openapi.from_path(str(fuzz.SPEC_PATH))
    ops = {(r.ok().method.upper(), r.ok().path) for r in schema.get_all_operations()}
    assert ops == {("POST", "/orders"), ("GET", "/orders"), ("GET", "/orders/{id}"), ("GET", "/orders/{id}/history"),
                   ("POST", "/orders/{id}/retry"), ("POST", "/orders/{id}/cancel"),
                   ("POST", "/orders/{id}/terminate"), ("POST", "/orders/{id}/suspend"),
                   ("POST", "/orders/{id}/resume"), ("POST", "/orders/{id}/events/{name}"),
                   ("GET", "/openapi.yaml"), ("GET", "/console"),
                   ("GET", "/console/assets/{name}"), ("GET", "/overview"), ("GET", "/deadletters"),
                   ("GET", "/console/orders/{id}"), ("GET", "/console/orders/{id}/history"),
                   ("GET", "/console/caller"),
                   ("POST", "/deadletters/{queue}/{sequenceNumber}/resubmit"),
                   ("POST", "/deadletters/{queue}/{sequenceNumber}/discard"),
                   ("GET", "/workflows"), ("POST", "/operations"), ("GET", "/operations/{id}"),
                   ("GET", "/webhooks"), ("POST", "/orders/{id}/webhooks/{delivery}/resend")}
    post = raw["paths"]["/orders"]["post"]
    assert {"202", "400", "409", "413", "415", "422"} <= set(post["responses"])
    for path in ("/orders/{id}/retry", "/orders/{id}/cancel", "/orders/{id}/terminate", "/orders/{id}/suspend",
                 "/orders/{id}/resume"):
        assert {"202", "400", "404", "409"} <= set(raw["paths"][path]["post"]["responses"])
    events = raw["paths"]["/orders/{id}/events/{name}"]["post"]
    assert events["operationId"] == "sendEvent" and events["requestBody"]["required"] is True
    assert {"202", "400", "404", "409", "413", "415"} <= set(events["responses"])
    assert {p["name"] for p in events["parameters"] if "name" in p} >= {"name", "Idempotency-Key"}
    assert {"200", "400"} <= set(raw["paths"]["/orders"]["get"]["responses"])
    assert {"200", "400", "404"} <= set(raw["paths"]["/orders/{id}/history"]["get"]["responses"])
    assert raw["paths"]["/openapi.yaml"]["get"]["security"] == []
    schemes = raw["components"]["securitySchemes"]
    assert {(s["in"], s["name"]) for s in schemes.values()} == {("query", "code"), ("header", "x-functions-key")}


def test_each_generated_request_carries_the_key_its_route_takes() -> None:
    """The key the fuzz gives an operation, by the document's security, is the one its route takes
    (tests/hostile/stackutil.ROUTE_LEVELS, which tests/e2e/test_keys.py holds the app to); a
    generated key header gives way to it, a generated ``code`` stays (the header comes first)."""
    import re

    import schemathesis

    from local.host.keys import ANONYMOUS, HostKeys

    schema = schemathesis.openapi.from_path(str(fuzz.SPEC_PATH))
    levels = set()
    for result in schema.get_all_operations():
        op = result.ok()
        path = "/api" + re.sub(r"\{[^{}]*\}", "x", op.path)
        levels.add(fuzz.operation_level(op))
        assert fuzz.operation_level(op) == route_level(op.method.upper(), path), (op.method, op.path)
    assert levels == {"anonymous", "function", "admin"}
    keys = HostKeys("m" * 54, {"default": "f" * 54})
    for op_path, method, key in (("/orders", "post", "f" * 54), ("/orders", "get", "m" * 54),
                                 ("/openapi.yaml", "get", "junk")):
        op = schema[op_path][method]
        case = SimpleNamespace(operation=op, headers={"X-Functions-Key": "junk", "Idempotency-Key": "k"},
                               query={"code": "junk"})
        fuzz.with_key(case, keys)
        if fuzz.operation_level(op) == ANONYMOUS:
            assert case.headers == {"X-Functions-Key": "junk", "Idempotency-Key": "k"}
        else:
            assert case.headers == {"x-functions-key": key, "Idempotency-Key": "k"}, case.headers
        assert case.query == {"code": "junk"}


def _steer(**kw: Any) -> fuzz.Steer:
    fields: dict[str, Any] = dict(use_known=False, known_index=0, reuse_key=False, key_index=0, token_mode=5,
                                  token_index=0, tamper_how=0, known_customer=False, customer_index=0, plain=False,
                                  small_limit=0, hostile=False, hostile_param=0, hostile_value=0, big_order=False,
                                  awaited_event=False, decision=3)
    return fuzz.Steer(**{**fields, **kw})


def _search(query: dict[str, str]) -> Any:
    return SimpleNamespace(method="GET", path="/orders", query=dict(query), path_parameters=None, headers=None,
                           body=None)


def test_plain_searches_find_accepted_orders_whatever_the_timing() -> None:
    """A plain search asks for what an accepted order has and keeps whatever it runs: its
    customer (or every customer's) and workflow, no state (a category changes as the order
    runs: a search by the state it had a moment ago finds nothing on a loaded machine), no
    dates, no failed step, no token. The seeded run's searches that get a 200 are plain ones."""
    report = fuzz.FuzzReport()
    report.accepted = {"f" * 32: {"customerId": "big", "workflow": "digital"}, "0" * 32: {"customerId": "c-1"}}
    generated = {"state": "processed", "customerId": "0", "workflow": "x1", "failedStep": "y", "limit": "7",
                 "createdFrom": "2020-01-01", "createdTo": "2021-01-01", "continuationToken": "junk"}
    case = _search(generated)
    fuzz.Steer.apply(_steer(plain=True, known_customer=True, customer_index=0), case, report)
    assert case.query == {"customerId": "big", "workflow": "digital", "limit": "7"}
    case = _search(generated)
    fuzz.Steer.apply(_steer(plain=True, known_customer=True, customer_index=1), case, report)
    assert case.query == {"customerId": "c-1", "workflow": "order", "limit": "7"}
    case = _search(generated)
    fuzz.Steer.apply(_steer(plain=True), case, report)  # no known customer: every customer's orders
    assert case.query == {"workflow": "order", "limit": "7"}
    case = _search(generated)  # not plain: the generated filters stay (state included)
    fuzz.Steer.apply(_steer(known_customer=True), case, report)
    assert {k: v for k, v in case.query.items() if k != "customerId"} == \
        {k: v for k, v in generated.items() if k != "customerId"} and case.query["customerId"] == "big"


def test_steering_picks_orders_by_acceptance_not_by_their_random_ids() -> None:
    """The same draws pick the same order (its customer, its id, the order that waits) on every
    run of a seed: the n-th accepted, not the n-th of ids that are random (uuid4) each run."""
    bodies = [{"customerId": "small", "items": [{"quantity": 1, "unitPrice": "1"}]},
              {"customerId": "big", "items": [{"quantity": 1, "unitPrice": "1001"}]},
              {"customerId": "other", "items": [{"quantity": 2, "unitPrice": "1001"}]}]
    picks = set()
    for ids in (["a" * 32, "b" * 32, "c" * 32], ["c" * 32, "a" * 32, "b" * 32], ["b" * 32, "c" * 32, "a" * 32]):
        report = fuzz.FuzzReport()
        report.accepted = dict(zip(ids, bodies, strict=True))
        search = _search({})
        fuzz.Steer.apply(_steer(known_customer=True, customer_index=4), search, report)
        read = SimpleNamespace(method="GET", path="/orders/{id}", query=None, path_parameters={"id": "x"},
                               headers=None, body=None)
        fuzz.Steer.apply(_steer(use_known=True, known_index=5), read, report)
        waiting = report.waiting_orders()
        picks.add((search.query["customerId"], ids.index(read.path_parameters["id"]),
                   tuple(ids.index(o) for o in waiting)))
    assert picks == {("big", 2, (1, 2))}
