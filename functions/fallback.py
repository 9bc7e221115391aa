"""The fallback route (``{*path}``, every method, ANONYMOUS): every request under the route prefix
that no other function takes gets the app's problem+json instead of the host's empty 404. A path
no route matches: 404; a route called with a method it does not take: 405 with ``Allow``;
OPTIONS on a route: 204 with ``Allow`` (``shared.api.routes``). It reveals only what
GET /api/openapi.yaml already does, and calls nothing.

The route table is built when the app is indexed, from the function.json of the functions the
blueprints given to ``blueprint`` hold: function_app.py passes every blueprint it registers, and
tests/unit/functions/test_fallback.py fails when the two differ.

Route order: the Functions host maps the HTTP routes in the order of their functions' names
(FunctionMetadataManager sorts them, case-insensitive ordinal) into one ASP.NET Core
RouteCollection, and the first route whose template and method constraint match takes the request:
literal segments do NOT win over parameters there (azure-functions-host issues #9876, #3153). So
this function's name sorts after every other one (``z_`` : ``_`` is above every letter once
upper-cased), and a test keeps it so. The local host tries the most specific route first, so a
catch-all comes last there whatever its name.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

import azure.functions as func

from functions.http import to_response
from shared.api.http import HttpResult
from shared.api.routes import RouteTable

NAME = "z_unmatched_route"
ROUTE = "{*path}"
# Every method a function can take (the worker's HttpMethod); TRACE and CONNECT the host answers itself.
METHODS = [m.value for m in func.HttpMethod]

log = logging.getLogger(__name__)


def route_table(blueprints: Iterable[func.Blueprint], auth_level: func.AuthLevel | str) -> RouteTable:
    """The routes of the functions of ``blueprints``, as the worker indexes them (through a
    FunctionApp of their own: an app's functions may be listed only once). ``auth_level`` is the
    app's: building a function sets it on an HTTP trigger that names none, as the app would."""
    probe = func.FunctionApp(http_auth_level=auth_level)
    for bp in blueprints:
        probe.register_functions(bp)
    return RouteTable.of_functions((str(f.get_function_name()), json.loads(f.get_function_json()))
                                   for f in probe.get_functions())


def answer(table: RouteTable, req: func.HttpRequest) -> HttpResult:
    """The answer to a request no other function took: the path under the prefix is the route's
    ``path`` value; the problem names the path as requested."""
    result = table.answer(req.method, req.route_params.get("path") or "", urlsplit(req.url).path or "/")
    if result.status >= 500:
        log.error("fallback route: %s", result.body["detail"])
    return result


def blueprint(blueprints: Iterable[func.Blueprint], auth_level: func.AuthLevel | str) -> func.Blueprint:
    """The fallback's blueprint, answering from the routes of ``blueprints`` (complete by now)."""
    table = route_table(blueprints, auth_level)
    bp = func.Blueprint()

    @bp.function_name(NAME)
    @bp.route(route=ROUTE, methods=METHODS, auth_level=func.AuthLevel.ANONYMOUS)
    def unmatched_route(req: func.HttpRequest) -> func.HttpResponse:
        return to_response(answer(table, req))

    return bp
