"""One host instance: index the app, serve its HTTP routes, run its Service Bus receivers and timers.

Started by the supervisor (``local.host``) with the app settings already in its environment.
It prints ``READY_MARKER`` once it has indexed the app and its HTTP socket is listening.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .settlement import DEFAULT_MAX_MESSAGE_LENGTH

READY_MARKER = "@@local-host-instance-listening@@"
EXIT_STARTUP_FAILED = 3

log = logging.getLogger("local.host")


class _InvocationFormatter(logging.Formatter):
    """Names the invocation a line was written in, on a copy of the record: the record itself goes
    on to the app's exporter, which would send an added attribute as a property."""

    def format(self, record: logging.LogRecord) -> str:
        from .app import current_invocation

        inv = current_invocation.get()
        copy = logging.makeLogRecord(record.__dict__)
        copy.invocation = f" [{inv[:8]}]" if inv else ""
        return super().format(copy)


def configure_logging(level: int) -> None:
    """Like the Python worker: the root logger, so a function's ``logging`` calls reach stdout.

    The host's own lines (loggers ``local.*``: Executing, Executed, the listeners) go to stdout only,
    never up to the root's other handlers: in Azure the host is another process that exports its own
    telemetry, and in the OpenTelemetry mode none of its ``Function.*`` lines (docs/cost.md,
    "Telemetry"), so the app's exporter must not carry them here either."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_InvocationFormatter("%(asctime)s %(levelname)s %(name)s%(invocation)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    own = logging.getLogger("local")
    own.handlers[:] = [handler]
    own.propagate = False
    # The SDKs are chatty at INFO (and at WARNING while a broker restarts).
    logging.getLogger("azure").setLevel(max(level, logging.WARNING))
    # Connection losses are reported by local.host.servicebus in one line each (and retried);
    # the SDK would add tracebacks for every link while a broker restarts.
    logging.getLogger("azure.servicebus").setLevel(max(level, logging.ERROR))
    for name in ("azure.servicebus._pyamqp", "azure.servicebus.aio._base_handler_async",
                 "azure.servicebus.aio._async_utils", "azure.servicebus._base_handler"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.getLogger("azure.identity").setLevel(max(level, logging.WARNING))


def announce_ready() -> None:
    """Tell the supervisor we listen: one write, under the log handlers' locks, so that no log
    line from another thread lands in the middle of the marker's line."""
    handlers = logging.getLogger().handlers
    for h in handlers:
        h.acquire()
    try:
        sys.stdout.write(READY_MARKER + "\n")
        sys.stdout.flush()
    finally:
        for h in reversed(handlers):
            h.release()


def _die_with_parent() -> None:
    """Linux: SIGTERM this instance if the supervisor dies, so nothing is orphaned."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="local.host.worker")
    p.add_argument("--app-dir", required=True)
    p.add_argument("--http-host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--lease-dir", required=True)
    p.add_argument("--parent-pid", type=int, default=0)
    p.add_argument("--keys", default=None, help="the keys file (local.host.keys); none: no key is checked")
    # the host's gRPC endpoint, as the Functions host passes it to its workers: here this
    # instance's settlement service (local.host.settlement), for SDK-type Service Bus bindings
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--functions-grpc-max-message-length", type=int, default=DEFAULT_MAX_MESSAGE_LENGTH)
    args = p.parse_args(argv)
    _die_with_parent()
    if args.parent_pid and os.getppid() != args.parent_pid:
        return 1  # the supervisor died before we got here

    from .settings import load_host_config
    from .threadroles import ThreadRoles

    app_dir = Path(args.app_dir).resolve()
    host_cfg = load_host_config(app_dir)
    configure_logging(host_cfg.log_level)
    instance_id = os.environ.get("WEBSITE_INSTANCE_ID", "local")

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    os.chdir(app_dir)
    if "" in sys.path:
        sys.path.remove("")
    sys.path.insert(0, str(app_dir))

    roles = ThreadRoles.from_env()
    roles.register("main")
    loop = asyncio.new_event_loop()
    loop.call_soon(roles.register, "loop")
    loop_thread = threading.Thread(target=loop.run_forever, name="worker-loop", daemon=True)
    loop_thread.start()
    try:
        from .app import Invoker, index_functions, load_app
        from .http_server import HttpFrontEnd, build_routes
        from .servicebus import ServiceBusHost
        from .settings import resolve_connection
        from .timers import TimerRunner

        started = time.monotonic()
        app, _ = load_app(app_dir)
        settings = dict(os.environ)
        specs, errors = index_functions(app, settings)
        for e in errors:
            log.error("Function in error, not started: %s", e)
        sb_specs = []
        for s in specs:
            if s.trigger_type == "serviceBusTrigger":
                try:
                    resolve_connection(str(s.trigger.get("connection") or "ServiceBusConnection"), settings)
                    sb_specs.append(s)
                except ValueError as e:
                    log.error("Function in error, not started: %s: %s", s.name, e)
        for s in specs:
            detail = {"httpTrigger": lambda t: f"[{','.join(t.get('methods') or ['*'])}] "
                                               f"/{host_cfg.route_prefix}/{t.get('route') or ''}".replace("//", "/"),
                      "serviceBusTrigger": lambda t: f"queue {t.get('queueName') or t.get('topicName')}",
                      "timerTrigger": lambda t: f"schedule {t.get('schedule')}"}[s.trigger_type](s.trigger)
            log.info("Found function %s: %s %s", s.name, s.trigger_type, detail)
        log.info("Indexed %d function(s) in %.0f ms (%s)", len(specs), (time.monotonic() - started) * 1000,
                 instance_id)

        threads = int(os.environ.get("PYTHON_THREADPOOL_THREAD_COUNT") or 32)
        invoker = Invoker(loop, app_dir, threads, thread_init=lambda: roles.register("invoke"))
        sb_host = ServiceBusHost(loop, invoker, host_cfg.service_bus, settings)
        routes = build_routes(specs, host_cfg.route_prefix)
        from .keys import load as load_keys

        keys = load_keys(Path(args.keys)) if args.keys else None
        front = HttpFrontEnd(args.http_host, args.http_port, routes, invoker, instance_id, keys)
        http_thread = threading.Thread(target=_registered(roles, "http", front.serve_forever), name="http",
                                       daemon=True)
        http_thread.start()
        settlement = None
        if any(s.settlement_param for s in sb_specs):
            from .settlement import SettlementServer

            settlement = SettlementServer(loop, sb_host.settle_held, args.host, args.port,
                                          args.functions_grpc_max_message_length)
            settlement.start()
            log.info("Settlement service (SDK-type Service Bus bindings) on %s:%d", args.host, settlement.port)
        timers = []
        for s in specs:
            if s.trigger_type == "timerTrigger":
                try:
                    timers.append(TimerRunner(s, invoker, Path(args.lease_dir), instance_id, stop))
                except ValueError as e:
                    log.error("Function in error, not started: %s: bad schedule: %s", s.name, e)
    except Exception:  # noqa: BLE001 - the supervisor shows this and gives up
        log.exception("Host instance failed to start")
        loop.call_soon_threadsafe(loop.stop)
        return EXIT_STARTUP_FAILED

    asyncio.run_coroutine_threadsafe(_start_sb(sb_host, sb_specs), loop).result()
    for t in timers:
        t.start()
    announce_ready()
    log.info("Host instance %s listening on http://%s:%d", instance_id, args.http_host, front.port)

    while not stop.wait(1.0):
        if args.parent_pid and os.getppid() != args.parent_pid:
            log.warning("supervisor is gone; stopping")
            break

    log.info("Stopping host instance %s", instance_id)
    front.server.shutdown()  # no new HTTP requests
    try:
        asyncio.run_coroutine_threadsafe(sb_host.stop(timeout=20), loop).result(timeout=30)
    except Exception as e:  # noqa: BLE001
        log.warning("stopping the Service Bus receivers: %s", e)
    for t in timers:
        t.join(timeout=10)
    if settlement is not None:
        settlement.stop()
    deadline = time.monotonic() + 10
    while invoker.in_flight and time.monotonic() < deadline:  # HTTP calls still running
        time.sleep(0.05)
    front.server.server_close()
    invoker.shutdown()
    loop.call_soon_threadsafe(loop.stop)
    loop_thread.join(timeout=5)
    log.info("Host instance %s stopped", instance_id)
    logging.shutdown()
    return 0


def _registered(roles: Any, role: str, target: Any) -> Any:
    """``target``, run on a thread that first records its role (``local.host.threadroles``)."""
    def run() -> None:
        roles.register(role)
        target()
    return run


async def _start_sb(sb_host: Any, specs: list[Any]) -> None:
    sb_host.start(specs)


if __name__ == "__main__":
    sys.exit(main())
