"""GET /api/openapi.yaml (anonymous): the OpenAPI 3.1 description of the HTTP API.

The document is functions/openapi.yaml (shipped in the publish package with functions/);
it is read once per worker, on first use.
"""

from __future__ import annotations

from pathlib import Path

import azure.functions as func

SPEC_PATH = Path(__file__).with_name("openapi.yaml")
MEDIA_TYPE = "application/yaml"

bp = func.Blueprint()

_spec: bytes | None = None


def spec_bytes() -> bytes:
    global _spec
    if _spec is None:
        _spec = SPEC_PATH.read_bytes()
    return _spec


@bp.function_name("openapi")
@bp.route(route="openapi.yaml", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def openapi(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(body=spec_bytes(), status_code=200, mimetype=MEDIA_TYPE, charset="utf-8",
                             headers={"Cache-Control": "public, max-age=300"})
