"""`import function_app` indexes every function; every queue name comes from a %Setting%."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from local.procs import REPO_ROOT
from shared.core.workflows import AGENTS
from shared.settings import QUEUE_SETTINGS, SERVICE_BUS_CONNECTION, SETTING_NAMES
from tests.indexed import indexed_functions
from tests.unit.harness import REQUIRED_VALUES


def _functions() -> dict[str, dict]:
    return indexed_functions()


def _trigger(fn: dict) -> dict:
    return next(b for b in fn["bindings"] if b["type"].endswith("Trigger"))


def test_http_functions() -> None:
    http = {(tuple(_trigger(f)["methods"]), _trigger(f)["route"]): _trigger(f)["authLevel"]
            for f in _functions().values() if _trigger(f)["type"] == "httpTrigger"}
    assert http == {
        (("POST",), "orders"): "FUNCTION",
        (("GET",), "orders/{id}"): "FUNCTION",
        (("POST",), "orders/{id}/retry"): "ADMIN",
        (("POST",), "orders/{id}/cancel"): "ADMIN",
        (("POST",), "orders/{id}/terminate"): "ADMIN",
        (("POST",), "orders/{id}/suspend"): "ADMIN",
        (("POST",), "orders/{id}/resume"): "ADMIN",
        (("POST",), "orders/{id}/events/{name}"): "ADMIN",
        (("GET",), "orders"): "ADMIN",
        (("GET",), "orders/{id}/history"): "FUNCTION",
        (("GET",), "workflows"): "FUNCTION",
        (("GET",), "openapi.yaml"): "ANONYMOUS",
        (("GET",), "console"): "ADMIN",
        (("GET",), "console/assets/{name}"): "ANONYMOUS",
        (("GET",), "overview"): "ADMIN",
        (("GET",), "console/caller"): "ADMIN",
        (("GET",), "console/orders/{id}"): "ADMIN",
        (("GET",), "console/orders/{id}/history"): "ADMIN",
        (("GET",), "deadletters"): "ADMIN",
        (("POST",), "operations"): "ADMIN",
        (("GET",), "operations/{id}"): "ADMIN",
        (("POST",), "deadletters/{queue}/{sequenceNumber}/resubmit"): "ADMIN",
        (("POST",), "deadletters/{queue}/{sequenceNumber}/discard"): "ADMIN",
        # The fallback: every other request under /api (functions/fallback.py, tests/unit/functions/test_fallback.py).
        (("GET", "POST", "DELETE", "HEAD", "PATCH", "PUT", "OPTIONS"), "{*path}"): "ANONYMOUS",
        # Webhook deliveries (functions/webhooks.py): the failed ones, and a resend.
        (("GET",), "webhooks"): "ADMIN",
        (("POST",), "orders/{id}/webhooks/{delivery}/resend"): "ADMIN",
    }


def test_service_bus_triggers_scheduler_and_one_per_agent_on_every_lane() -> None:
    from shared.core.workflows.lanes import LANES

    queues = sorted(_trigger(f)["queueName"] for f in _functions().values()
                    if _trigger(f)["type"] == "serviceBusTrigger")
    expected = sorted(f"%{lane.setting(s)}%" for lane in LANES
                      for s in ("SchedulerQueue", "RepliesQueue", *(a.queue_setting for a in AGENTS)))
    expected = sorted([*expected, "%WebhooksQueue%"])  # the webhook deliveries' (not laned)
    assert "%SchedulerQueueHigh%" in expected
    assert queues == expected
    # workflows/agents.json declares four agents; each is one generated function on its queue.
    agents = {name: _trigger(f)["queueName"] for name, f in _functions().items() if name.startswith("agent_")}
    # And each has a copy per priority lane of workflows/lanes.json (normal: the queue itself; high).
    assert agents == {"agent_inventory": "%InventoryQueue%", "agent_payment": "%PaymentQueue%",
                      "agent_shipping": "%ShippingQueue%", "agent_delivery": "%DeliveryQueue%",
                      "agent_inventory_high": "%InventoryQueueHigh%", "agent_payment_high": "%PaymentQueueHigh%",
                      "agent_shipping_high": "%ShippingQueueHigh%", "agent_delivery_high": "%DeliveryQueueHigh%"}
    for f in _functions().values():
        t = _trigger(f)
        if t["type"] == "serviceBusTrigger":
            assert t["connection"] == SERVICE_BUS_CONNECTION
            # The host completes and abandons; the function only dead-letters poison (functions/settlement.py).
            assert t["autoCompleteMessages"] is True


def test_timers_supervisor_and_retention() -> None:
    timers = [_trigger(f) for f in _functions().values() if _trigger(f)["type"] == "timerTrigger"]
    assert sorted(t["schedule"] for t in timers) == ["%RetentionSchedule%", "%SupervisorSchedule%"]
    assert all(t["runOnStartup"] is False for t in timers)


def test_every_queue_name_is_a_declared_setting() -> None:
    queue_setting_names = {s.name for s in QUEUE_SETTINGS}
    for fn in _functions().values():
        for b in fn["bindings"]:
            if "queueName" in b:
                m = re.fullmatch(r"%(\w+)%", b["queueName"])
                assert m, b
                assert m.group(1) in queue_setting_names and m.group(1) in SETTING_NAMES


def test_host_json() -> None:

    host = json.loads((REPO_ROOT / "host.json").read_text())
    assert host["version"] == "2.0"
    assert host["extensionBundle"] == {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.*, 5.0.0)"}
    sb = host["extensions"]["serviceBus"]
    assert sb["autoCompleteMessages"] is True
    assert {"maxConcurrentCalls", "prefetchCount", "maxAutoLockRenewalDuration"} <= set(sb)
    assert host["extensions"]["http"]["routePrefix"] == "api"


def test_local_settings_example_has_every_setting() -> None:

    values = json.loads((REPO_ROOT / "local.settings.json.example").read_text())["Values"]
    assert SETTING_NAMES <= set(values)
    assert values["FUNCTIONS_WORKER_RUNTIME"] == "python" and "AzureWebJobsStorage" in values


def test_indexing_stops_on_a_missing_required_setting_and_names_it() -> None:
    env = {k: v for k, v in os.environ.items() if k not in REQUIRED_VALUES}
    env["PaymentServiceUrl"] = "http://payment.invalid"
    proc = subprocess.run([sys.executable, "-c", "import function_app"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "InventoryServiceUrl" in proc.stderr and "ShippingServiceUrl" in proc.stderr
    assert "DeliveryServiceUrl" in proc.stderr
    assert "PaymentServiceUrl" not in proc.stderr.splitlines()[-1]


def test_indexing_stops_on_a_bad_token_key_and_names_the_setting_not_the_value() -> None:
    short = "c2hvcnQta2V5LW9mLTE2LWI="  # 17 bytes: fewer than 32
    env = {**os.environ, **REQUIRED_VALUES, "TokenKeys": short}
    proc = subprocess.run([sys.executable, "-c", "import function_app"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.splitlines()[-1]
    assert "app setting TokenKeys: the current key has 17 bytes, fewer than 32" in last, proc.stderr[-2000:]
    assert short not in proc.stderr


def test_indexing_stops_on_a_broken_workflow_file_and_names_it(tmp_path: Path) -> None:
    """A workflow file the loader rejects stops the start at import, like a missing setting."""
    shipped = REPO_ROOT / "workflows"
    for name in ("order.v1.yaml", "digital.v1.yaml"):
        (tmp_path / name).write_text((shipped / name).read_text())
    broken = (tmp_path / "digital.v1.yaml").read_text().replace("agent: delivery", "agent: courier")
    (tmp_path / "digital.v1.yaml").write_text(broken)
    env = {**os.environ, **REQUIRED_VALUES, "WorkflowsPath": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", "import function_app"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "digital.v1.yaml: steps[2].agent: unknown agent 'courier'" in proc.stderr, proc.stderr[-2000:]


_OPERATOR_ROUTES = ["search_orders", "retry_order", "cancel_order", "terminate_order", "console", "overview",
                    "deadletters", "start_operation", "get_operation", "deadletter_resubmit", "deadletter_discard",
                    "console_order", "console_order_history", "console_caller"]
_LEVELS = ("import json, function_app; print(json.dumps({f.get_function_name(): [b.get('authLevel') "
           "for b in json.loads(f.get_function_json())['bindings'] if b['type'] == 'httpTrigger'][0] "
           "for f in function_app.app.get_functions() if 'httpTrigger' in f.get_function_json()}))")


def test_with_app_service_authentication_the_operator_routes_are_left_to_it() -> None:
    """OperatorAuth=appService: the host no longer asks for the master key on the operator routes
    (each route checks the signed-in principal itself, tests/unit/api/test_auth.py); the
    order routes keep their function key."""
    env = {**os.environ, **REQUIRED_VALUES, "OperatorAuth": "appService", "WEBSITE_AUTH_ENABLED": "True"}
    proc = subprocess.run([sys.executable, "-c", _LEVELS], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    levels = json.loads(proc.stdout.splitlines()[-1])
    assert {name: levels[name] for name in _OPERATOR_ROUTES} == dict.fromkeys(_OPERATOR_ROUTES, "ANONYMOUS")
    assert levels["submit_order"] == "FUNCTION" and levels["get_order"] == "FUNCTION"
    assert levels["order_history"] == "FUNCTION"  # the console reads its own copies: console_order(_history)
    assert {name: _trigger(fn)["authLevel"] for name, fn in _functions().items() if name in _OPERATOR_ROUTES} \
        == dict.fromkeys(_OPERATOR_ROUTES, "ADMIN")


def test_indexing_stops_on_an_unknown_operator_auth_mode() -> None:
    env = {**os.environ, **REQUIRED_VALUES, "OperatorAuth": "easyauth"}
    proc = subprocess.run([sys.executable, "-c", "import function_app"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "OperatorAuth" in proc.stderr.splitlines()[-1]
