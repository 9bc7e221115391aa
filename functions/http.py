"""The one conversion of ``shared.api.http.HttpResult`` into the host's ``HttpResponse``."""

from __future__ import annotations

import azure.functions as func

from shared.api.http import HttpResult


def to_response(result: HttpResult) -> func.HttpResponse:
    return func.HttpResponse(body=result.encoded(), status_code=result.status, headers=result.headers,
                             mimetype=result.content_type, charset="utf-8")
