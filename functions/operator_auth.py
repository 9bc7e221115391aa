"""The operator routes' gate (``shared.api.auth``): the auth level the host enforces on
them, and a decorator that checks the App Service principal in the ``appService`` mode, and
answers 503 there while App Service authentication is off (``WEBSITE_AUTH_ENABLED``). All are
fixed when the worker indexes the app, from the settings it starts with; the refusal is logged
once, then."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

import azure.functions as func

from functions.http import to_response
from shared.api import auth as operator_auth
from shared.api.http import HttpResult
from shared.settings import setting_from_env

Handler = Callable[[func.HttpRequest], func.HttpResponse]

MODE = operator_auth.mode_of(setting_from_env("OperatorAuth"))
ROLE = setting_from_env("OperatorRole").strip()
VIEWER = setting_from_env("ViewerRole").strip()
LEVEL = func.AuthLevel.ANONYMOUS if MODE == operator_auth.APP_SERVICE else func.AuthLevel.ADMIN
OFF = operator_auth.easy_auth_off(MODE, os.environ.get(operator_auth.EASY_AUTH_SETTING))
if OFF is not None:
    logging.getLogger(__name__).error("operator routes refused (503): %s", OFF.body["detail"])


def guard(mode: str, role: str, viewer_role: str | None = None,
          off: HttpResult | None = None) -> Callable[[Handler], Handler]:
    """A decorator that answers before ``handler``: ``off`` (the mode may not run) when given, else
    401/403 when ``mode`` says the request may not; ``viewer_role``: a route that only reads, which
    that role may use too."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def guarded(req: func.HttpRequest) -> func.HttpResponse:
            refused = off or operator_auth.denied(mode, role, req.headers, viewer_role)
            return to_response(refused) if refused is not None else handler(req)

        return guarded

    return decorate


operator_only = guard(MODE, ROLE, off=OFF)  # a route that acts
reader_only = guard(MODE, ROLE, VIEWER, off=OFF)  # a route that only reads: a viewer may use it too


def may_act(req: func.HttpRequest) -> bool:
    """Whether the caller may act (a viewer may not): the console shows the actions it may use."""
    return operator_auth.may_act(MODE, ROLE, req.headers)


def actor(req: func.HttpRequest) -> str:
    """Who acts through ``req`` (recorded as ``by`` on every event its action writes)."""
    return operator_auth.actor_of(MODE, req.headers)
