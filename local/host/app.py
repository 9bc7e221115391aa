"""Index a Python v2 function app and invoke its functions, as the Python worker does.

The worker imports the script named by ``PYTHON_SCRIPT_FILE_NAME`` (default
``function_app.py``) from the app root, expects exactly one ``FunctionApp`` (any
``FunctionRegister``) in it, and reads each function's bindings from ``get_function_json()``.
Nothing here knows any particular app.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib.util
import inspect
import json
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import azure.functions as func
from azure.functions import _abc
from azure.functions.decorators.function_app import FunctionRegister

from .settings import SettingError, resolve
from .settlement import is_sdk_type, settlement_client, settlement_param

log = logging.getLogger("local.host")

TRIGGERS = {"httpTrigger", "serviceBusTrigger", "timerTrigger"}
OUTPUTS = {"http", "serviceBus"}

current_invocation: contextvars.ContextVar[str | None] = contextvars.ContextVar("invocation_id", default=None)


class IndexError_(Exception):
    """The app cannot be indexed (no FunctionApp, two of them, import error...)."""


def load_app(app_dir: Path, script_name: str | None = None) -> tuple[FunctionRegister, Any]:
    script_name = script_name or os.environ.get("PYTHON_SCRIPT_FILE_NAME") or "function_app.py"
    script = (app_dir / script_name).resolve()
    if not script.exists():
        raise IndexError_(f"script {script} not found (PYTHON_SCRIPT_FILE_NAME={script_name})")
    app_root = str(app_dir.resolve())
    if app_root not in sys.path:
        sys.path.insert(0, app_root)
    module_name = script.stem
    spec = importlib.util.spec_from_file_location(module_name, script)
    if spec is None or spec.loader is None:
        raise IndexError_(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    apps = [v for v in vars(module).values() if isinstance(v, FunctionRegister)]
    if not apps:
        raise IndexError_(f"no FunctionApp found in {script}")
    if len(apps) > 1:
        raise IndexError_(f"more than one FunctionApp in {script}: expected exactly one")
    return apps[0], module


@dataclass
class FunctionSpec:
    name: str
    func: Callable[..., Any]
    is_async: bool
    trigger: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)
    context_param: str | None = None
    trigger_annotation: Any = None
    sdk_type: bool = False  # the trigger parameter is an SDK type: model_binding_data (local.host.settlement)
    settlement_param: str | None = None  # gets the settlement client (ServiceBusMessageActions)

    @property
    def trigger_type(self) -> str:
        return str(self.trigger["type"])

    @property
    def trigger_param(self) -> str:
        return str(self.trigger["name"])

    @property
    def return_binding(self) -> dict[str, Any] | None:
        return next((b for b in self.outputs if b["name"] == "$return"), None)


def index_functions(app: FunctionRegister, settings: Mapping[str, str]) -> tuple[list[FunctionSpec], list[str]]:
    """Functions of the app, with ``%Setting%`` resolved. A function that cannot run here
    (unresolved setting, unsupported binding) is reported as an error and left out, as the host
    marks such a function as errored and runs the others."""
    specs: list[FunctionSpec] = []
    errors: list[str] = []
    for f in app.get_functions():
        name = f.get_function_name() or "?"
        try:
            doc = json.loads(f.get_function_json())
            bindings = [resolve(b, settings) for b in doc.get("bindings", [])]
            triggers = [b for b in bindings if str(b.get("type", "")).endswith("Trigger")]
            if len(triggers) != 1:
                raise SettingError(f"expected one trigger, found {len(triggers)}")
            trigger = triggers[0]
            if trigger["type"] not in TRIGGERS:
                raise SettingError(f"trigger type {trigger['type']!r} is not supported by the local host")
            outputs = []
            for b in bindings:
                if b is trigger:
                    continue
                direction = str(b.get("direction", "")).upper()
                if direction == "OUT" and b.get("type") in OUTPUTS:
                    outputs.append(b)
                else:
                    raise SettingError(f"binding {b.get('type')!r} ({direction}) is not supported by the local host")
            if trigger["type"] == "serviceBusTrigger" and str(trigger.get("cardinality", "one")).lower() == "many":
                raise SettingError("serviceBusTrigger with cardinality 'many' is not supported by the local host")
            user = f.get_user_function()
            sig = inspect.signature(user)
            bound = {b["name"] for b in bindings}
            ctx = next((p for p in sig.parameters if p == "context" and p not in bound), None)
            ann = sig.parameters[trigger["name"]].annotation if trigger["name"] in sig.parameters else None
            sdk_type = is_sdk_type(trigger["type"], ann)
            # as the worker: the one parameter no binding names may take the settlement client
            unbound = [p for p in sig.parameters if p not in bound and p != ctx]
            client = settlement_param(unbound, {p: v.annotation for p, v in sig.parameters.items()})
            if unbound and client is None:
                raise SettingError(f"the following parameters are declared in Python but not bound: {unbound}")
            specs.append(FunctionSpec(name, user, inspect.iscoroutinefunction(user), trigger, outputs, ctx, ann,
                                      sdk_type, client))
        except Exception as e:  # noqa: BLE001 - reported per function, the host goes on
            errors.append(f"{name}: {e}")
    return specs, errors


# ----------------------------------------------------------------------------- context


class _TraceContext(_abc.TraceContext):
    def __init__(self, trace_parent: str, trace_state: str = "", attributes: dict[str, str] | None = None):
        self._tp, self._ts, self._attrs = trace_parent, trace_state, attributes or {}

    @property
    def trace_parent(self) -> str:
        return self._tp

    @property
    def trace_state(self) -> str:
        return self._ts

    @property
    def attributes(self) -> dict[str, str]:
        return self._attrs


class _RetryContext(_abc.RetryContext):
    @property
    def retry_count(self) -> int:
        return 0

    @property
    def max_retry_count(self) -> int:
        return 0

    @property
    def exception(self) -> Any:
        return None


class InvocationContext(func.Context):
    _tls = threading.local()

    def __init__(self, invocation_id: str, function_name: str, directory: str, trace_parent: str | None):
        self._id = invocation_id
        self._name = function_name
        self._dir = directory
        self._trace = _TraceContext(trace_parent or new_traceparent())

    @property
    def invocation_id(self) -> str:
        return self._id

    @property
    def thread_local_storage(self) -> Any:
        return self._tls

    @property
    def function_name(self) -> str:
        return self._name

    @property
    def function_directory(self) -> str:
        return self._dir

    @property
    def trace_context(self) -> Any:
        return self._trace

    @property
    def retry_context(self) -> Any:
        return _RetryContext()


# Ids need to be unique, not unpredictable: drawn from ``random`` as OpenTelemetry's own id
# generator does (uuid4 makes an os.urandom call and a UUID object for each).
_V4_CLEAR = (0xF000 << 64) | (0xC000 << 48)  # the version nibble and the variant bits
_V4_SET = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant


def new_invocation_id() -> str:
    """A random version-4 GUID, as the host's invocation ids are."""
    h = f"{random.getrandbits(128) & ~_V4_CLEAR | _V4_SET:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_traceparent() -> str:
    """A new sampled W3C traceparent (never the invalid all-zero ids)."""
    return f"00-{random.getrandbits(128) or 1:032x}-{random.getrandbits(64) or 1:016x}-01"


class Out(func.Out):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self._value: Any = None

    def set(self, val: Any) -> None:
        self._value = val

    def get(self) -> Any:
        return self._value


# ----------------------------------------------------------------------------- invoking


@dataclass
class InvocationResult:
    value: Any
    outputs: dict[str, Any]


OutputHandler = Callable[[dict[str, Any], Any], "asyncio.Future[Any] | Any"]


class Invoker:
    """Runs invocations: async functions on the worker's event loop, sync ones in a thread pool."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app_dir: Path, threads: int,
                 thread_init: Callable[[], None] | None = None) -> None:
        self.loop = loop
        self.app_dir = str(app_dir)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="invoke", initializer=thread_init)
        self.output_handlers: dict[str, Callable[[dict[str, Any], Any], Any]] = {}
        self.in_flight = 0

    async def invoke(self, spec: FunctionSpec, trigger_value: Any, reason: str,
                     trace_parent: str | None = None) -> InvocationResult:
        invocation_id = new_invocation_id()
        kwargs: dict[str, Any] = {spec.trigger_param: trigger_value}
        outs: dict[str, Out] = {}
        for b in spec.outputs:
            if b["name"] != "$return":
                outs[b["name"]] = kwargs[b["name"]] = Out()
        if spec.context_param:
            kwargs[spec.context_param] = InvocationContext(invocation_id, spec.name, self.app_dir, trace_parent)
        if spec.settlement_param:
            kwargs[spec.settlement_param] = settlement_client()
        log.info("Executing 'Functions.%s' (Reason='%s', Id=%s)", spec.name, reason, invocation_id)
        started = time.monotonic()
        self.in_flight += 1
        token = current_invocation.set(invocation_id)
        try:
            if spec.is_async:
                value = await spec.func(**kwargs)
            else:
                ctx = contextvars.copy_context()
                value = await self.loop.run_in_executor(self.pool, functools.partial(ctx.run, spec.func, **kwargs))
            outputs = {name: o.get() for name, o in outs.items()}
            if spec.return_binding is not None:
                outputs["$return"] = value
            for b in spec.outputs:
                v = outputs.get(b["name"])
                handler = self.output_handlers.get(b["type"])
                if v is not None and handler is not None:
                    r = handler(b, v)
                    if inspect.isawaitable(r):
                        await r
        except BaseException as e:
            try:
                e._logged_by_invoker = True  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001,S110 - some exception types refuse attributes
                pass
            ms = (time.monotonic() - started) * 1000
            log.error("Executed 'Functions.%s' (Failed, Id=%s, Duration=%dms): %s: %s",
                      spec.name, invocation_id, ms, type(e).__name__, e,
                      exc_info=not isinstance(e, asyncio.CancelledError))
            raise
        finally:
            self.in_flight -= 1
            current_invocation.reset(token)
        ms = (time.monotonic() - started) * 1000
        log.info("Executed 'Functions.%s' (Succeeded, Id=%s, Duration=%dms)", spec.name, invocation_id, ms)
        return InvocationResult(value, outputs)

    def invoke_blocking(self, spec: FunctionSpec, trigger_value: Any, reason: str,
                        trace_parent: str | None = None) -> InvocationResult:
        """From a thread other than the loop's (the HTTP server's)."""
        fut = asyncio.run_coroutine_threadsafe(self.invoke(spec, trigger_value, reason, trace_parent), self.loop)
        return fut.result()

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
