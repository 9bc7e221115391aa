import asyncio
import json
import logging
import os
import threading
import time
from pathlib import Path

import azure.functions as func

bp = func.Blueprint()
_lock = threading.Lock()
_active = {"n": 0}


def record(kind: str, **data) -> None:
    data.update(kind=kind, instance=os.environ.get("WEBSITE_INSTANCE_ID"), pid=os.getpid(), at=time.time())
    path = Path(os.environ["SampleRecordDir"]) / f"{kind}.jsonl"
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(data, default=str) + "\n")


@bp.route(route="items/{id:int}", methods=["GET"])
def get_item(req: func.HttpRequest) -> func.HttpResponse:
    body = {"id": int(req.route_params["id"]), "params": dict(req.params),
            "instance": os.environ.get("WEBSITE_INSTANCE_ID"), "url": req.url,
            "greeting": os.environ.get("Greeting")}
    return func.HttpResponse(json.dumps(body), mimetype="application/json", headers={"X-Sample": "yes"})


@bp.route(route="echo", methods=["POST", "PUT"])
def echo(req: func.HttpRequest) -> func.HttpResponse:
    logging.info("echo got %d bytes", len(req.get_body()))
    return func.HttpResponse(req.get_body(), status_code=201,
                             mimetype=req.headers.get("Content-Type", "application/octet-stream"),
                             headers={"X-Method": req.method})


@bp.route(route="hello/{name?}")
async def hello(req: func.HttpRequest) -> func.HttpResponse:
    await asyncio.sleep(0.01)
    return func.HttpResponse(f"hello {req.route_params.get('name', 'nobody')}")


@bp.route(route="boom", methods=["GET"])
def boom(req: func.HttpRequest) -> func.HttpResponse:
    raise RuntimeError("boom on purpose")


@bp.route(route="thread/sync", methods=["GET"])
def thread_sync(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id()}))


@bp.route(route="thread/async", methods=["GET"])
async def thread_async(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id()}))


@bp.route(route="orders/{order_id:guid}/lines/{line}", methods=["GET"])
def order_line(req: func.HttpRequest, context: func.Context) -> str:
    return f"{req.route_params['order_id']}|{req.route_params['line']}|{context.function_name}"


@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%InQueue%", connection="ServiceBusConnection")
@bp.service_bus_queue_output(arg_name="out", queue_name="%OutQueue%", connection="ServiceBusConnection")
def on_message(msg: func.ServiceBusMessage, out: func.Out[str]) -> None:
    body = msg.get_body().decode("utf-8")
    record("received", body=body, message_id=msg.message_id, correlation_id=msg.correlation_id,
           reply_to=msg.reply_to, delivery_count=msg.delivery_count, content_type=msg.content_type,
           enqueued=msg.enqueued_time_utc.isoformat() if msg.enqueued_time_utc else None,
           props=msg.application_properties)
    out.set(f"forwarded:{body}")


@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%PoisonQueue%", connection="ServiceBusConnection")
def always_fails(msg: func.ServiceBusMessage) -> None:
    record("poison", message_id=msg.message_id, delivery_count=msg.delivery_count)
    raise ValueError(f"cannot handle {msg.message_id}")


@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%SlowQueue%", connection="ServiceBusConnection")
async def slow(msg: func.ServiceBusMessage) -> None:
    with _lock:
        _active["n"] += 1
        now_active = _active["n"]
    record("slow-start", message_id=msg.message_id, delivery_count=msg.delivery_count, active=now_active)
    await asyncio.sleep(float(os.environ.get("SlowSeconds", "1")))
    with _lock:
        _active["n"] -= 1
    record("slow-end", message_id=msg.message_id)


@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%SessionQueue%", connection="ServiceBusConnection",
                              is_sessions_enabled=True)
def in_session(msg: func.ServiceBusMessage) -> None:
    record("session-start", session_id=msg.session_id, body=msg.get_body().decode())
    time.sleep(0.05)
    record("session-end", session_id=msg.session_id, body=msg.get_body().decode())


@bp.timer_trigger(arg_name="timer", schedule="%TimerSchedule%", run_on_startup=False)
def tick(timer: func.TimerRequest) -> None:
    record("tick-start", past_due=timer.past_due)
    time.sleep(float(os.environ.get("TickSeconds", "0.3")))
    record("tick-end")


# An SDK-type binding (azurefunctions-extensions-bindings-servicebus): the SDK's message and a
# settlement client; autoCompleteMessages false, so the function settles as its body says.
import azurefunctions.extensions.bindings.servicebus as servicebus  # noqa: E402


@bp.service_bus_queue_trigger(arg_name="received", queue_name="%SettleQueue%", connection="ServiceBusConnection",
                              auto_complete_messages=False)
def settles_itself(received: servicebus.ServiceBusReceivedMessage,
                   message_actions: servicebus.ServiceBusMessageActions) -> None:
    body = b"".join(received.body).decode()
    todo = json.loads(body)
    # the action for this delivery: "then" from the second delivery on
    action = todo["then"] if received.delivery_count > 1 and "then" in todo else todo["do"]
    record("settle", body=body, message_id=received.message_id, delivery_count=received.delivery_count,
           lock_token=str(received.lock_token), reply_to=received.reply_to, sequence_number=received.sequence_number,
           enqueued=received.enqueued_time_utc.isoformat() if received.enqueued_time_utc else None,
           props={(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                  for k, v in (received.application_properties or {}).items()},
           type=type(received).__module__ + "." + type(received).__name__, action=action)
    if action == "complete":
        message_actions.complete(received)
    elif action == "deadletter":
        message_actions.deadletter(received, deadletter_reason=todo["reason"],
                                   deadletter_error_description=todo["description"])
    elif action == "abandon":
        message_actions.abandon(received)
    elif action == "twice":  # a second settlement of the same message fails
        message_actions.complete(received)
        try:
            message_actions.complete(received)
        except Exception as e:  # noqa: BLE001
            record("settle-error", message_id=received.message_id, error=type(e).__name__)
    elif action == "raise":
        raise ValueError("not settled: autoCompleteMessages is false, so the host leaves it locked")
    # "none": not settled; the lock expires and the broker delivers it again


# The same binding with autoCompleteMessages true (the app's triggers): the host completes a message
# its function returns and abandons one it raises on, unless the function settled it itself (the .NET
# processor auto-completes only ``!message.IsSettled``): here a dead-letter, as the app does for poison.
@bp.service_bus_queue_trigger(arg_name="received", queue_name="%SettleAutoQueue%", connection="ServiceBusConnection",
                              auto_complete_messages=True)
def settles_poison_only(received: servicebus.ServiceBusReceivedMessage,
                        message_actions: servicebus.ServiceBusMessageActions) -> None:
    todo = json.loads(b"".join(received.body).decode())
    action = todo["then"] if received.delivery_count > 1 and "then" in todo else todo["do"]
    record("settle-auto", message_id=received.message_id, delivery_count=received.delivery_count, action=action)
    if action in ("deadletter", "deadletter-then-raise"):
        message_actions.deadletter(received, deadletter_reason=todo["reason"],
                                   deadletter_error_description=todo["description"])
        if action == "deadletter-then-raise":
            raise ValueError("raised after the dead-letter: the host must not abandon a settled message")
    elif action == "raise":
        raise ValueError("abandoned by the host: autoCompleteMessages is true")
    # "return": completed by the host


@bp.route(route="open", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def open_route(req: func.HttpRequest) -> str:
    return "open"


@bp.route(route="secret", methods=["GET"], auth_level=func.AuthLevel.ADMIN)
def secret(req: func.HttpRequest) -> str:
    return "secret"
