"""GET /api/openapi.yaml (anonymous): the OpenAPI 3.1 description of the HTTP API.

The document is functions/openapi.yaml (shipped in the publish package with functions/);
it is read once per worker, on first use.
"""

from __future__ import annotations

from pathlib import Path

import azure.functions as func

from shared.core.once import once

SPEC_PATH = Path(__file__).with_name("openapi.yaml")
MEDIA_TYPE = "application/yaml"

bp = func.Blueprint()

@once
def spec_bytes() -> bytes:
    return SPEC_PATH.read_bytes()


@bp.function_name("openapi")
@bp.route(route="openapi.yaml", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def openapi(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(body=spec_bytes(), status_code=200, mimetype=MEDIA_TYPE, charset="utf-8",
                             headers={"Cache-Control": "public, max-age=300"})
