"""The app's route table, for the requests no function takes: 404 for a path no route matches,
405 (with ``Allow``) for a route called with a method it does not take, 204 (with ``Allow``) for
OPTIONS on a route. Framework-neutral: ``functions/fallback.py`` builds the table from the
function.json of every HTTP function the app registers and answers with ``RouteTable.answer``.

Templates are matched as the Functions host matches them (ASP.NET Core route templates, under the
route prefix, here ``api``): segments split on ``/``, a trailing ``/`` ignored, literal segments
compared case-insensitively, ``{name}`` one non-empty segment. The host compares methods exactly
(``HttpMethodRouteConstraint``): a route that takes GET does not take HEAD. Only literal and
``{name}`` segments are supported (every route of the app is made of them); a template with
anything else (a constraint, an optional or catch-all parameter, two parameters in a segment) is
refused when the table is built, so a new kind of route cannot be matched wrongly in silence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.api.http import HttpResult, problem

# Where every route is described (functions/openapi.yaml, served by the openapi function).
DOCUMENT = "GET /api/openapi.yaml"
# The longest path a problem names; a longer one is cut (a URL may be kilobytes long).
SHOWN_PATH_CHARS = 200

_PARAM = re.compile(r"\{[A-Za-z_]\w*\}")


class UnsupportedTemplate(ValueError):
    pass


@dataclass(frozen=True)
class Route:
    function: str
    template: str
    methods: frozenset[str]
    segments: tuple[str | None, ...]  # a literal, lower-case, or None for a {parameter}

    def matches(self, segments: tuple[str, ...]) -> bool:
        if len(segments) != len(self.segments):
            return False
        return all(s != "" if mine is None else s.lower() == mine
                   for s, mine in zip(segments, self.segments, strict=True))


def path_segments(path: str) -> tuple[str, ...]:
    """The segments of a path under the route prefix (``orders/1/history``, ``/orders/``): one
    leading and one trailing ``/`` are ignored, an empty segment between two is kept."""
    trimmed = path.removeprefix("/")
    trimmed = trimmed.removesuffix("/")
    return tuple(trimmed.split("/")) if trimmed else ()


def compile_route(function: str, template: str, methods: Iterable[str]) -> Route:
    segments: list[str | None] = []
    for segment in path_segments(template):
        if _PARAM.fullmatch(segment):
            segments.append(None)
        elif "{" in segment or "}" in segment or segment == "":
            raise UnsupportedTemplate(f"function {function!r}: route {template!r}: segment {segment!r} is neither a "
                                      "literal nor a plain {parameter} (shared/api/routes.py matches only those)")
        else:
            segments.append(segment.lower())
    allowed = frozenset(str(m).upper() for m in methods)
    if not allowed:
        raise UnsupportedTemplate(f"function {function!r}: route {template!r} names no method, so it takes "
                                  "every one: name them (the fallback lists them in Allow)")
    return Route(function, template, allowed, tuple(segments))


def http_trigger(function_json: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The httpTrigger binding of a function.json, or None for a function of another trigger."""
    return next((b for b in function_json.get("bindings", []) if b.get("type") == "httpTrigger"), None)


class RouteTable:
    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = tuple(routes)

    @classmethod
    def of_functions(cls, functions: Iterable[tuple[str, Mapping[str, Any]]]) -> RouteTable:
        """The table of every HTTP function among ``(name, function.json)`` pairs (a route left
        out of a trigger is the function's name, as the host has it)."""
        routes = []
        for name, function_json in functions:
            trigger = http_trigger(function_json)
            if trigger is not None:
                routes.append(compile_route(name, str(trigger.get("route") or name), trigger.get("methods") or ()))
        return cls(routes)

    def matching(self, path: str) -> list[Route]:
        segments = path_segments(path)
        return [r for r in self.routes if r.matches(segments)]

    def allowed(self, path: str) -> frozenset[str]:
        """The methods the routes matching ``path`` take (empty: no route matches it)."""
        return frozenset().union(*(r.methods for r in self.matching(path)))

    def answer(self, method: str, path: str, shown: str) -> HttpResult:
        """The answer to ``method`` on ``path`` (under the route prefix) that no function took;
        ``shown`` is the path as the request has it, for the problem's ``detail``."""
        method = method.upper()
        if len(shown) > SHOWN_PATH_CHARS:
            shown = shown[:SHOWN_PATH_CHARS] + "…"
        matching = self.matching(path)
        if not matching:
            return problem(404, "no-route", "No such route",
                           f"no route matches {shown}; {DOCUMENT} describes every route and its methods")
        allow = ", ".join(sorted(frozenset().union(*(r.methods for r in matching))))
        if method == "OPTIONS":
            return HttpResult(204, None, {"Allow": allow})
        taken = [r.function for r in matching if method in r.methods]
        if taken:
            # The host gave the fallback a request a function takes: its route order put the fallback
            # first (the host tries routes by function name: functions/fallback.py).
            return problem(500, "route-shadowed", "Route not reached",
                           f"{method} {shown} is function {taken[0]}'s, but the request reached the fallback route")
        result = problem(405, "method-not-allowed", "Method not allowed",
                         f"{method} is not allowed on {shown}; it takes {allow} ({DOCUMENT} describes every route)")
        result.headers["Allow"] = allow
        return result
