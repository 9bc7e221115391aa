"""The one FunctionApp: registers the blueprints of functions/ (orders, scheduler, agents,
supervisor, retention, the operator console, and the OpenAPI document of the HTTP API). All logic
lives in shared/."""

import azure.functions as func

from functions import agents, console, openapi, orders, retention, scheduler, supervisor
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
