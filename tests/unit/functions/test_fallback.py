"""functions/fallback.py: the fallback route of the app as function_app.py registers it. It knows
every route the app registers, it is reached only by what no other function takes, on the local
host (most specific route first) and on the Azure Functions host (routes in the order of their
functions' names, first match), and it answers problem+json."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import azure.functions as func
import pytest

from functions import fallback
from local.host.routes import Route, RouteTable, compile_route
from shared.api.http import PROBLEM
from tests.indexed import indexed_functions

Handler = Callable[[func.HttpRequest], func.HttpResponse]


def _trigger(fn: dict[str, Any]) -> dict[str, Any] | None:
    return next((b for b in fn["bindings"] if b["type"] == "httpTrigger"), None)


def _http_functions() -> dict[str, dict[str, Any]]:
    """Name -> httpTrigger binding of every HTTP function the app indexes, the fallback's too."""
    return {name: t for name, fn in indexed_functions().items() if (t := _trigger(fn)) is not None}


def _app_fallback() -> Handler:
    """The fallback function of the app function_app.py builds (the blueprint it registers)."""
    indexed_functions()  # imports function_app with the settings it needs
    import function_app

    probe = func.FunctionApp(http_auth_level=function_app.app.auth_level)
    probe.register_functions(function_app.unmatched_routes)
    (fn,) = probe.get_functions()
    assert fn.get_function_name() == fallback.NAME
    handler: Handler = fn.get_user_function()
    return handler


def _call(handler: Handler, method: str, rest: str) -> func.HttpResponse:
    req = func.HttpRequest(method, f"https://app.example/api/{rest}", body=b"", route_params={"path": rest})
    return handler(req)


def _sample_path(template: str) -> str:
    return re.sub(r"\{[^}]*\}", "x1", template)


def test_the_fallback_is_registered_anonymous_on_every_method() -> None:
    trigger = _http_functions()[fallback.NAME]
    assert trigger["route"] == "{*path}" and trigger["authLevel"] == "ANONYMOUS"
    assert sorted(trigger["methods"]) == sorted(m.value for m in func.HttpMethod)


def test_the_fallback_knows_every_route_the_app_registers() -> None:
    """For each route, every method it does not take is a 405 whose Allow lists the methods of
    every route of that path (computed here with the local host's matcher, not the app's)."""
    handler = _app_fallback()
    routes = {name: compile_route(t["route"], "", methods=t["methods"]) for name, t in _http_functions().items()
              if name != fallback.NAME}
    assert len(routes) >= 13
    for name, route in routes.items():
        path = _sample_path(route.template)
        matching = [r for r in routes.values() if r.match("/" + path) is not None]
        allow = ", ".join(sorted(set().union(*(r.methods or () for r in matching))))
        assert set(route.methods or ()) <= set(allow.split(", "))
        for method in (m.value for m in func.HttpMethod):
            r = _call(handler, method, path)
            if method == "OPTIONS":
                assert (r.status_code, r.headers.get("Allow")) == (204, allow), (name, method)
            elif method in allow.split(", "):
                # Never sent there by either host (the last test): the fallback names the function that takes it.
                assert r.status_code == 500 and b"route-shadowed" in r.get_body(), (name, method)
            else:
                assert (r.status_code, r.mimetype, r.headers.get("Allow")) == (405, PROBLEM, allow), (name, method)


@pytest.mark.parametrize("rest", ["order", "orders/x1/x2", "nothing/here", "", "console/assets", "openapi"])
def test_a_path_no_route_matches_is_404_problem(rest: str) -> None:
    r = _call(_app_fallback(), "GET", rest)
    assert (r.status_code, r.mimetype) == (404, PROBLEM) and f"/api/{rest}".encode() in r.get_body()


def test_the_fallback_sorts_after_every_other_function_as_the_azure_host_orders_routes() -> None:
    # FunctionMetadataManager: OrderBy(f => f.Name, StringComparer.OrdinalIgnoreCase) (ASCII names: upper-cased).
    names = sorted(indexed_functions(), key=str.upper)
    assert names[-1] == fallback.NAME, names[-3:]


def _azure_lookup(routes: dict[str, Route], method: str, path: str) -> str | None:
    """The function the Azure Functions host gives a request: its routes in the order of their
    functions' names, the first whose template matches and whose methods hold the method exactly."""
    for name in sorted(routes, key=str.upper):
        route = routes[name]
        if route.match(path) is not None and (route.methods is None or method in route.methods):
            return name
    return None


def test_both_hosts_give_each_request_to_the_same_function() -> None:
    """Every route of the app, with each method, a trailing slash, and paths no route matches:
    the local host's lookup and the Azure host's order pick the same function."""
    triggers = _http_functions()
    routes = {name: compile_route(t["route"], "api", target=name, methods=t["methods"]) for name, t in triggers.items()}
    local = RouteTable(routes.values())
    paths = ["/api/" + _sample_path(t["route"]) for t in triggers.values() if t["route"] != "{*path}"]
    paths += [p + "/" for p in paths] + ["/api", "/api/", "/api/order", "/api/orders/x1/x2", "/api/console/assets"]
    for path in paths:
        for method in (m.value for m in func.HttpMethod):
            found, _, _ = local.lookup(method, path)
            assert found is not None, (method, path)
            assert _azure_lookup(routes, method, path) == found.target, (method, path)
