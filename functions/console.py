"""HTTP functions of the operator console (issue 12): the page, its static files, and the JSON
routes only it needs (who is looking, the overview, the dead letters and what an operator does to one).

* ``GET /api/console`` (ADMIN): ``console_static/index.html``. The page reads ``code`` from its
  own query string and sends it as ``x-functions-key`` on its API calls.
* ``GET /api/console/assets/{name}`` (ANONYMOUS: code, not data): a file of ``console_static/``
  that its ``manifest.json`` lists, else 404. The name is looked up among the manifest's
  entries, never joined to a path. Cache-Control, a sha256 ETag, and 304 for a matching
  If-None-Match.
* ``GET /api/console/caller`` (ADMIN): who is looking and whether they may act (``caller``),
  from the request alone: no storage, no Service Bus. The page reads it before its first view.
* ``GET /api/overview`` (ADMIN): ``shared.console.overview.get_overview``, with ``caller`` too.
* ``GET /api/console/orders/{id}`` and ``.../history`` (ADMIN): an order and its history, as
  ``GET /api/orders/{id}`` and ``.../history`` answer them. Those two are the clients' routes
  (FUNCTION level: a function key, which a signed-in operator does not have in the ``appService``
  mode); these are the console's, behind the operator gate like every other route it calls.
* ``GET /api/deadletters`` (ADMIN): ``shared.console.deadletters.get_dead_letters``.
* ``POST /api/deadletters/{queue}/{sequenceNumber}/resubmit`` and ``.../discard`` (ADMIN,
  operators only): ``shared.console.deadletter_actions.post_dead_letter_action``.

The files are read once per worker, on first use (they ship in the package with functions/).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import azure.functions as func

from functions.http import to_response
from functions.operator_auth import LEVEL as OPERATOR
from functions.operator_auth import actor, may_act, operator_only, reader_only
from shared.api.http import HttpResult, problem
from shared.api.orders import get_history, get_order
from shared.console.deadletters import get_dead_letters
from shared.core.once import once
from shared.runtime import get_runtime

STATIC_DIR = Path(__file__).with_name("console_static")
MANIFEST = "manifest.json"
PAGE = "index.html"
CONTENT_TYPES = {".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".html": "text/html",
                 ".json": "application/json", ".svg": "image/svg+xml", ".png": "image/png", ".ico": "image/x-icon",
                 ".woff2": "font/woff2", ".txt": "text/plain"}
ASSET_CACHE = "public, max-age=300"
# The page is the admin's: not cached, not framed, no referrer (its URL may hold ?code=), and
# nothing but this origin's scripts, styles and API (no CDN: every library is vendored).
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'self'",
}

bp = func.Blueprint()


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def content_type_of(name: str) -> str:
    return CONTENT_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")


def load_assets(static_dir: Path = STATIC_DIR) -> dict[str, Asset]:
    """The files ``manifest.json`` lists (flat names only), read and hashed, by name."""
    listed = json.loads((static_dir / MANIFEST).read_text(encoding="utf-8")).get("files", {})
    by_name = {entry.name: entry for entry in static_dir.iterdir() if entry.is_file()}
    assets: dict[str, Asset] = {}
    for name in listed:
        entry = by_name.get(name)  # the directory's own entry of that name: no path is built from it
        if entry is None:
            continue
        body = entry.read_bytes()
        assets[name] = Asset(body, content_type_of(name), f'"{hashlib.sha256(body).hexdigest()}"')
    return assets


@once
def assets() -> dict[str, Asset]:
    return load_assets()


def asset_response(name: str | None, if_none_match: str | None) -> func.HttpResponse:
    """The listed file ``name`` (304 when ``if_none_match`` holds its ETag), else 404."""
    asset = assets().get(name or "")
    if asset is None:
        return to_response(problem(404, "not-found", "Not found", "no such console file"))
    headers = {"Cache-Control": ASSET_CACHE, "ETag": asset.etag, "X-Content-Type-Options": "nosniff"}
    tags = [tag.strip() for tag in (if_none_match or "").split(",")]
    if asset.etag in tags or "*" in tags:
        return func.HttpResponse(status_code=304, headers=headers)
    return func.HttpResponse(body=asset.body, status_code=200, headers=headers, mimetype=asset.content_type,
                             charset="utf-8")


def page_response() -> func.HttpResponse:
    page = (STATIC_DIR / PAGE).read_bytes()
    return func.HttpResponse(body=page, status_code=200, headers=dict(PAGE_HEADERS), mimetype="text/html",
                             charset="utf-8")


@bp.function_name("console")
@bp.route(route="console", methods=["GET"], auth_level=OPERATOR)
@reader_only
def console(req: func.HttpRequest) -> func.HttpResponse:
    return page_response()


@bp.function_name("console_asset")
@bp.route(route="console/assets/{name}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def console_asset(req: func.HttpRequest) -> func.HttpResponse:
    return asset_response(req.route_params.get("name"), req.headers.get("If-None-Match"))


def caller(req: func.HttpRequest) -> dict[str, object]:
    """Who is looking, and whether they may act (a viewer may not: the console hides the actions)."""
    return {"by": actor(req), "canAct": may_act(req)}


@bp.function_name("console_caller")
@bp.route(route="console/caller", methods=["GET"], auth_level=OPERATOR)
@reader_only
def console_caller(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(HttpResult(200, caller(req)))


@bp.function_name("overview")
@bp.route(route="overview", methods=["GET"], auth_level=OPERATOR)
@reader_only
def overview(req: func.HttpRequest) -> func.HttpResponse:
    from shared.console.overview import get_overview

    result: HttpResult = get_overview(get_runtime())
    if result.status == 200 and isinstance(result.body, dict):
        result = replace(result, body={**result.body, "caller": caller(req)})
    return to_response(result)


@bp.function_name("console_order")
@bp.route(route="console/orders/{id}", methods=["GET"], auth_level=OPERATOR)
@reader_only
def console_order(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(get_order(get_runtime(), req.route_params.get("id")))


@bp.function_name("console_order_history")
@bp.route(route="console/orders/{id}/history", methods=["GET"], auth_level=OPERATOR)
@reader_only
def console_order_history(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(get_history(get_runtime(), req.route_params.get("id"), dict(req.params)))


@bp.function_name("deadletters")
@bp.route(route="deadletters", methods=["GET"], auth_level=OPERATOR)
@reader_only
def deadletters(req: func.HttpRequest) -> func.HttpResponse:
    return to_response(get_dead_letters(get_runtime(), dict(req.params)))


def dead_letter_action(req: func.HttpRequest, action: str) -> func.HttpResponse:
    from shared.console.deadletter_actions import post_dead_letter_action

    return to_response(post_dead_letter_action(get_runtime(), req.route_params.get("queue"),
                                               req.route_params.get("sequenceNumber"), action, by=actor(req)))


@bp.function_name("deadletter_resubmit")
@bp.route(route="deadletters/{queue}/{sequenceNumber}/resubmit", methods=["POST"], auth_level=OPERATOR)
@operator_only
def deadletter_resubmit(req: func.HttpRequest) -> func.HttpResponse:
    return dead_letter_action(req, "resubmit")


@bp.function_name("deadletter_discard")
@bp.route(route="deadletters/{queue}/{sequenceNumber}/discard", methods=["POST"], auth_level=OPERATOR)
@operator_only
def deadletter_discard(req: func.HttpRequest) -> func.HttpResponse:
    return dead_letter_action(req, "discard")
