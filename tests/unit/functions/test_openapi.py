"""functions/openapi.yaml describes the HTTP functions function_app.py registers: the same
routes and methods, the same auth levels, problem+json for every error, and the enums the
code uses (categories, history events, operator actions).

The fuzz run (tests/hostile/test_fuzz.py) checks the responses against the document; this
checks the document against the code, without a host.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml

from functions import fallback
from local.procs import REPO_ROOT
from tests.unit.functions.test_function_app import _functions, _trigger

SPEC_PATH = REPO_ROOT / "functions" / "openapi.yaml"
ADMIN_SECURITY = [{"adminKeyQuery": []}, {"adminKeyHeader": []}]
FUNCTION_SECURITY = [{"functionKeyQuery": []}, {"functionKeyHeader": []}]


@functools.cache
def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text(encoding="utf-8"))
    return doc


def _http_functions() -> dict[tuple[str, str], str]:
    """(METHOD, /route) -> auth level, of every HTTP function function_app.py registers
    (through test_function_app's cache: the app indexes its functions only once), but the
    fallback route, which is no operation (test_the_fallback_answers_are_described)."""
    out: dict[tuple[str, str], str] = {}
    for name, fn in _functions().items():
        trigger = _trigger(fn)
        if trigger["type"] == "httpTrigger" and name != fallback.NAME:
            for method in trigger["methods"]:
                out[(method.upper(), "/" + trigger["route"])] = trigger["authLevel"]
    return out


def _operations() -> dict[tuple[str, str], dict[str, Any]]:
    return {(method.upper(), path): op for path, item in _doc()["paths"].items() for method, op in item.items()}


def _resolve(ref: str) -> Any:
    node: Any = _doc()
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_every_http_function_is_documented_and_nothing_else() -> None:
    assert set(_operations()) == set(_http_functions())


def test_security_matches_each_auth_level() -> None:
    default = _doc()["security"]
    assert default == FUNCTION_SECURITY
    expected = {"ANONYMOUS": [], "FUNCTION": FUNCTION_SECURITY, "ADMIN": ADMIN_SECURITY}
    for key, level in _http_functions().items():
        assert _operations()[key].get("security", default) == expected[level], (key, level)


def test_path_parameters_are_declared() -> None:
    for (method, path), op in _operations().items():
        in_path = set(re.findall(r"{(\w+)}", path))
        params = [_resolve(p["$ref"]) if "$ref" in p else p for p in op.get("parameters", [])]
        assert in_path == {p["name"] for p in params if p["in"] == "path"}, (method, path)
        names = [(p["in"], p["name"]) for p in params]
        assert len(names) == len(set(names)), (method, path, names)


def test_every_reference_resolves() -> None:
    refs = _refs(_doc())
    assert len(refs) > 40
    for ref in refs:
        assert ref.startswith("#/") and _resolve(ref) is not None, ref


def test_every_error_is_problem_json() -> None:
    for (method, path), op in _operations().items():
        for status, response in op["responses"].items():
            response = _resolve(response["$ref"]) if "$ref" in response else response
            if status.startswith(("4", "5")):
                assert list(response["content"]) == ["application/problem+json"], (method, path, status)


def test_the_fallback_answers_are_described() -> None:
    """Every path no route matches, and every method a route does not take, are answered by the
    fallback route (functions/fallback.py): the document says so, and describes both problems."""
    assert fallback.NAME in {name for name, fn in _functions().items() if _trigger(fn)["type"] == "httpTrigger"}
    text = _doc()["info"]["description"]
    for phrase in ("404", "`no-route`", "405", "`method-not-allowed`", "`Allow`", "OPTIONS", "HEAD"):
        assert phrase in text, phrase
    responses = _doc()["components"]["responses"]
    for name, status in (("NoRoute", "no-route"), ("MethodNotAllowed", "method-not-allowed")):
        assert list(responses[name]["content"]) == ["application/problem+json"], name
        assert status in responses[name]["description"], name
    assert set(responses["MethodNotAllowed"]["headers"]) == {"Allow"}


def test_query_endpoints() -> None:
    ops = _operations()
    search = ops[("GET", "/orders")]
    params = {(_resolve(p["$ref"]) if "$ref" in p else p)["name"]: p for p in search["parameters"]}
    assert set(params) == {"state", "customerId", "workflow", "failedStep", "createdFrom", "createdTo", "limit",
                           "continuationToken"}
    from shared.api.search import PARAMETERS
    from shared.core.workflows.schema import NAME

    assert set(PARAMETERS) == set(params)  # what the code refuses is what the document leaves out
    assert _resolve(params["workflow"]["schema"]["$ref"])["pattern"] == NAME
    assert params["failedStep"]["schema"] == params["workflow"]["schema"]
    assert "code" in {s["name"] for s in _doc()["components"]["securitySchemes"].values() if s["in"] == "query"}
    assert params["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}
    history = ops[("GET", "/orders/{id}/history")]
    limit = next(p for p in history["parameters"] if p.get("name") == "limit")
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}
    for op in (search, history):
        assert "invalid-continuation-token" in _resolve(op["responses"]["400"]["$ref"])["description"]


def test_enums_are_the_ones_the_code_uses() -> None:
    from shared.core.statemachine.history import EventKind
    from shared.core.states import Category

    schemas = _doc()["components"]["schemas"]
    assert schemas["Category"]["enum"] == [c.value for c in Category]
    assert schemas["HistoryEvent"]["properties"]["event"]["enum"] == [e.value for e in EventKind]
    from shared.core.statemachine.actions import ACTIONS

    assert schemas["OperatorResult"]["properties"]["action"]["enum"] == list(ACTIONS)
    assert schemas["OrderView"]["properties"]["actions"]["items"]["enum"] == list(ACTIONS)


def test_order_view_has_the_issue_11_fields() -> None:
    view = _doc()["components"]["schemas"]["OrderView"]
    assert {"history", "historyContinuationToken", "generation", "category"} <= set(view["required"])
    summary = _doc()["components"]["schemas"]["OrderSummary"]
    assert set(summary["required"]) == {"orderId", "processState", "outcome", "customerId", "createdAt",
                                        "updatedAt", "failureCount", "priority", "category", "workflow",
                                        "failedStep"}


def _overview_errors(body: dict[str, Any]) -> list[str]:
    """Where ``body`` breaks the document's Overview schema (references resolved in the document)."""
    import jsonschema_rs

    schema = {"$ref": "#/components/schemas/Overview", "components": _doc()["components"]}
    return [str(error) for error in jsonschema_rs.validator_for(schema).iter_errors(body)]


def test_the_overview_with_breakers_matches_its_schema() -> None:
    from shared.console.overview import get_overview
    from shared.core.breaker.state import BreakerPolicy, BreakerState, decide_failure
    from shared.storage.breakers import read_breaker, write_breaker
    from tests.unit.harness import T0, Clock, make_runtime

    rt = make_runtime(clock=Clock(T0))
    policy = BreakerPolicy()
    for _ in range(policy.threshold):
        decision = decide_failure(read_breaker(rt.store, "shipping"), T0, policy, "503")
        assert decision.row is not None
        write_breaker(rt.store, decision.row)
    body = get_overview(rt, queue_depths=lambda rt, cap: []).body
    assert body["remotes"][2]["state"] == "open"
    assert _overview_errors(body) == []
    schema = _doc()["components"]["schemas"]
    assert schema["RemoteBreaker"]["properties"]["state"]["enum"] == [s.value for s in BreakerState]
    # ``caller`` is added by the function (functions/console.py), the rest by get_overview
    assert list(schema["Overview"]["properties"]) == ["caller", *body]
    assert _overview_errors({**body, "caller": {"by": "ana", "canAct": False}}) == []
    assert list(schema["RemoteBreaker"]["properties"]) == list(body["remotes"][0])
    assert _overview_errors({**body, "remotes": [], "remotesError": "down"}) == []
    assert _overview_errors({**body, "remotes": None}) != []


def test_the_caller_route_answers_the_overview_s_caller_schema() -> None:
    """GET /api/console/caller answers a ``Caller``, the schema of the overview's ``caller`` too."""
    import json

    import azure.functions as func
    import jsonschema_rs

    from functions import console

    body = json.loads(console.console_caller(func.HttpRequest("GET", "http://localhost/api/console/caller",
                                                              body=b"")).get_body())
    schemas = _doc()["components"]["schemas"]
    assert schemas["Overview"]["properties"]["caller"] == {"$ref": "#/components/schemas/Caller"}
    caller = {"$ref": "#/components/schemas/Caller", "components": _doc()["components"]}
    assert [str(e) for e in jsonschema_rs.validator_for(caller).iter_errors(body)] == []
    assert list(schemas["Caller"]["properties"]) == list(body)


def test_the_operator_results_are_the_verdicts_the_operator_decisions_return() -> None:
    """``result`` of retry/cancel/terminate is the decision's verdict: the document lists exactly those."""
    from shared.core.statemachine import OPERATOR_RESULTS

    schema = _doc()["components"]["schemas"]["OperatorResult"]["properties"]["result"]
    assert schema["enum"] == [v.value for v in OPERATOR_RESULTS]


def test_every_verdict_is_documented_as_the_code_describes_it() -> None:
    """docs/operating.md, "Verdicts": one row per verdict, with the description its member has in the code."""
    import re

    from shared.core.statemachine import Verdict

    source = (REPO_ROOT / "shared" / "core" / "statemachine" / "verdicts.py").read_text(encoding="utf-8")
    described = dict(re.findall(r'^    \w+ = "([a-z-]+)"  # (.*)$', source, re.M))
    docs = (REPO_ROOT / "docs" / "operating.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (.*) \|$", docs[docs.index("## Verdicts"):], re.M))
    assert set(described) == {v.value for v in Verdict}
    assert rows == described


def test_a_dead_letter_actions_answer_matches_its_schema() -> None:
    """What POST /api/deadletters/{queue}/{sequenceNumber}/{resubmit,discard} answers (the stand-in
    broker of tests/unit/console/test_deadletter_actions.py) is what the document says."""
    import jsonschema_rs

    from shared.console.deadletter_actions import ACTIONS, post_dead_letter_action
    from tests.unit.console.test_deadletter_actions import Broker, Dead
    from tests.unit.harness import make_runtime

    schema = {"$ref": "#/components/schemas/DeadLetterAction", "components": _doc()["components"]}
    ops = _operations()
    for action in ACTIONS:
        broker = Broker([Dead(1)])
        body = post_dead_letter_action(make_runtime(), "scheduler", "1", action, by="ana", client=broker).body
        assert [str(e) for e in jsonschema_rs.validator_for(schema).iter_errors(body)] == []
        assert set(_doc()["components"]["schemas"]["DeadLetterAction"]["properties"]) == set(body)
        assert set(ops[("POST", f"/deadletters/{{queue}}/{{sequenceNumber}}/{action}")]["responses"]) >= {
            "200", "400", "404", "409", "503"}
    assert "422" in ops[("POST", "/deadletters/{queue}/{sequenceNumber}/resubmit")]["responses"]
