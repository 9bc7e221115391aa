"""The operator routes' gate: the master key (the host checks it) or App Service authentication's
principal, checked by each route."""

from __future__ import annotations

import base64
import json
from typing import Any

import azure.functions as func
import pytest

from functions.operator_auth import guard
from shared.api import auth as operator_auth
from shared.api.auth import APP_SERVICE, KEY, denied, mode_of
from shared.settings import setting_from_env


def principal(*claims: tuple[str, str], role_typ: str | None = None) -> str:
    body: dict[str, Any] = {"auth_typ": "aad", "claims": [{"typ": t, "val": v} for t, v in claims]}
    if role_typ:
        body["role_typ"] = role_typ
    return base64.b64encode(json.dumps(body).encode()).decode()


def request(headers: dict[str, str]) -> func.HttpRequest:
    return func.HttpRequest("GET", "http://h/api/orders", headers=headers, body=b"")


def ok(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse("ran", status_code=200)


def test_key_mode_lets_every_request_through_the_host_checked_the_key() -> None:
    assert denied(KEY, "", {}) is None
    assert denied(KEY, "operators", {}) is None


def test_app_service_mode_needs_a_principal() -> None:
    refused = denied(APP_SERVICE, "", {})
    assert refused is not None and refused.status == 401
    assert refused.body["title"] == "Sign-in required"


@pytest.mark.parametrize("raw", ["%%%not-base64", base64.b64encode(b"not json").decode(),
                                 base64.b64encode(b"[1, 2]").decode()])
def test_an_unreadable_principal_is_401(raw: str) -> None:
    refused = denied(APP_SERVICE, "", {"X-MS-CLIENT-PRINCIPAL": raw})
    assert refused is not None and refused.status == 401


def test_any_signed_in_user_when_no_role_is_required() -> None:
    assert denied(APP_SERVICE, "", {"X-MS-CLIENT-PRINCIPAL": principal(("name", "ana"))}) is None


def test_a_required_role_is_looked_up_in_the_principals_role_claims() -> None:
    with_role = principal(("roles", "Orders.Operator"))
    custom_typ = principal(("http://x/role", "Orders.Operator"), role_typ="http://x/role")
    in_group = principal(("groups", "0f1e2d3c"))
    assert denied(APP_SERVICE, "Orders.Operator", {"x-ms-client-principal": with_role}) is None
    assert denied(APP_SERVICE, "Orders.Operator", {"x-ms-client-principal": custom_typ}) is None
    assert denied(APP_SERVICE, "0f1e2d3c", {"x-ms-client-principal": in_group}) is None
    refused = denied(APP_SERVICE, "Orders.Operator", {"x-ms-client-principal": principal(("roles", "Reader"))})
    assert refused is not None and refused.status == 403


def test_the_guard_answers_before_the_handler_runs() -> None:
    guarded = guard(APP_SERVICE, "")(ok)
    refused = guarded(request({}))
    assert refused.status_code == 401 and refused.mimetype == "application/problem+json"
    assert guarded(request({"X-MS-CLIENT-PRINCIPAL": principal(("name", "ana"))})).get_body() == b"ran"
    assert guard(KEY, "")(ok)(request({})).get_body() == b"ran"


def test_the_guard_keeps_the_handlers_name_and_signature_for_the_worker() -> None:
    guarded = guard(KEY, "")(ok)
    assert guarded.__name__ == "ok"
    assert list(__import__("inspect").signature(guarded).parameters) == ["req"]


def test_a_mode_that_is_not_one_stops_the_start_naming_the_setting() -> None:
    assert mode_of("appService") == APP_SERVICE
    with pytest.raises(ValueError, match="OperatorAuth"):
        mode_of("AppService")


def test_the_default_mode_is_the_key() -> None:
    assert setting_from_env("OperatorAuth", {}) == operator_auth.KEY
    assert setting_from_env("OperatorAuth", {"OperatorAuth": "appService"}) == APP_SERVICE
    with pytest.raises(KeyError):
        setting_from_env("NoSuchSetting", {})


def test_who_acts_is_the_key_or_the_signed_in_users_name() -> None:
    from shared.api.auth import actor_of

    assert actor_of(KEY, {"X-MS-CLIENT-PRINCIPAL-NAME": "ana"}) == "key"  # the key mode trusts no header
    assert actor_of(APP_SERVICE, {"X-MS-CLIENT-PRINCIPAL-NAME": "ana@contoso.com"}) == "ana@contoso.com"
    upn = "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/upn"
    assert actor_of(APP_SERVICE, {"X-MS-CLIENT-PRINCIPAL": principal((upn, "bo@contoso.com"))}) == "bo@contoso.com"
    assert actor_of(APP_SERVICE, {"X-MS-CLIENT-PRINCIPAL": principal(("roles", "x"))}) == "unknown"
    assert len(actor_of(APP_SERVICE, {"X-MS-CLIENT-PRINCIPAL-NAME": "a" * 1000})) == 256


def test_a_viewer_may_read_but_not_act() -> None:
    """ViewerRole: the read routes let a viewer (or an operator) in; the routes that act need
    OperatorRole. No sign-in is 401, a user with neither role 403."""
    from shared.api.auth import may_act

    viewer = {"X-MS-CLIENT-PRINCIPAL": principal(("roles", "Viewer"))}
    operator = {"X-MS-CLIENT-PRINCIPAL": principal(("roles", "Operator"))}
    nobody = {"X-MS-CLIENT-PRINCIPAL": principal(("roles", "Other"))}
    read = lambda h: denied(APP_SERVICE, "Operator", h, "Viewer")  # noqa: E731
    act = lambda h: denied(APP_SERVICE, "Operator", h)  # noqa: E731
    assert read(viewer) is None and read(operator) is None
    assert act(operator) is None
    refused = act(viewer)
    assert refused is not None and refused.status == 403 and "Not an operator" in refused.body["title"]
    both = read(nobody)
    assert both is not None and both.status == 403 and "Neither an operator nor a viewer" in both.body["title"]
    assert read({}) is not None and read({}).status == 401  # type: ignore[union-attr]
    assert (may_act(APP_SERVICE, "Operator", viewer), may_act(APP_SERVICE, "Operator", operator)) == (False, True)
    assert may_act(KEY, "Operator", {}) and denied(KEY, "Operator", {}, "Viewer") is None  # the key is an operator


def test_a_read_guard_lets_a_viewer_in_and_an_act_guard_does_not() -> None:
    viewer = request({"X-MS-CLIENT-PRINCIPAL": principal(("roles", "Viewer"))})
    assert guard(APP_SERVICE, "Operator", "Viewer")(ok)(viewer).status_code == 200
    assert guard(APP_SERVICE, "Operator")(ok)(viewer).status_code == 403


def test_the_routes_that_only_read_have_the_read_guard() -> None:
    """The search, the console, who is looking, its overview, its copies of an order and its history, its dead
    letters and a bulk operation's progress read; every POST acts."""
    import re

    from local.procs import REPO_ROOT

    guarded = {}
    for name in ("orders.py", "console.py", "operations.py"):
        text = (REPO_ROOT / "functions" / name).read_text(encoding="utf-8")
        for route, methods, gate in re.findall(r'route="([^"]+)", methods=\["([A-Z", ]+)"\].*\n@(\w+)', text):
            guarded[(methods, route)] = gate
    assert {k for k, g in guarded.items() if g == "reader_only"} == {
        ("GET", "orders"), ("GET", "console"), ("GET", "overview"), ("GET", "deadletters"), ("GET", "operations/{id}"),
        ("GET", "console/orders/{id}"), ("GET", "console/orders/{id}/history"), ("GET", "console/caller")}
    assert all(g == "operator_only" for (m, _), g in guarded.items() if m == "POST") and len(guarded) >= 12
    assert guarded[("POST", "operations")] == "operator_only"
