"""The one FunctionApp: registers the blueprints of functions/ (orders, scheduler, agents,
supervisor, retention, the operator console, bulk operations, webhook deliveries, the OpenAPI document
of the HTTP API, and the fallback route that answers every other request under /api). All logic lives
in shared/."""

import azure.functions as func

from functions import (
    agents,
    console,
    fallback,
    openapi,
    operations,
    orders,
    retention,
    scheduler,
    supervisor,
    webhooks,
)
from shared.core.workflows import load_registry
from shared.observability import telemetry
from shared.settings import Settings

# A required setting that is missing (the remote services' URLs have no safe default) stops the
# start here, at indexing, with a message naming it, rather than at the first invocation.
# So does a broken workflow file (workflows/*.yaml): the error names the file, the path inside
# it and the reason.
load_registry(Settings.from_env()["WorkflowsPath"])
# OpenTelemetry, once per worker: Azure Monitor when its connection string is set (shared/observability/telemetry.py).
telemetry.setup()

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)

app.register_functions(orders.bp)
app.register_functions(scheduler.bp)
app.register_functions(agents.bp)
app.register_functions(supervisor.bp)
app.register_functions(retention.bp)
app.register_functions(openapi.bp)
app.register_functions(console.bp)
app.register_functions(operations.bp)
app.register_functions(webhooks.bp)
# A path under /api that no function above takes, or a method its route does not take: 404 or
# 405 problem+json (functions/fallback.py), from the routes of the blueprints registered above
# (all of them: tests/unit/functions/test_fallback.py fails when a route is left out).
unmatched_routes = fallback.blueprint([orders.bp, scheduler.bp, agents.bp, supervisor.bp, retention.bp, openapi.bp,
                                       console.bp, operations.bp, webhooks.bp], app.auth_level)
app.register_functions(unmatched_routes)
