"""SDK-type Service Bus bindings: what the Functions host does for them, here.

With ``azurefunctions-extensions-bindings-servicebus`` a function's trigger parameter is the SDK's
``ServiceBusReceivedMessage`` and another parameter, a ``ServiceBusMessageActions``, settles it.
The pieces, as the real host and worker play them:

* **Binding data.** The host sends the trigger parameter as ``model_binding_data`` (version
  ``1.0``, source ``AzureServiceBusReceivedMessage``, ``application/octet-stream``): the content is
  the message's 16-byte lock token (a GUID's bytes, little-endian) + ``b"x-opt-lock-token"`` + the
  whole AMQP message, encoded. The .NET SDK the host uses counts the delivery in the AMQP header
  (1 the first time). :func:`model_binding_data` builds that from the Python SDK's received
  message; the extension's own converter decodes it (``trigger_value``), as the worker calls it.
* **Settlement.** The host runs a gRPC ``Settlement`` service (the extension's
  ``settlement.proto``) next to its worker channel and starts the worker with ``--host H --port P
  --functions-grpc-max-message-length N``; ``ServiceBusMessageActions.get_instance()`` reads those
  from the worker's argv and calls Complete, Abandon, Deadletter (reason, description), Defer or
  RenewMessageLock with the lock token. :class:`SettlementServer` serves it in each instance and
  settles with the receiver that holds the message (``ServiceBusHost.settle_held``). Sessions'
  calls (session state, release, renew) answer UNIMPLEMENTED; ``propertiesToModify`` is ignored.
* **The settlement parameter.** The worker passes the client to the one parameter that no binding
  names whose annotation is a ``GrpcClientType`` (``get_settlement_client``): ``settlement_param``.

Everything from the extension is imported lazily: an app that does not use it does not need it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("local.host.settlement")

SOURCE = "AzureServiceBusReceivedMessage"
LOCK_TOKEN_MARK = b"x-opt-lock-token"
CLIENT_BINDING = "serviceBusClient"  # the extension's converter that hands out the settlement client
DEFAULT_MAX_MESSAGE_LENGTH = 2147483647  # what the host passes as --functions-grpc-max-message-length
SETTLE_WAIT = 60.0  # a gRPC call waits at most this long for its settlement on the event loop


def registry() -> Any:
    """The deferred-binding registry of ``azurefunctions-extensions-base`` (the worker's
    ``DEFERRED_BINDING_REGISTRY``), or None when the package is not installed."""
    try:
        from azurefunctions.extensions.base import get_binding_registry
    except ImportError:
        return None
    return get_binding_registry()


def is_sdk_type(binding_type: str, annotation: Any) -> bool:
    """Whether the worker would bind this trigger parameter as an SDK type (deferred binding)."""
    reg = registry()
    return reg is not None and reg.get(binding_type) is not None and reg.check_supported_type(annotation)


def settlement_param(params: list[str], annotations: dict[str, Any]) -> str | None:
    """The worker's ``validate_settlement_param``: the one parameter no binding names, if its
    annotation is a gRPC client type (``ServiceBusMessageActions``)."""
    reg = registry()
    if reg is None or len(params) != 1:
        return None
    ann = annotations.get(params[0], inspect.Parameter.empty)
    return params[0] if reg.check_supported_grpc_client_type(ann) else None


def settlement_client() -> Any:
    """The client the worker passes to the settlement parameter (``get_settlement_client``)."""
    return registry().get(CLIENT_BINDING).get_client()


# ----------------------------------------------------------------------------- binding data


@dataclass(frozen=True)
class ModelBindingData:
    """The host's ``ModelBindingData`` (what the worker's Datum carries for ``model_binding_data``)."""

    content: bytes
    version: str = "1.0"
    source: str = SOURCE
    content_type: str = "application/octet-stream"


def lock_token_bytes(token: Any) -> bytes:
    """The lock token as the host writes it: the GUID's bytes, little-endian (``Guid.ToByteArray``)."""
    return (token if isinstance(token, uuid.UUID) else uuid.UUID(str(token))).bytes_le


def encode_amqp(msg: Any, delivery_count: int | None) -> bytes:
    """The received message's AMQP sections, encoded (``AmqpAnnotatedMessage.ToBytes`` of the
    host's SDK), with ``delivery_count`` in the header as the host's SDK counts it."""
    import uamqp
    from uamqp.constants import MessageBodyType
    from uamqp.message import MessageHeader, MessageProperties

    raw = msg.raw_amqp_message
    header = MessageHeader()
    h = raw.header
    if h is not None:
        header.time_to_live = h.time_to_live
        header.durable = h.durable
        header.first_acquirer = h.first_acquirer
        header.priority = h.priority
    header.delivery_count = delivery_count
    p = raw.properties
    properties = None
    if p is not None:
        properties = MessageProperties(
            message_id=p.message_id, user_id=p.user_id, to=p.to, subject=p.subject, reply_to=p.reply_to,
            correlation_id=p.correlation_id, content_type=p.content_type, content_encoding=p.content_encoding,
            absolute_expiry_time=p.absolute_expiry_time, creation_time=p.creation_time, group_id=p.group_id,
            group_sequence=p.group_sequence, reply_to_group_id=p.reply_to_group_id)
    body_type = str(getattr(raw.body_type, "value", raw.body_type)).lower()
    if body_type == "value":
        body, kind = raw.body, MessageBodyType.Value
    elif body_type == "sequence":
        body, kind = list(raw.body), MessageBodyType.Sequence
    else:
        body, kind = b"".join(bytes(part) for part in raw.body), MessageBodyType.Data
    message = uamqp.Message(body=body, body_type=kind, properties=properties, header=header,
                            application_properties=dict(raw.application_properties or {}) or None,
                            annotations=dict(raw.annotations or {}) or None,
                            delivery_annotations=dict(raw.delivery_annotations or {}) or None,
                            footer=dict(raw.footer or {}) or None)
    return bytes(message.encode_message())


def model_binding_data(msg: Any, delivery_count: int | None) -> ModelBindingData:
    """The trigger parameter's binding data for one received message (module docstring)."""
    return ModelBindingData(lock_token_bytes(msg.lock_token) + LOCK_TOKEN_MARK + encode_amqp(msg, delivery_count))


def trigger_value(binding_type: str, data: ModelBindingData, annotation: Any, trigger_metadata: dict[str, Any]) -> Any:
    """The SDK-type argument, decoded by the extension's converter as the worker decodes it."""
    from azurefunctions.extensions.base import Datum

    converter = registry().get(binding_type)
    return converter.decode(Datum(data, "model_binding_data"), trigger_metadata=trigger_metadata, pytype=annotation)


# ----------------------------------------------------------------------------- the gRPC service

# (action, lock token, keyword arguments) -> the settlement, run on the instance's event loop
Settle = Callable[[str, str, dict[str, Any]], Coroutine[Any, Any, None]]


class UnknownLockToken(LookupError):
    """No message with this lock token is held here (settled already, or never delivered here)."""


class SettlementServer:
    """The ``Settlement`` gRPC service of one instance (the host's, in Azure)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settle: Settle, host: str, port: int,
                 max_message_length: int = DEFAULT_MAX_MESSAGE_LENGTH, threads: int = 32) -> None:
        import grpc
        from azurefunctions.extensions.bindings.protos import settlement_pb2_grpc

        options = [("grpc.max_send_message_length", max_message_length),
                   ("grpc.max_receive_message_length", max_message_length)]
        self.server = grpc.server(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="settlement"),
                                  options=options)
        settlement_pb2_grpc.add_SettlementServicer_to_server(_servicer(loop, settle), self.server)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise OSError(f"settlement service: cannot listen on {host}:{port}")

    def start(self) -> None:
        self.server.start()

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace).wait(grace + 1)


def _servicer(loop: asyncio.AbstractEventLoop, settle: Settle) -> Any:
    """Message settlement by lock token; the session calls stay UNIMPLEMENTED (the generated base's)."""
    from azurefunctions.extensions.bindings.protos import settlement_pb2_grpc

    class Servicer(_Calls, settlement_pb2_grpc.SettlementServicer):  # type: ignore[misc]
        pass

    return Servicer(loop, settle)


class _Calls:
    def __init__(self, loop: asyncio.AbstractEventLoop, settle: Settle) -> None:
        self._loop = loop
        self._settle = settle

    def _do(self, context: Any, action: str, token: str, **kw: Any) -> Any:
        import grpc
        from google.protobuf.empty_pb2 import Empty

        fut: Any = asyncio.run_coroutine_threadsafe(self._settle(action, token, kw), self._loop)
        try:
            fut.result(timeout=SETTLE_WAIT)
        except UnknownLockToken as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except Exception as e:  # noqa: BLE001 - the broker's answer, to the caller (a SettlementError there)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{action} failed: {type(e).__name__}: {e}")
        return Empty()

    def Complete(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's names
        return self._do(context, "complete", request.locktoken)

    def Abandon(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._do(context, "abandon", request.locktoken)

    def Deadletter(self, request: Any, context: Any) -> Any:  # noqa: N802
        reason = request.deadletterReason.value if request.HasField("deadletterReason") else None
        description = (request.deadletterErrorDescription.value if request.HasField("deadletterErrorDescription")
                       else None)
        return self._do(context, "deadletter", request.locktoken, reason=reason, error_description=description)

    def Defer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._do(context, "defer", request.locktoken)

    def RenewMessageLock(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._do(context, "renew", request.locktoken)
