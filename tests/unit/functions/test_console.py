"""functions/console.py: the page, the static files' allow-list (only what manifest.json lists;
traversal in any spelling is a 404), content types, Cache-Control and the sha256 ETag, 304;
and that the two JSON routes hand their query to shared/ (tests/unit/console/test_deadletters.py tests
what they answer)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest

from functions import console

STATIC = console.STATIC_DIR


def _asset(name: str, headers: dict[str, str] | None = None) -> func.HttpResponse:
    req = func.HttpRequest("GET", f"http://localhost/api/console/assets/{name}", body=b"",
                           route_params={"name": name}, headers=headers or {})
    return console.console_asset(req)


def _listed() -> list[str]:
    return list(json.loads((STATIC / "manifest.json").read_text(encoding="utf-8"))["files"])


def test_the_page_is_the_index_html_with_its_headers() -> None:
    resp = console.console(func.HttpRequest("GET", "http://localhost/api/console?code=k", body=b""))
    assert resp.status_code == 200
    assert resp.mimetype == "text/html" and resp.charset == "utf-8"
    assert resp.get_body() == (STATIC / "index.html").read_bytes()
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.headers["Referrer-Policy"] == "no-referrer"  # its URL may hold ?code=
    csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "http" not in csp


def test_every_listed_file_is_served_with_its_type_cache_and_etag() -> None:
    listed = _listed()
    assert "app.js" in listed
    for name in listed:
        resp = _asset(name)
        body = (STATIC / name).read_bytes()
        assert resp.status_code == 200, name
        assert resp.get_body() == body
        assert resp.mimetype == console.content_type_of(name)
        assert resp.headers["Cache-Control"] == "public, max-age=300"
        assert resp.headers["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'


@pytest.mark.parametrize(("name", "content_type"), [
    ("app.js", "text/javascript"), ("x.MJS", "text/javascript"), ("console.css", "text/css"),
    ("logo.svg", "image/svg+xml"), ("shot.png", "image/png"), ("index.html", "text/html"),
    ("manifest.json", "application/json"), ("noext", "application/octet-stream"),
])
def test_content_type_by_extension(name: str, content_type: str) -> None:
    assert console.content_type_of(name) == content_type


@pytest.mark.parametrize("name", [
    "", ".", "..", "../console.py", "..%2fconsole.py", "..%2F..%2Fshared%2Fsettings.py", "..\\console.py",
    "%2e%2e/console.py", "/etc/passwd", "console_static/app.js", "./app.js", "APP.JS", "app.js ", "app.js%00",
    "app.js/", "nope.js", "__init__.py", "console.py", "..%2fsettings.py",
])
def test_anything_not_listed_is_a_404_problem(name: str) -> None:
    resp = _asset(name)
    assert resp.status_code == 404
    assert resp.mimetype == "application/problem+json"
    assert json.loads(resp.get_body())["status"] == 404


def test_a_listed_name_is_never_a_path(tmp_path: Path) -> None:
    """A manifest entry naming a file outside the folder serves nothing: only the folder's own
    entries are read."""
    (tmp_path / "manifest.json").write_text(json.dumps({"files": {"a.js": {}, "../secret.txt": {}, "gone.css": {},
                                                                    "sub/b.js": {}}}))
    (tmp_path / "a.js").write_text("export {};")
    (tmp_path.parent / "secret.txt").write_text("secret")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.js").write_text("x")
    assert set(console.load_assets(tmp_path)) == {"a.js"}


def test_a_matching_if_none_match_is_a_304() -> None:
    etag = _asset("app.js").headers["ETag"]
    for held in (etag, f'"other", {etag}', "*"):
        resp = _asset("app.js", {"If-None-Match": held})
        assert resp.status_code == 304 and resp.get_body() == b"" and resp.headers["ETag"] == etag
    assert _asset("app.js", {"If-None-Match": '"other"'}).status_code == 200


def test_the_json_routes_pass_the_runtime_and_query_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from shared.api.http import HttpResult

    seen: dict[str, Any] = {}
    monkeypatch.setattr(console, "get_runtime", lambda: "rt")

    def dead(rt: Any, params: dict[str, str]) -> HttpResult:
        seen["dead"] = (rt, params)
        return HttpResult(200, {"queue": "alerts"})

    monkeypatch.setattr(console, "get_dead_letters", dead)
    def overview(rt: Any) -> HttpResult:
        seen["overview"] = rt
        return HttpResult(200, {"asOf": "x"})

    fake_overview = types.ModuleType("shared.console.overview")
    fake_overview.get_overview = overview  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "shared.console.overview", fake_overview)
    resp = console.deadletters(func.HttpRequest("GET", "http://localhost/api/deadletters", body=b"",
                                                params={"queue": "alerts", "limit": "5"}))
    assert resp.status_code == 200 and json.loads(resp.get_body()) == {"queue": "alerts"}
    assert seen["dead"] == ("rt", {"queue": "alerts", "limit": "5"})
    resp = console.overview(func.HttpRequest("GET", "http://localhost/api/overview", body=b""))
    # the function adds who is looking and whether they may act (the key mode: the key, who may)
    assert resp.status_code == 200 and seen["overview"] == "rt"
    assert json.loads(resp.get_body()) == {"asOf": "x", "caller": {"by": "key", "canAct": True}}


def test_the_caller_route_answers_from_the_request_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """GET /api/console/caller: the overview's ``caller``, with no runtime (no storage, no Service Bus)."""
    monkeypatch.setattr(console, "get_runtime", lambda: pytest.fail("the caller route needs no runtime"))
    resp = console.console_caller(func.HttpRequest("GET", "http://localhost/api/console/caller", body=b""))
    assert (resp.status_code, resp.mimetype) == (200, "application/json")
    assert json.loads(resp.get_body()) == {"by": "key", "canAct": True}  # the key mode: the key, who may act


_CALLER = """
import base64, json, azure.functions as func
from functions import console
def boom():
    raise AssertionError("the caller route needs no runtime")
console.get_runtime = boom
def principal(*roles):
    claims = [{"typ": "name", "val": "ana"}] + [{"typ": "roles", "val": r} for r in roles]
    return base64.b64encode(json.dumps({"auth_typ": "aad", "claims": claims}).encode()).decode()
out = {}
for who, headers in (("none", {}), ("unreadable", {"X-MS-CLIENT-PRINCIPAL": "not base64 json"}),
                     ("neither", {"X-MS-CLIENT-PRINCIPAL": principal("Other")}),
                     ("viewer", {"X-MS-CLIENT-PRINCIPAL": principal("Viewer")}),
                     ("operator", {"X-MS-CLIENT-PRINCIPAL": principal("Operator")})):
    resp = console.console_caller(func.HttpRequest("GET", "http://localhost/api/console/caller", body=b"",
                                                   headers=headers))
    out[who] = [resp.status_code, json.loads(resp.get_body())]
print(json.dumps(out))
"""


def test_with_app_service_authentication_the_caller_route_is_a_read_route() -> None:
    """The caller route has the gate of the console's other reads: no sign-in 401 and an unknown role
    403, neither saying who is looking; a viewer is told it may not act, an operator that it may."""
    import os
    import subprocess
    import sys

    from tests.unit.harness import REQUIRED_VALUES

    env = {**os.environ, **REQUIRED_VALUES, "OperatorAuth": "appService", "OperatorRole": "Operator",
           "ViewerRole": "Viewer", "WEBSITE_AUTH_ENABLED": "True"}
    proc = subprocess.run([sys.executable, "-c", _CALLER], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert [got[w][0] for w in ("none", "unreadable", "neither")] == [401, 401, 403]
    for who in ("none", "unreadable", "neither"):
        assert not {"by", "canAct"} & set(got[who][1]) and "ana" not in json.dumps(got[who][1]), got[who]
    assert got["viewer"] == [200, {"by": "ana", "canAct": False}]
    assert got["operator"] == [200, {"by": "ana", "canAct": True}]


def test_the_static_files_ship_in_the_publish_package() -> None:
    """.funcignore (what publish leaves out) keeps the page, the manifest and every listed file."""
    import pathspec

    root = STATIC.parents[1]
    spec = pathspec.GitIgnoreSpec.from_lines((root / ".funcignore").read_text(encoding="utf-8").splitlines())
    for name in ["index.html", "manifest.json", *_listed()]:
        assert not spec.match_file(f"functions/console_static/{name}"), name
    assert spec.match_file("tests/unit/functions/test_console.py")  # the spec is the real one


@pytest.mark.parametrize("action", ["resubmit", "discard"])
def test_the_dead_letter_actions_pass_the_route_and_who_acts_on(monkeypatch: pytest.MonkeyPatch, action: str) -> None:
    import sys
    import types

    from shared.api.http import HttpResult

    seen: dict[str, Any] = {}
    monkeypatch.setattr(console, "get_runtime", lambda: "rt")

    def act(rt: Any, queue: str | None, seq: str | None, what: str, *, by: str) -> HttpResult:
        seen["act"] = (rt, queue, seq, what, by)
        return HttpResult(200, {"action": what})

    fake = types.ModuleType("shared.console.deadletter_actions")
    fake.post_dead_letter_action = act  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "shared.console.deadletter_actions", fake)
    handler = console.deadletter_resubmit if action == "resubmit" else console.deadletter_discard
    resp = handler(func.HttpRequest("POST", f"http://localhost/api/deadletters/alerts/7/{action}", body=b"",
                                    route_params={"queue": "alerts", "sequenceNumber": "7"}))
    assert resp.status_code == 200 and json.loads(resp.get_body()) == {"action": action}
    assert seen["act"] == ("rt", "alerts", "7", action, "key")  # the key mode: the key acts


_ROLES = """
import base64, json, azure.functions as func
from functions import console
from tests.unit.harness import make_runtime
console.get_runtime = make_runtime  # the handler's runtime: no storage needed to refuse a bad queue
def principal(*roles):
    claims = [{"typ": "name", "val": "ana"}] + [{"typ": "roles", "val": r} for r in roles]
    return base64.b64encode(json.dumps({"auth_typ": "aad", "claims": claims}).encode()).decode()
out = {}
for who, headers in (("none", {}), ("viewer", {"X-MS-CLIENT-PRINCIPAL": principal("Viewer")}),
                     ("operator", {"X-MS-CLIENT-PRINCIPAL": principal("Operator")})):
    for action in ("resubmit", "discard"):
        handler = getattr(console, "deadletter_" + action)
        req = func.HttpRequest("POST", "http://localhost/api/deadletters/nope/7/" + action, body=b"",
                               headers=headers, route_params={"queue": "nope", "sequenceNumber": "7"})
        resp = handler(req)
        out[who + " " + action] = [resp.status_code, json.loads(resp.get_body()).get("errors")]
print(json.dumps(out))
"""


def test_with_app_service_authentication_only_an_operator_reaches_the_dead_letter_actions() -> None:
    """No sign-in is 401, a viewer 403; an operator's request reaches the handler (its bad queue: 400)."""
    import os
    import subprocess
    import sys

    from tests.unit.harness import REQUIRED_VALUES

    env = {**os.environ, **REQUIRED_VALUES, "OperatorAuth": "appService", "OperatorRole": "Operator",
           "ViewerRole": "Viewer", "WEBSITE_AUTH_ENABLED": "True"}
    proc = subprocess.run([sys.executable, "-c", _ROLES], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    bad_queue = [{"field": "queue", "message": got["operator resubmit"][1][0]["message"]}]
    for action in ("resubmit", "discard"):
        assert got[f"none {action}"] == [401, None] and got[f"viewer {action}"] == [403, None]
        assert got[f"operator {action}"] == [400, bad_queue]


_OFF = """
import base64, json, logging, sys
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
import azure.functions as func
import function_app
from functions import console, orders, operations
principal = base64.b64encode(json.dumps({"claims": [{"typ": "roles", "val": "Operator"}]}).encode()).decode()
req = lambda method, route: func.HttpRequest(method, "http://localhost/api/" + route, body=b"",
                                             headers={"X-MS-CLIENT-PRINCIPAL": principal},
                                             route_params={"id": "a" * 32})
out = {}
for name, handler, method in (("console", console.console, "GET"), ("overview", console.overview, "GET"),
                              ("console_caller", console.console_caller, "GET"),
                              ("console_order", console.console_order, "GET"),
                              ("console_order_history", console.console_order_history, "GET"),
                              ("deadletters", console.deadletters, "GET"), ("search", orders.search, "GET"),
                              ("retry", orders.retry, "POST"), ("start_operation", operations.start, "POST")):
    resp = handler(req(method, name))
    out[name] = [resp.status_code, resp.mimetype, json.loads(resp.get_body())]
print(json.dumps(out))
"""


@pytest.mark.parametrize("enabled", [None, "False", ""])
def test_the_app_service_mode_refuses_every_operator_route_while_its_authentication_is_off(
        enabled: str | None) -> None:
    """OperatorAuth=appService with WEBSITE_AUTH_ENABLED unset or not True: a client could send its own
    X-MS-CLIENT-PRINCIPAL, so every operator route answers 503 naming the setting (a forged operator
    principal included), and indexing logs one error."""
    import os
    import subprocess
    import sys

    from tests.unit.harness import REQUIRED_VALUES

    env = {k: v for k, v in os.environ.items() if k != "WEBSITE_AUTH_ENABLED"}
    env.update({**REQUIRED_VALUES, "OperatorAuth": "appService", "OperatorRole": "Operator"})
    if enabled is not None:
        env["WEBSITE_AUTH_ENABLED"] = enabled
    proc = subprocess.run([sys.executable, "-c", _OFF], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    for name, (status, mimetype, body) in got.items():
        assert (status, mimetype) == (503, "application/problem+json"), name
        assert body["setting"] == "WEBSITE_AUTH_ENABLED" and "WEBSITE_AUTH_ENABLED" in body["detail"], name
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR") and "WEBSITE_AUTH_ENABLED" in line]
    assert len(errors) == 1, proc.stderr[-2000:]
