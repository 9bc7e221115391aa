"""ASP.NET-style route templates as HTTP triggers declare them.

Supported: literal segments (case-insensitive), ``{name}``, optional ``{name?}`` (trailing),
defaults ``{name=value}``, catch-all ``{*rest}``, several parameters in one segment
(``{a}.{b}``) and inline constraints: ``int long bool guid alpha datetime decimal double float
minlength(n) maxlength(n) length(n) length(a,b) min(n) max(n) range(a,b) regex(expr)``,
chained with ``:``. Routes are tried most specific first (literals before parameters,
constrained before unconstrained, optional and catch-all last). The real host tries them in the
order of their functions' names instead (local/host/README.md, "Differences"). Methods are
compared exactly, as the host's ``HttpMethodRouteConstraint`` does: a GET route does not take HEAD.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import unquote


class RouteError(ValueError):
    pass


def _is_float(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _is_decimal(v: str) -> bool:
    try:
        Decimal(v)
        return True
    except InvalidOperation:
        return False


def _is_datetime(v: str) -> bool:
    try:
        datetime.fromisoformat(v)
        return True
    except ValueError:
        return False


def _is_guid(v: str) -> bool:
    s = v.strip("{}()")
    try:
        uuid.UUID(s)
    except ValueError:
        return False
    return len(s) in (32, 36)


def _int_in(v: str, bits: int) -> bool:
    return bool(re.fullmatch(r"[+-]?\d+", v)) and -(2 ** (bits - 1)) <= int(v) < 2 ** (bits - 1)


def _constraint(text: str) -> Callable[[str], bool]:
    m = re.fullmatch(r"(\w+)(?:\((.*)\))?", text, re.S)
    if not m:
        raise RouteError(f"bad constraint {text!r}")
    name, arg = m.group(1).lower(), m.group(2)
    args = [a.strip() for a in arg.split(",")] if arg is not None and name != "regex" else []
    simple: dict[str, Callable[[str], bool]] = {
        "int": lambda v: _int_in(v, 32),
        "long": lambda v: _int_in(v, 64),
        "bool": lambda v: v.lower() in ("true", "false"),
        "guid": _is_guid,
        "alpha": lambda v: bool(re.fullmatch(r"[A-Za-z]+", v)),
        "datetime": _is_datetime,
        "decimal": _is_decimal,
        "double": _is_float,
        "float": _is_float,
    }
    if name in simple:
        return simple[name]
    try:
        if name == "minlength":
            n = int(args[0])
            return lambda v: len(v) >= n
        if name == "maxlength":
            n = int(args[0])
            return lambda v: len(v) <= n
        if name == "length":
            shortest, longest = (int(args[0]), int(args[-1]))
            return lambda v: shortest <= len(v) <= longest
        if name in ("min", "max", "range"):
            lo: int | None = int(args[0]) if name in ("min", "range") else None
            hi: int | None = int(args[-1]) if name in ("max", "range") else None
            return lambda v: (_int_in(v, 64) and (lo is None or int(v) >= lo) and (hi is None or int(v) <= hi))
        if name == "regex":
            rx = re.compile(arg or "", re.I)
            return lambda v: rx.search(v) is not None
    except (IndexError, ValueError) as e:
        raise RouteError(f"bad constraint {text!r}: {e}") from None
    raise RouteError(f"unknown route constraint {name!r}")


@dataclass
class _Param:
    name: str
    optional: bool = False
    catch_all: bool = False
    default: str | None = None
    checks: list[Callable[[str], bool]] = field(default_factory=list)
    constrained: bool = False


def _split_constraints(body: str) -> list[str]:
    """Split ``id:regex(^a:b$):minlength(2)`` on the colons outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == ":" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def _parse_param(body: str) -> _Param:
    parts = _split_constraints(body)
    head = parts[0]
    p = _Param(name="")
    if head.startswith("**"):
        p.catch_all, head = True, head[2:]
    elif head.startswith("*"):
        p.catch_all, head = True, head[1:]
    if "=" in head:
        head, p.default = head.split("=", 1)
        p.optional = True
    if head.endswith("?"):
        head, p.optional = head[:-1], True
    # The optional marker may also follow the constraints: {id:int?}
    if len(parts) > 1 and parts[-1].endswith("?"):
        parts[-1], p.optional = parts[-1][:-1], True
    if not re.fullmatch(r"[A-Za-z_][\w]*", head):
        raise RouteError(f"bad route parameter name {head!r}")
    p.name = head
    p.checks = [_constraint(c) for c in parts[1:]]
    p.constrained = bool(p.checks)
    return p


@dataclass
class Route:
    template: str
    regex: re.Pattern[str]
    params: list[_Param]
    rank: tuple[int, ...]
    target: Any = None
    methods: frozenset[str] | None = None  # None: every method

    def match(self, path: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(path)
        if not m:
            return None
        values: dict[str, str] = {}
        for p in self.params:
            raw = m.group(p.name)
            if raw is None or raw == "":
                if p.default is not None:
                    values[p.name] = p.default
                continue
            v = unquote(raw)
            if not all(check(v) for check in p.checks):
                return None
            values[p.name] = v
        return values


def compile_route(template: str, prefix: str = "", target: Any = None,
                  methods: Iterable[str] | None = None) -> Route:
    """Compile ``prefix/template`` into a matcher of URL paths (with or without a leading slash)."""
    segments = [s for s in f"{prefix.strip('/')}/{template.strip('/')}".split("/") if s != ""]
    if not segments:
        # the root itself
        return Route(template, re.compile(r"/?"), [], (), target, _methods(methods))
    regex = ""
    params: list[_Param] = []
    rank: list[int] = []
    for i, seg in enumerate(segments):
        pieces = re.split(r"(\{[^{}]*(?:\([^)]*\))?[^{}]*\})", seg)
        seg_rx = ""
        seg_params: list[_Param] = []
        for piece in pieces:
            if not piece:
                continue
            if piece.startswith("{") and piece.endswith("}"):
                p = _parse_param(piece[1:-1])
                if p.catch_all:
                    if i != len(segments) - 1:
                        raise RouteError(f"{template!r}: a catch-all parameter must be last")
                    seg_rx += f"(?P<{p.name}>.*)"
                else:
                    seg_rx += f"(?P<{p.name}>[^/]+?)" if len(pieces) > 3 else f"(?P<{p.name}>[^/]+)"
                seg_params.append(p)
            else:
                seg_rx += re.escape(piece)
        if len(seg_params) == 1 and len([x for x in pieces if x]) == 1:
            p = seg_params[0]
            if p.catch_all:
                regex += f"(?:/{seg_rx})?"
                rank.append(5)
            elif p.optional:
                regex += f"(?:/{seg_rx})?"
                rank.append(4)
            else:
                regex += f"/{seg_rx}"
                rank.append(2 if p.constrained else 3)
        else:
            regex += f"/{seg_rx}"
            rank.append(1 if not seg_params else 2)
        params.extend(seg_params)
    names = [p.name.lower() for p in params]
    if len(set(names)) != len(names):
        raise RouteError(f"{template!r}: repeated parameter name")
    # Optional parameters may only be trailing.
    seen_optional = False
    for r in rank:
        if r >= 4:
            seen_optional = True
        elif seen_optional:
            raise RouteError(f"{template!r}: an optional parameter must be at the end")
    return Route(template, re.compile(regex + "/?", re.I), params, tuple(rank), target, _methods(methods))


def _methods(methods: Iterable[str] | None) -> frozenset[str] | None:
    if not methods:
        return None
    return frozenset(str(getattr(m, "value", m)).upper() for m in methods)


class RouteTable:
    """Routes in matching order. ``lookup`` returns (route, params) or the reason for no match."""

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        self.routes: list[Route] = []
        for r in routes:
            self.add(r)

    def add(self, route: Route) -> None:
        self.routes.append(route)
        # Literal segments first, then constrained, plain, optional, catch-all; longer first.
        self.routes.sort(key=lambda r: (r.rank, -len(r.rank)))

    def lookup(self, method: str, path: str) -> tuple[Route | None, dict[str, str], set[str] | None]:
        """Return (route, route params, None) on a match; (None, {}, allowed methods) when
        the path matches but not the method (405); (None, {}, None) when nothing matches (404)."""
        allowed: set[str] = set()
        method = method.upper()
        for r in self.routes:
            values = r.match(path)
            if values is None:
                continue
            if r.methods is None or method in r.methods:
                return r, values, None
            allowed |= r.methods
        return None, {}, (allowed or None)
