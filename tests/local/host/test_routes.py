import pytest

from local.host.routes import RouteError, RouteTable, compile_route


def m(template: str, path: str, prefix: str = "api"):
    return compile_route(template, prefix).match(path)


def test_literal_and_params():
    assert m("orders/{id}", "/api/orders/42") == {"id": "42"}
    assert m("orders/{id}", "/API/Orders/42") == {"id": "42"}  # literals are case-insensitive
    assert m("orders/{id}", "/api/orders/42/") == {"id": "42"}
    assert m("orders/{id}", "/api/orders") is None
    assert m("orders/{id}", "/api/orders/42/x") is None
    assert m("orders/{id}", "/other/orders/42") is None


def test_values_are_url_decoded():
    assert m("files/{name}", "/api/files/a%20b%C3%A9") == {"name": "a bé"}


def test_empty_prefix_and_root():
    assert m("health", "/health", prefix="") == {}
    assert m("health", "/api/health", prefix="") is None
    assert m("", "/api", prefix="api") == {}


def test_constraints():
    guid = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
    assert m("o/{id:guid}", f"/api/o/{guid}") == {"id": guid}
    assert m("o/{id:guid}", "/api/o/not-a-guid") is None
    assert m("o/{n:int}", "/api/o/-12") == {"n": "-12"}
    assert m("o/{n:int}", "/api/o/12a") is None
    assert m("o/{n:int}", "/api/o/99999999999") is None  # beyond int32
    assert m("o/{n:long}", "/api/o/99999999999") == {"n": "99999999999"}
    assert m("o/{b:bool}", "/api/o/True") == {"b": "True"}
    assert m("o/{a:alpha}", "/api/o/abc1") is None
    assert m("o/{s:minlength(3)}", "/api/o/ab") is None
    assert m("o/{s:maxlength(3)}", "/api/o/abcd") is None
    assert m("o/{s:length(2,3)}", "/api/o/abc") == {"s": "abc"}
    assert m("o/{n:range(1,5)}", "/api/o/6") is None
    assert m("o/{n:min(1):max(5)}", "/api/o/3") == {"n": "3"}
    assert m("o/{c:regex(^x\\d+$)}", "/api/o/x12") == {"c": "x12"}
    assert m("o/{c:regex(^x\\d+$)}", "/api/o/y12") is None
    assert m("o/{d:decimal}", "/api/o/1.50") == {"d": "1.50"}
    assert m("o/{d:datetime}", "/api/o/2026-01-01") == {"d": "2026-01-01"}


def test_optional_default_and_catch_all():
    assert m("hello/{name?}", "/api/hello") == {}
    assert m("hello/{name?}", "/api/hello/bob") == {"name": "bob"}
    assert m("hello/{id:int?}", "/api/hello/x") is None
    assert m("hello/{name=world}", "/api/hello") == {"name": "world"}
    assert m("files/{*path}", "/api/files/a/b/c.txt") == {"path": "a/b/c.txt"}
    assert m("files/{*path}", "/api/files") == {}


def test_several_params_in_one_segment():
    assert m("img/{name}.{ext}", "/api/img/cat.png") == {"name": "cat", "ext": "png"}
    assert m("img/{name}.{ext}", "/api/img/catpng") is None


def test_bad_templates():
    for bad in ["a/{id?}/b", "{*rest}/x", "a/{id}/{id}", "a/{1x}", "a/{x:nosuch}"]:
        with pytest.raises(RouteError):
            compile_route(bad, "api")


def test_table_precedence_and_methods():
    t = RouteTable()
    t.add(compile_route("items/{id}", "api", target="by-id", methods=["GET"]))
    t.add(compile_route("items/new", "api", target="new", methods=["GET"]))
    t.add(compile_route("items/{id:int}", "api", target="by-int", methods=["get"]))
    t.add(compile_route("items/{id}", "api", target="post", methods=["POST"]))
    t.add(compile_route("{*any}", "api", target="catch-all", methods=["PATCH"]))
    r, params, _ = t.lookup("GET", "/api/items/new")
    assert r.target == "new"
    r, params, _ = t.lookup("GET", "/api/items/7")
    assert (r.target, params) == ("by-int", {"id": "7"})
    r, params, _ = t.lookup("GET", "/api/items/x")
    assert (r.target, params) == ("by-id", {"id": "x"})
    r, _, _ = t.lookup("POST", "/api/items/7")
    assert r.target == "post"
    # Methods are compared exactly, as the host's HttpMethodRouteConstraint does: a GET route
    # does not take HEAD (the path matches, so it is a 405 listing the methods that routes take).
    r, _, allowed = t.lookup("HEAD", "/api/items/7")
    assert r is None and allowed == {"GET", "POST", "PATCH"}
    r, _, allowed = t.lookup("DELETE", "/api/items/7")
    assert r is None and allowed == {"GET", "POST", "PATCH"}  # the catch-all matches the path too
    r, _, allowed = t.lookup("GET", "/nope")
    assert r is None and allowed is None
    r, params, _ = t.lookup("PATCH", "/api/some/where")
    assert (r.target, params) == ("catch-all", {"any": "some/where"})


def test_no_methods_means_all():
    t = RouteTable([compile_route("x", "api", target="x", methods=None)])
    for method in ("GET", "POST", "DELETE", "OPTIONS"):
        assert t.lookup(method, "/api/x")[0].target == "x"


def test_a_catch_all_of_every_method_comes_after_every_route_whatever_the_order_added():
    """An app's fallback route ({*path}, every method) gets only what no other route takes: a path
    no route matches, or a route's path with a method that route does not take."""
    every = ["GET", "POST", "DELETE", "HEAD", "PATCH", "PUT", "OPTIONS"]
    t = RouteTable()
    t.add(compile_route("{*path}", "api", target="fallback", methods=every))
    t.add(compile_route("orders", "api", target="submit", methods=["POST"]))
    t.add(compile_route("orders/{id}", "api", target="get", methods=["GET"]))
    t.add(compile_route("orders/{id}/history", "api", target="history", methods=["GET"]))
    t.add(compile_route("orders", "api", target="search", methods=["GET"]))
    assert t.lookup("POST", "/api/orders")[0].target == "submit"
    assert t.lookup("GET", "/api/orders")[0].target == "search"
    assert t.lookup("GET", "/api/orders/1/history")[0].target == "history"
    for method, path, rest in [("PUT", "/api/orders", "orders"), ("DELETE", "/api/orders/1", "orders/1"),
                               ("HEAD", "/api/orders/1", "orders/1"), ("OPTIONS", "/api/orders", "orders"),
                               ("GET", "/api/order", "order"), ("GET", "/api/orders/1/x", "orders/1/x"),
                               ("GET", "/api/", None), ("GET", "/api", None)]:
        r, params, _ = t.lookup(method, path)
        assert (r.target, params.get("path")) == ("fallback", rest), (method, path)
    assert t.lookup("GET", "/other/orders") == (None, {}, None)  # outside the prefix: the host's 404
