"""shared.api.routes: matching a path under the route prefix against the app's route table, and
the answer to a request no function took (404, 405 with Allow, 204 to OPTIONS)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.api.http import PROBLEM, PROBLEM_BASE
from shared.api.routes import DOCUMENT, SHOWN_PATH_CHARS, RouteTable, UnsupportedTemplate, compile_route, path_segments


def _fn(route: str | None, methods: list[str] | None, trigger: str = "httpTrigger") -> dict[str, Any]:
    binding: dict[str, Any] = {"type": trigger, "direction": "in", "name": "req"}
    if route is not None:
        binding["route"] = route
    if methods is not None:
        binding["methods"] = methods
    return {"scriptFile": "function_app.py", "bindings": [binding, {"type": "http", "direction": "out"}]}


TABLE = RouteTable.of_functions([
    ("submit_order", _fn("orders", ["POST"])),
    ("search_orders", _fn("orders", ["GET"])),
    ("get_order", _fn("orders/{id}", ["GET"])),
    ("order_history", _fn("orders/{id}/history", ["GET"])),
    ("retry_order", _fn("orders/{id}/retry", ["POST"])),
    ("openapi", _fn("openapi.yaml", ["GET"])),
    ("console_asset", _fn("console/assets/{name}", ["GET"])),
    ("scheduler", _fn(None, None, trigger="serviceBusTrigger")),
])


def _answer(method: str, path: str) -> Any:
    return TABLE.answer(method, path, "/api/" + path)


def test_path_segments() -> None:
    assert path_segments("") == () and path_segments("/") == ()
    assert path_segments("orders") == ("orders",)
    assert path_segments("/orders/") == ("orders",)  # one leading and one trailing / are ignored
    assert path_segments("orders//") == ("orders", "")
    assert path_segments("orders//history") == ("orders", "", "history")


def test_only_http_functions_make_routes_and_a_route_left_out_is_the_function_name() -> None:
    table = RouteTable.of_functions([("ping", _fn(None, ["GET"])), ("timer", _fn(None, None, "timerTrigger"))])
    assert [(r.function, r.template, r.methods) for r in table.routes] == [("ping", "ping", frozenset({"GET"}))]
    assert [r.function for r in TABLE.routes if r.function == "scheduler"] == []


@pytest.mark.parametrize("path,allowed", [
    ("orders", {"GET", "POST"}),
    ("ORDERS", {"GET", "POST"}),  # literal segments are case-insensitive, as ASP.NET Core's
    ("orders/", {"GET", "POST"}),
    ("orders/abc", {"GET"}),
    ("orders/abc/", {"GET"}),
    ("orders/abc/History", {"GET"}),
    ("orders/abc/retry", {"POST"}),
    ("openapi.yaml", {"GET"}),
    ("console/assets/app.js", {"GET"}),
    ("order", set()),
    ("orders//history", set()),  # a parameter is never empty
    ("orders/abc/history/more", set()),
    ("orders/a/b", set()),
    ("console/assets", set()),
    ("", set()),
    ("openapi", set()),
])
def test_allowed_methods_of_a_path(path: str, allowed: set[str]) -> None:
    assert TABLE.allowed(path) == allowed


def test_no_route_is_404_problem_naming_the_path_and_the_document() -> None:
    r = _answer("GET", "order")
    assert (r.status, r.content_type) == (404, PROBLEM)
    assert r.body["type"] == PROBLEM_BASE + "no-route" and r.body["status"] == 404 and r.body["title"]
    assert "/api/order;" in r.body["detail"] and DOCUMENT in r.body["detail"]
    assert "Allow" not in r.headers
    for method in ("POST", "DELETE", "OPTIONS", "HEAD"):
        assert _answer(method, "nowhere/at/all").status == 404


@pytest.mark.parametrize("method,path,allow", [
    ("PUT", "orders", "GET, POST"),
    ("DELETE", "orders", "GET, POST"),
    ("DELETE", "orders/abc", "GET"),
    ("POST", "orders/abc/history", "GET"),
    ("GET", "orders/abc/retry", "POST"),
    ("patch", "openapi.yaml", "GET"),
])
def test_a_method_the_route_does_not_take_is_405_with_allow(method: str, path: str, allow: str) -> None:
    r = _answer(method, path)
    assert (r.status, r.content_type, r.headers) == (405, PROBLEM, {"Allow": allow})
    assert r.body["type"] == PROBLEM_BASE + "method-not-allowed" and r.body["status"] == 405
    assert r.body["detail"].startswith(f"{method.upper()} is not allowed on /api/{path}; it takes {allow} ")


def test_head_on_a_get_route_is_405_as_the_host_compares_methods_exactly() -> None:
    r = _answer("HEAD", "openapi.yaml")
    assert (r.status, r.headers) == (405, {"Allow": "GET"})


def test_options_on_a_route_is_204_with_allow() -> None:
    r = _answer("OPTIONS", "orders")
    assert (r.status, r.body, r.headers, r.encoded()) == (204, None, {"Allow": "GET, POST"}, b"")
    assert _answer("OPTIONS", "orders/abc/retry").headers == {"Allow": "POST"}


def test_a_method_a_route_takes_is_a_500_naming_the_function_it_should_have_reached() -> None:
    # The fallback only sees it when the host's route order put the fallback first.
    r = _answer("GET", "orders/abc")
    assert (r.status, r.content_type) == (500, PROBLEM)
    assert r.body["type"] == PROBLEM_BASE + "route-shadowed" and "get_order" in r.body["detail"]


def test_a_long_path_is_cut_in_the_detail() -> None:
    shown = "/api/" + "x" * 5000
    r = TABLE.answer("GET", "x" * 5000, shown)
    assert r.status == 404 and shown[:SHOWN_PATH_CHARS] + "…" in r.body["detail"] and len(r.body["detail"]) < 400


@pytest.mark.parametrize("template", ["orders/{id:int}", "orders/{id?}", "files/{*rest}", "img/{name}.{ext}",
                                      "a//b", "a/{}", "a/{1x}"])
def test_a_template_it_cannot_match_exactly_is_refused(template: str) -> None:
    with pytest.raises(UnsupportedTemplate, match="neither a literal nor a plain"):
        compile_route("f", template, ["GET"])


def test_a_route_of_every_method_is_refused() -> None:
    with pytest.raises(UnsupportedTemplate, match="names no method"):
        RouteTable.of_functions([("any", _fn("any", None))])
