"""The whole local stack: Azurite, the Service Bus emulator, the remote services simulator and
the Functions host, each on a free loopback port. ``make run`` is ``python -m local.stack``.

    python -m local.stack [--no-demo] [--orders N] [--rate R] [--no-failing-orders] [--instances 2]
                          [--no-keys] [--telemetry]

It starts the four in that order (waiting for each to be ready; with ``--telemetry`` a stand-in
for Application Insights' ingestion too, before the host: ``local.telemetry``), writes
``.local/local.settings.json`` (what the host reads, as ``func start`` would) and
``.local/stack.json`` (every endpoint and connection string), prints the HTTP base URL and the
operator console's (``/api/console``), then posts demo orders and shows their progress
(``local.demo``). A few of them fail on purpose (a payment declined, a shipment that hangs
until the Supervisor holds it, an item out of stock), so that history, search and the
attention list have something to show; ``--no-failing-orders`` leaves them out. Then, until
stopped, a live line counts the orders
by search category (inFlight, attention, processed, error) and each operator alert is
printed as it arrives (``local.watch``). Ctrl-C or SIGTERM stops everything, by PID
and process group, and removes stack.json: it exists only while the stack runs
(``python -m local.stackinfo`` prints the base URL, or says the stack is not running).
Logs: ``.local/logs/NAME.log``.

As a library (tests, chaos runner, benchmarks)::

    with Stack(state_dir=tmp, persistent=False, settings_overrides={"StepTimeoutSeconds": "5"}) as s:
        s.base_url; s.settings; s.remotes.ledger()
        s.kill_host_instance(1); s.restart("servicebus")
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from local.azurite import Azurite, start_azurite
from local.connections import servicebus_connection_string
from local.host.keys import ADMIN, ANONYMOUS, FUNCTION, KEY_HEADER, KEYS_FILE, HostKeys, load_or_create
from local.procs import REPO_ROOT, Proc, free_port
from local.queueconfig import write_derived
from local.remotes.client import RemotesClient
from local.stackclient import StackError
from local.stackclient import demo_order as demo_order  # re-exported: the stack's callers post such orders
from local.stackinfo import STACK_JSON
from local.telemetry import connection_string as telemetry_connection_string
from shared.api.auth import APP_SERVICE, EASY_AUTH_SETTING
from shared.core.workflows.catalog import AGENTS
from shared.observability.telemetry import CONNECTION_STRING
from shared.settings import SERVICE_BUS_CONNECTION, SETTINGS, STATE_STORAGE_CONNECTION, TOKEN_KEYS, new_token_key

HOST = "127.0.0.1"
DEFAULT_STATE_DIR = REPO_ROOT / ".local"
QUEUE_CONFIG = REPO_ROOT / "infra" / "servicebus-config.json"
COMPONENTS = ("azurite", "servicebus", "remotes", "host")
TELEMETRY = "telemetry"  # the ingestion receiver (local.telemetry), started before the host with telemetry=True
# Each agent's service URL setting -> its service's path on the remotes simulator (the agent's name).
SERVICE_PATHS = {a.service_url_setting: a.name for a in AGENTS}
STATSBEAT_OFF = "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL"  # the exporter's setting that turns statsbeat off
CONTROL_PLANE_OFF = "APPLICATIONINSIGHTS_CONTROLPLANE_DISABLED"  # and the one for its settings poll
TOKEN_KEY_FILE = "token-key"  # in the state directory: the stack's TokenKeys, made on first start

_INSTANCE_LINE = re.compile(r"\binstance (\d+) pid (\d+)\b")
_HOST_READY = re.compile(r"\bready (https?://\S+)")


def _route_prefix(app_dir: Path) -> str:
    """http.routePrefix from the app's host.json (default ``api``)."""
    try:
        host_json = json.loads((app_dir / "host.json").read_text(encoding="utf-8-sig"))
        prefix = host_json.get("extensions", {}).get("http", {}).get("routePrefix", "api")
    except (OSError, ValueError, AttributeError):
        prefix = "api"
    return str(prefix).strip("/")


class Stack:
    """Starts and stops the local stack. Use as a context manager, or start()/stop()."""

    def __init__(
        self,
        state_dir: Path | str = DEFAULT_STATE_DIR,
        *,
        persistent: bool = True,
        instances: int = 2,
        settings_overrides: Mapping[str, str] | None = None,
        app_dir: Path | str = REPO_ROOT,
        queue_config: Path | str = QUEUE_CONFIG,
        remotes_seed: int = 0,
        echo: bool = False,
        start_timeout: float = 120.0,
        host_env: Mapping[str, str] | None = None,
        keys: bool = True,
        telemetry: bool = False,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.log_dir = self.state_dir / "logs"
        self.settings_path = self.state_dir / "local.settings.json"
        self.stack_json_path = self.state_dir / STACK_JSON
        self.persistent = persistent
        self.instances = instances
        self.settings_overrides = {k: str(v) for k, v in (settings_overrides or {}).items()}
        self.app_dir = Path(app_dir).resolve()
        self.queue_config = Path(queue_config).resolve()
        self.remotes_seed = remotes_seed
        self.echo = echo
        self.start_timeout = start_timeout
        # extra environment for the host's processes only (the benchmark attaches its counters so)
        self.host_env = dict(host_env or {})
        # The host checks function keys (local.host.keys) unless keys=False (--no-keys, as `func start`).
        self.keys_path = self.state_dir / KEYS_FILE
        self.telemetry = telemetry
        self.telemetry_url = ""
        self.keys: HostKeys | None = None
        if keys:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.keys = load_or_create(self.keys_path)  # made once per state dir, kept from run to run

        self.azurite: Azurite | None = None
        self.procs: dict[str, Proc] = {}  # servicebus, remotes, host (azurite's is self.azurite.proc)
        self._ready_words: dict[str, str] = {}
        self._instance_pids: dict[int, int] = {}  # host instance -> its current pid
        self.ports: dict[str, int] = {}
        self.servicebus_connection_string = ""
        self.remotes_url = ""
        self.base_url = ""
        self.settings: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self.started_at = ""

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Stack:
        """Start everything in order; if anything fails, stop what started and raise."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in self.components:
            (self.log_dir / f"{name}.log").write_text("", encoding="utf-8")
        self.started_at = datetime.now(UTC).isoformat()
        # A stack killed outright left its stack.json: gone now, so no stale URL is read meanwhile.
        self.stack_json_path.unlink(missing_ok=True)
        try:
            self._start_azurite()
            self._start_servicebus()
            self._start_remotes()
            if self.telemetry:
                self._start_telemetry()
            self.settings = self.build_settings()
            self._write_json(self.settings_path, {"IsEncrypted": False, "Values": self.settings})
            self._start_host()
            self.write_stack_json()
        except BaseException:
            self.stop()
            raise
        return self

    def _log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _child_env(self) -> dict[str, str]:
        """The environment minus every setting the stack writes: local.settings.json wins.

        (The host, like Core Tools, lets the environment override Values; a stray
        ServiceBusConnection in the user's shell must not point the stack elsewhere.)
        """
        names = set(self.settings) | {s.name for s in SETTINGS} | {"AzureWebJobsStorage"}
        env = {k: v for k, v in os.environ.items() if k not in names}
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _start_proc(self, name: str, args: list[str], ready_word: str, timeout: float | None = None,
                    on_line: Callable[[str], None] | None = None, env: Mapping[str, str] | None = None) -> Proc:
        proc = Proc(name, args, env={**self._child_env(), **(env or {})}, cwd=REPO_ROOT, log_path=self._log(name),
                    echo=self.echo, on_line=on_line)
        self.procs[name] = proc
        self._ready_words[name] = ready_word
        proc.start(ready_word, timeout=timeout or self.start_timeout)
        return proc

    def _start_azurite(self) -> None:
        self.azurite = start_azurite(
            host=HOST,
            location=self.state_dir / "azurite" if self.persistent else None,
            log_path=self._log("azurite"),
            echo=self.echo,
            timeout=self.start_timeout,
        )
        self.ports.update({f"azurite-{s}": p for s, p in self.azurite.ports.items()})

    def _start_servicebus(self) -> None:
        port = free_port(HOST)
        data_dir = self.state_dir / "servicebus"
        if not self.persistent and data_dir.exists():
            # In-memory Azurite starts empty: messages about orders it no longer knows must go too.
            shutil.rmtree(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        # The declared queues plus the priority lanes' copies (workflows/lanes.json).
        config = write_derived(self.queue_config, self.state_dir / "servicebus-config.json")
        self._start_proc("servicebus", [
            sys.executable, "-m", "local.servicebus", "--config", str(config),
            "--host", HOST, "--port", str(port), "--data-dir", str(data_dir),
        ], "ready")
        self.ports["servicebus"] = port
        self.servicebus_connection_string = servicebus_connection_string(HOST, port)

    def _start_remotes(self) -> None:
        port = free_port(HOST)
        self._start_proc("remotes", [
            sys.executable, "-m", "local.remotes", "--host", HOST, "--port", str(port),
            "--seed", str(self.remotes_seed),
        ], "ready")
        self.ports["remotes"] = port
        self.remotes_url = f"http://{HOST}:{port}"

    def _start_telemetry(self) -> None:
        port = free_port(HOST)
        self._start_proc(TELEMETRY, [sys.executable, "-m", "local.telemetry", "--host", HOST, "--port", str(port)],
                         "ready")
        self.ports[TELEMETRY] = port
        self.telemetry_url = f"http://{HOST}:{port}"

    @property
    def components(self) -> tuple[str, ...]:
        """The processes this stack runs, in start order."""
        return (*COMPONENTS[:-1], TELEMETRY, COMPONENTS[-1]) if self.telemetry else COMPONENTS

    def _start_host(self) -> None:
        self._instance_pids.clear()
        port = free_port(HOST)
        proc = self._start_proc("host", [
            sys.executable, "-m", "local.host", "--app-dir", str(self.app_dir),
            "--settings", str(self.settings_path), "--instances", str(self.instances),
            "--host", HOST, "--port", str(port),
            *(["--keys", str(self.keys_path)] if self.keys else ["--no-keys"]),
        ], "ready http", on_line=self._track_instance, env=self.host_env)
        self.ports["host"] = port
        url = f"http://{HOST}:{port}"
        for line in proc.lines:
            m = _HOST_READY.search(line)
            if m:
                url = m.group(1).rstrip("/")
        self.base_url = url

    def build_settings(self) -> dict[str, str]:
        """local.settings.json ``Values``: connections to the local processes, every declared
        setting at its default, the service URLs (required: no default) at the simulator, then
        the token key (``token_key``), then the overrides. A required setting left without a value
        is a ``StackError`` naming it."""
        assert self.azurite is not None
        storage = self.azurite.connection_string
        values: dict[str, str] = {
            "FUNCTIONS_WORKER_RUNTIME": "python",
            "AzureWebJobsStorage": storage,
        }
        for spec in SETTINGS:
            if spec.name == SERVICE_BUS_CONNECTION:
                values[spec.name] = self.servicebus_connection_string
            elif spec.name == STATE_STORAGE_CONNECTION:
                values[spec.name] = storage
            elif spec.name in SERVICE_PATHS:
                values[spec.name] = f"{self.remotes_url}/{SERVICE_PATHS[spec.name]}"
            elif spec.name == TOKEN_KEYS:
                values[spec.name] = self.token_key()
            elif spec.kind != "connection" and not spec.required:
                values[spec.name] = spec.default or ""
        if self.telemetry_url:
            # The app's exporter sends to the receiver (its IngestionEndpoint and LiveEndpoint).
            # Statsbeat, the exporter's own telemetry, goes to Microsoft's fixed endpoints (not the
            # app's resource, not billed to it), and so does its poll of Microsoft's settings service
            # (settings.sdk.monitor.azure.com; failing here, it would export an exception each time):
            # both off, so that nothing tries to leave this machine.
            values[CONNECTION_STRING] = telemetry_connection_string(self.telemetry_url)
            values[STATSBEAT_OFF] = "true"
            values[CONTROL_PLANE_OFF] = "true"
        values.update(self.settings_overrides)
        if values.get("OperatorAuth") == APP_SERVICE:
            # The stand-in for App Service authentication: App Service sets this when it is on, and
            # the appService mode refuses to run without it (docs/local-stack.md). An override wins.
            values.setdefault(EASY_AUTH_SETTING, "True")
        missing = [s.name for s in SETTINGS if s.required and not values.get(s.name, "").strip()]
        if missing:
            raise StackError(f"required settings with no local value: {', '.join(missing)}")
        return values

    def key_headers(self, level: str = ADMIN) -> dict[str, str]:
        """The header that lets a request through routes of ``level`` (``function``: the host key
        ``default``; ``admin``: the master key); none when the host checks no key."""
        if self.keys is None or level == ANONYMOUS:
            return {}
        return {KEY_HEADER: self.keys.master if level == ADMIN else self.keys.function}

    def session(self, level: str = ADMIN) -> requests.Session:
        """A ``requests.Session`` that sends the key of ``level`` on every request."""
        s = requests.Session()
        s.headers.update(self.key_headers(level))
        return s

    def token_key(self) -> str:
        """The stack's ``TokenKeys``: a fresh random key, made on first start and kept in the state
        directory (readable by its owner only), so that tokens in the kept queues and in a
        client's hands stay valid from one run to the next. Delete the file for a new key."""
        path = self.state_dir / TOKEN_KEY_FILE
        try:
            return path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            pass
        self.state_dir.mkdir(parents=True, exist_ok=True)
        key = new_token_key()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(key + "\n")
        return key

    def stop(self) -> None:
        """Stop everything, host first (it drains), Azurite last. Safe to call twice."""
        with self._lock:
            for name in reversed(self.components):
                try:
                    if name == "azurite":
                        if self.azurite is not None:
                            self.azurite.stop()
                    elif name in self.procs:
                        self.procs[name].stop()
                except Exception as e:  # keep stopping the others
                    sys.stderr.write(f"stopping {name}: {e}\n")
            self._remove_stack_json()
            self._stopped = True

    def _remove_stack_json(self) -> None:
        """Remove stack.json if this stack wrote it: a stopped stack leaves no URL to be read."""
        try:
            data = json.loads(self.stack_json_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("stackPid") == os.getpid() and data.get("startedAt") == self.started_at:
            self.stack_json_path.unlink(missing_ok=True)

    # ---- individual processes (chaos, tests) -----------------------------------------------

    def proc(self, name: str) -> Proc:
        if name == "azurite":
            assert self.azurite is not None
            return self.azurite.proc
        return self.procs[name]

    def alive(self) -> dict[str, bool]:
        out = {}
        for name in self.components:
            try:
                out[name] = self.proc(name).alive()
            except (KeyError, AssertionError):
                out[name] = False
        return out

    def kill(self, name: str) -> None:
        """SIGKILL a component's whole process group (a crash)."""
        self.proc(name).kill()

    def stop_component(self, name: str) -> None:
        self.proc(name).stop()

    def restart(self, name: str, timeout: float | None = None) -> None:
        """Stop (if running) and start a component again, on the same port and data folder."""
        if name == "azurite":
            assert self.azurite is not None
            self.azurite.restart(timeout=timeout or self.start_timeout)
        else:
            proc = self.procs[name]
            proc.stop()
            proc.start(self._ready_words[name], timeout=timeout or self.start_timeout)
        self.write_stack_json()

    def _track_instance(self, line: str) -> None:
        m = _INSTANCE_LINE.search(line)
        if m:
            self._instance_pids[int(m.group(1))] = int(m.group(2))

    def host_instances(self) -> dict[int, int]:
        """Instance number -> pid of its current process (from the host's `instance K pid PID`
        lines, recorded as they arrive, so heavy logging cannot push them out of reach)."""
        return dict(self._instance_pids)

    def kill_host_instance(self, instance: int | None = None) -> tuple[int, int]:
        """SIGKILL one host instance's process (not the host): returns (instance, pid)."""
        instances = self.host_instances()
        if not instances:
            raise StackError("the host printed no `instance K pid PID` line")
        k = instance if instance is not None else sorted(instances)[0]
        pid = instances[k]
        os.kill(pid, signal.SIGKILL)
        return k, pid

    def wait_host_instance_replaced(self, instance: int, old_pid: int, timeout: float = 60.0) -> int:
        """Wait until the host reports a new pid for ``instance``; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.host_instances().get(instance)
            if pid is not None and pid != old_pid and _pid_alive(pid):
                return pid
            time.sleep(0.1)
        raise StackError(f"host instance {instance} (pid {old_pid}) was not restarted within {timeout}s")

    # ---- endpoints -----------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        prefix = _route_prefix(self.app_dir)
        return f"{self.base_url}/{prefix}" if prefix else self.base_url

    @property
    def remotes(self) -> RemotesClient:
        return RemotesClient(self.remotes_url)

    def describe(self) -> dict[str, Any]:
        az = self.azurite
        return {
            "baseUrl": self.base_url,
            "apiUrl": self.api_url,
            "ordersUrl": f"{self.api_url}/orders",
            "azurite": None if az is None else {
                "connectionString": az.connection_string,
                **{f"{s}Endpoint": e for s, e in az.endpoints().items()},
                "location": str(az.location) if az.location else None,
                "inMemory": az.location is None,
                "pid": az.proc.pid if az.proc.popen else None,
            },
            "servicebus": {
                "host": HOST, "port": self.ports.get("servicebus"),
                "connectionString": self.servicebus_connection_string,
                "dataDir": str(self.state_dir / "servicebus"),
                "config": str(self.state_dir / "servicebus-config.json"),
                "pid": self._pid("servicebus"),
            },
            "remotes": {
                "baseUrl": self.remotes_url,
                **{name: self.settings.get(name) for name in SERVICE_PATHS},
                "ledger": f"{self.remotes_url}/_ledger", "stats": f"{self.remotes_url}/_stats",
                "faults": f"{self.remotes_url}/_faults",
                "pid": self._pid("remotes"),
            },
            "host": {
                "baseUrl": self.base_url, "instances": self.instances,
                # null with --no-keys; "function" is the host key `default`, taken by every FUNCTION route
                "keys": None if self.keys is None else {"master": self.keys.master, "function": self.keys.function,
                                                        "file": str(self.keys_path)},
                "pid": self._pid("host"),
                "instancePids": {str(k): v for k, v in self.host_instances().items()} if "host" in self.procs else {},
            },
            "settingsFile": str(self.settings_path),
            "telemetry": None if not self.telemetry_url else {
                "baseUrl": self.telemetry_url, "items": f"{self.telemetry_url}/_items",
                "stats": f"{self.telemetry_url}/_stats", "pid": self._pid(TELEMETRY),
            },
            "logs": {name: str(self._log(name)) for name in self.components},
            "stackPid": os.getpid(),
            "startedAt": self.started_at,
        }

    def _pid(self, name: str) -> int | None:
        p = self.procs.get(name)
        return p.pid if p is not None and p.popen is not None else None

    def write_stack_json(self) -> None:
        self._write_json(self.stack_json_path, self.describe())

    @staticmethod
    def _write_json(path: Path, data: Any) -> None:
        """Write ``path`` whole (a reader never sees half of it), readable by its owner only: the
        settings hold the token key, stack.json the function keys."""
        tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}-{threading.get_ident()}.tmp")  # one per writer
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # (a file left by a crash keeps its mode through O_CREAT)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)

    # ---- orders over HTTP ----------------------------------------------------------------------

    def post_order(self, body: Mapping[str, Any], session: requests.Session | None = None,
                   timeout: float = 30.0) -> str:
        r = (session or requests).post(f"{self.api_url}/orders", json=dict(body), timeout=timeout,
                                       headers=self.key_headers(FUNCTION))
        if r.status_code != 202:
            raise StackError(f"POST /orders: {r.status_code} {r.text[:500]}")
        return str(r.json()["orderId"])

    def send_event(self, order_id: str, name: str, body: Mapping[str, Any],
                   session: requests.Session | None = None, timeout: float = 30.0) -> str:
        """``POST /api/orders/{id}/events/{name}``: the event's ``result`` (event-kept, step-done...)."""
        r = (session or requests).post(f"{self.api_url}/orders/{order_id}/events/{name}", json=dict(body),
                                       timeout=timeout, headers=self.key_headers(ADMIN))
        if r.status_code != 202:
            raise StackError(f"POST /orders/{order_id}/events/{name}: {r.status_code} {r.text[:500]}")
        return str(r.json()["result"])

    def get_order(self, order_id: str, session: requests.Session | None = None,
                  timeout: float = 30.0) -> dict[str, Any]:
        r = (session or requests).get(f"{self.api_url}/orders/{order_id}", timeout=timeout,
                                      headers=self.key_headers(FUNCTION))
        if r.status_code != 200:
            raise StackError(f"GET /orders/{order_id}: {r.status_code} {r.text[:500]}")
        return dict(r.json())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still "exists": look at its state.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


# ---- command line ---------------------------------------------------------------------------------


class _Stop(Exception):
    pass


def _parse_args(argv: Iterable[str] | None) -> tuple[argparse.Namespace, dict[str, str]]:
    """The command line, and its ``--set`` overrides as a dict."""
    ap = argparse.ArgumentParser(prog="python -m local.stack", description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-demo", action="store_true", help="start the stack without posting demo orders")
    ap.add_argument("--orders", type=int, default=100, help="demo orders to post (default 100)")
    ap.add_argument("--rate", type=float, default=10.0, help="demo orders per second (default 10)")
    ap.add_argument("--no-failing-orders", action="store_true",
                    help="post only orders that succeed: none of the demo's failing orders (a payment "
                         "declined, a shipment that hangs, an item out of stock), no faults set")
    ap.add_argument("--instances", type=int, default=2, help="host instances (default 2)")
    ap.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), help="default .local")
    ap.add_argument("--set", action="append", default=[], metavar="Name=Value",
                    help="override an app setting in local.settings.json (repeatable)")
    ap.add_argument("--app-dir", default=str(REPO_ROOT), help="the function app (default: this repository)")
    ap.add_argument("--echo", action="store_true", help="also echo every process's output to stderr")
    ap.add_argument("--telemetry", action="store_true",
                    help="start the telemetry receiver (local.telemetry) and send the app's Azure Monitor "
                         "telemetry to it: what would be sent to Application Insights, counted (stack.json: "
                         "telemetry.baseUrl)")
    ap.add_argument("--no-keys", action="store_true",
                    help="the host checks no function key, as `func start` (default: keys are checked as in "
                         "Azure; they are in stack.json under host.keys)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    overrides = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or not name:
            ap.error(f"--set expects Name=Value, got {item!r}")
        overrides[name] = value
    return args, overrides


def _dead_components(stack: Stack) -> list[str]:
    return [f"warning: {name} exited; see {stack.log_dir / (name + '.log')}"
            for name, ok in stack.alive().items() if not ok]


def banner(stack: Stack) -> str:
    """What ``make run`` prints once the stack is up: the console's URL with the master key (it
    sends that key on its API calls), and a client's curl line with the function key."""
    keys = stack.keys
    code = f"?code={keys.master}" if keys else ""
    key_header = f" -H '{KEY_HEADER}: {keys.function}'" if keys else ""
    keys_line = (f"  keys:        master and function key in stack.json (host.keys); {stack.keys_path}\n" if keys
                 else "  keys:        none checked (--no-keys)\n")
    return (f"\nHTTP base URL: {stack.base_url}\n"
            f"  console:     {stack.api_url}/console{code}   (the operator console, in a browser)\n"
            f"  orders:      POST {stack.api_url}/orders   GET {stack.api_url}/orders/{{id}}   (the function key)\n"
            f"  search:      GET {stack.api_url}/orders?state=attention   (the master key)\n"
            f"{keys_line}"
            f"  curl:        curl{key_header} {stack.api_url}/orders/ORDER_ID\n"
            f"  remotes:     {stack.remotes_url}  (ledger {stack.remotes_url}/_ledger)\n"
            + (f"  telemetry:   {stack.telemetry_url}/_stats   (what would be sent to Application Insights)\n"
               if stack.telemetry_url else "")
            + f"  stack.json:  {stack.stack_json_path}\n")


def _serve(stack: Stack, args: argparse.Namespace) -> None:
    """A started stack: its endpoints, the demo, then the live counts and alerts until interrupted."""
    from local.demo import demo  # (the command line's only: a library user of Stack needs neither)
    from local.watch import Watch, watch_forever

    print(banner(stack), flush=True)
    if not args.no_demo and args.orders > 0:
        demo(stack, args.orders, args.rate, not args.no_failing_orders, sys.stdout)
    print("the stack is running; Ctrl-C stops it", flush=True)
    print("every order in the store by search category (GET /api/orders?state=..., earlier runs' too), "
          f"and alerts (queue {stack.settings['AlertsQueue']}):", flush=True)
    watch = Watch(stack.api_url, stack.settings, sys.stdout, headers=stack.key_headers(ADMIN)).start()
    try:
        watch_forever(watch, lambda: _dead_components(stack))
    finally:
        watch.close()


def main(argv: Iterable[str] | None = None) -> int:
    args, overrides = _parse_args(argv)

    def _on_signal(signum: int, frame: object) -> None:
        raise _Stop(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)

    stack = Stack(args.state_dir, instances=args.instances, settings_overrides=overrides, echo=args.echo,
                  app_dir=args.app_dir, keys=not args.no_keys, telemetry=args.telemetry)
    rc = 0
    try:
        print(f"starting the local stack in {stack.state_dir} (logs in {stack.log_dir}) ...", flush=True)
        stack.start()
        _serve(stack, args)
    except _Stop as e:
        print(f"\n{e.args[0]}: stopping ...", flush=True)
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
    except Exception as e:  # a child failed to start, or the demo failed
        print(f"\nerror: {e}", file=sys.stderr, flush=True)
        rc = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        stack.stop()
        print("stopped", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
