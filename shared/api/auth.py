"""Who may use the operator routes: search, retry, cancel, terminate, the console, its overview
and its dead letters.

Two modes, by the setting ``OperatorAuth``:

* ``key`` (the default): the routes are ADMIN routes; the Functions host lets a request in only
  with the master key (``x-functions-key`` header or ``?code=``).
* ``appService``: App Service authentication ("Easy Auth", e.g. Microsoft Entra ID with
  "require authentication") is the gate. The routes are anonymous to the host, and each checks
  the principal App Service passes in ``X-MS-CLIENT-PRINCIPAL`` (base64 JSON with its claims).
  App Service does not let a request from outside set that header while authentication is on;
  with authentication off, anyone could, so this mode refuses to run then: while
  ``WEBSITE_AUTH_ENABLED`` (set by App Service) is not ``True``, every operator route answers 503
  (``easy_auth_off``).
  ``OperatorRole``, when set, must be one of the principal's roles (an app role or a group id)
  to act. ``ViewerRole``, when set, is a role that may only read (search, history, the console's
  views, the dead letters): an operator may read too.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from shared.api.http import HttpResult, lower_headers, problem

# App Service sets this app setting to "True" when its authentication is on (docs/local-stack.md
# cites the page); the appService mode answers 503 while it says otherwise (``easy_auth_off``).
EASY_AUTH_SETTING = "WEBSITE_AUTH_ENABLED"
KEY = "key"
APP_SERVICE = "appService"
MODES = (KEY, APP_SERVICE)
PRINCIPAL_HEADER = "x-ms-client-principal"
# Claim types App Service uses for roles when the principal names none (``role_typ``), and groups.
ROLE_CLAIMS = frozenset({"roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role", "groups"})


def mode_of(value: str) -> str:
    """The mode a setting value names; anything else stops the start, naming the setting."""
    if value not in MODES:
        raise ValueError(f"app setting OperatorAuth is {value!r}: it must be one of {', '.join(MODES)}")
    return value


def easy_auth_off(mode: str, enabled: str | None) -> HttpResult | None:
    """The 503 every operator route answers in the ``appService`` mode while App Service
    authentication is off (``enabled``: the value of ``WEBSITE_AUTH_ENABLED``, None if unset); None
    when the mode may run. Without that authentication a client's own ``X-MS-CLIENT-PRINCIPAL``
    would reach the app: anyone could claim any role."""
    # (read as the host reads it: .NET's bool.TryParse, EnvironmentExtensions.IsEasyAuthEnabled)
    if mode != APP_SERVICE or (enabled or "").strip().lower() == "true":
        return None
    shown = "unset" if enabled is None else repr(enabled)
    return problem(503, "easy-auth-off", "App Service authentication is off",
                   f"OperatorAuth is {APP_SERVICE}, but {EASY_AUTH_SETTING} is {shown}: turn App Service "
                   f"authentication on, or set OperatorAuth to {KEY}", setting=EASY_AUTH_SETTING)


def denied(mode: str, role: str, headers: Mapping[str, str], viewer_role: str | None = None) -> HttpResult | None:
    """None when the request may use an operator route, else the 401/403 to answer. ``role``: the
    role that may act (empty: any signed-in user); ``viewer_role``: for a route that only reads,
    the role that may read as well (None: the route acts)."""
    if mode == KEY:
        return None  # the host checked the key before the function ran
    lowered = lower_headers(headers)
    raw = lowered.get(PRINCIPAL_HEADER)
    if not raw:
        return problem(401, "unauthenticated", "Sign-in required",
                       "this operator route needs a signed-in user (App Service authentication)")
    principal = _decode(raw)
    if principal is None:
        return problem(401, "unauthenticated", "Unreadable principal",
                       f"the {PRINCIPAL_HEADER} header is not base64 JSON")
    has = roles_of(principal)
    if not role or role in has or (viewer_role and viewer_role in has):
        return None
    if viewer_role:
        return problem(403, "forbidden", "Neither an operator nor a viewer",
                       f"the signed-in user has neither the role {role} nor {viewer_role}")
    return problem(403, "forbidden", "Not an operator", f"the signed-in user does not have the role {role}"
                   + (": a viewer may only read" if viewer_role is not None else ""))


def may_act(mode: str, role: str, headers: Mapping[str, str]) -> bool:
    """Whether the caller of a read route may also act (the console hides what it may not do)."""
    return denied(mode, role, headers) is None


NAME_HEADER = "x-ms-client-principal-name"
NAME_CLAIMS = ("name", "preferred_username", "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name",
               "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/upn")
MAX_ACTOR = 256


def actor_of(mode: str, headers: Mapping[str, str]) -> str:
    """Who is acting, as the history records it (``by``): ``key`` in the key mode (whoever holds the
    master key); in the ``appService`` mode the signed-in user's name (App Service's
    ``X-MS-CLIENT-PRINCIPAL-NAME``, else the principal's name claim), else its user id."""
    if mode == KEY:
        return "key"
    lowered = lower_headers(headers)
    name = (lowered.get(NAME_HEADER) or "").strip()
    principal = _decode(lowered.get(PRINCIPAL_HEADER) or "") or {}
    if not name:
        raw_claims = principal.get("claims")
        claims = raw_claims if isinstance(raw_claims, list) else []
        wanted = (str(principal.get("name_typ") or ""), *NAME_CLAIMS)
        found = {str(c.get("typ")): str(c.get("val")) for c in claims if isinstance(c, dict)}
        name = next((found[t] for t in wanted if found.get(t)), "")
    return (name or str(principal.get("userId") or "") or "unknown")[:MAX_ACTOR]


def roles_of(principal: Mapping[str, Any]) -> set[str]:
    """The principal's role and group claim values."""
    types = ROLE_CLAIMS | {str(principal.get("role_typ") or "roles")}
    claims = principal.get("claims")
    if not isinstance(claims, list):
        return set()
    return {str(c.get("val")) for c in claims if isinstance(c, dict) and c.get("typ") in types}


def _decode(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(base64.b64decode(raw, validate=False))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None
