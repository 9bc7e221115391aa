"""The supervisor: starts N host instances (separate processes) and keeps them running.

Each instance gets its own ``WEBSITE_INSTANCE_ID`` (``local-<K>-<random>``) and serves HTTP on
the same port (SO_REUSEPORT: the kernel spreads connections). The supervisor prints
``instance K pid PID`` per instance, then ``ready http://HOST:PORT`` once every instance has
indexed the app and listens. An instance that dies is restarted after about a second with a new
instance id. SIGTERM / SIGINT stop every instance (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .keys import KEYS_FILE, KeysError, load_or_create
from .settings import SettingError, load_local_settings, parse_set_args, worker_environment
from .worker import EXIT_STARTUP_FAILED, READY_MARKER

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # the folder holding `local/`
RESTART_DELAY = 1.0
STOP_GRACE = 25.0


def new_instance_id(k: int) -> str:
    return f"local-{k}-{secrets.token_hex(4)}"


GRPC_MAX_MESSAGE_LENGTH = 2147483647  # what the Functions host passes its workers


def free_port(host: str) -> int:
    """A port free now on ``host`` (the OS's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Instance:
    index: int
    instance_id: str = ""
    popen: subprocess.Popen[str] | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    ever_ready: bool = False
    restart_at: float | None = None
    failures: int = 0
    started_at: float = 0.0


class Supervisor:
    def __init__(self, app_dir: Path, env: dict[str, str], instances: int, host: str, port: int,
                 lease_dir: Path, keys_file: Path | None = None) -> None:
        self.app_dir = app_dir
        self.keys_file = keys_file  # None: no auth level is enforced
        self.env = env
        self.host = host
        self.port = port
        self.lease_dir = lease_dir
        self.instances = [Instance(k) for k in range(1, instances + 1)]
        self.stop = threading.Event()
        self._out = threading.Lock()
        self._announced = False
        self._held: list[str] = []

    # ------------------------------------------------------------------ output

    def emit(self, line: str) -> None:
        with self._out:
            # Whoever waits for the word "ready" must not see it before our own ready line.
            if not self._announced and "ready" in line:
                self._held.append(line)
                return
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def announce(self, line: str) -> None:
        with self._out:
            self._announced = True
            sys.stdout.write(line + "\n")
            for held in self._held:
                sys.stdout.write(held + "\n")
            self._held.clear()
            sys.stdout.flush()

    def _pump(self, inst: Instance, popen: subprocess.Popen[str]) -> None:
        assert popen.stdout is not None
        prefix = f"[instance {inst.index}] "
        for line in popen.stdout:
            line = line.rstrip("\n")
            if READY_MARKER in line:
                inst.ready.set()
                inst.ever_ready = True
                inst.failures = 0
                self.emit(f"host: instance {inst.index} ({inst.instance_id}) listening")
                line = line.replace(READY_MARKER, "")
                if not line.strip():
                    continue
            self.emit(prefix + line)

    # ------------------------------------------------------------------ processes

    def spawn(self, inst: Instance) -> None:
        inst.instance_id = new_instance_id(inst.index)
        inst.ready.clear()
        inst.restart_at = None
        env = dict(self.env)
        env["WEBSITE_INSTANCE_ID"] = inst.instance_id
        env["PYTHONUNBUFFERED"] = "1"
        code = (f"import sys; sys.path.append({str(PACKAGE_ROOT)!r}); "
                "from local.host.worker import main; sys.exit(main())")
        # As the Functions host starts its worker: ``--host``/``--port`` name the host's gRPC
        # endpoint (here the instance's settlement service, local.host.settlement, on a port
        # chosen now) and ``--functions-grpc-max-message-length`` its limit; the SDK-type
        # bindings' settlement client reads them from the worker's argv.
        popen = subprocess.Popen(
            [sys.executable, "-c", code, "--app-dir", str(self.app_dir), "--http-host", self.host,
             "--http-port", str(self.port), "--lease-dir", str(self.lease_dir), "--parent-pid", str(os.getpid()),
             "--host", "127.0.0.1", "--port", str(free_port("127.0.0.1")),
             "--functions-grpc-max-message-length", str(GRPC_MAX_MESSAGE_LENGTH),
             *(["--keys", str(self.keys_file)] if self.keys_file else [])],
            cwd=str(self.app_dir), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
        )
        inst.popen = popen
        inst.started_at = time.monotonic()
        self.emit(f"instance {inst.index} pid {popen.pid}")
        threading.Thread(target=self._pump, args=(inst, popen), name=f"pump-{inst.index}", daemon=True).start()

    def run(self) -> int:
        for inst in self.instances:
            self.spawn(inst)
        # Startup: every instance indexed and listening, or give up.
        while not self.stop.is_set():
            if all(i.ready.is_set() for i in self.instances):
                break
            for inst in self.instances:
                assert inst.popen is not None
                rc = inst.popen.poll()
                if rc is not None and not inst.ready.is_set():
                    time.sleep(0.2)  # let the pump print the instance's last words
                    self.emit(f"host: instance {inst.index} failed to start (exit code {rc})")
                    self.shutdown()
                    return EXIT_STARTUP_FAILED if rc == EXIT_STARTUP_FAILED else 1
            self.stop.wait(0.05)
        if self.stop.is_set():
            self.shutdown()
            return 0
        self.announce(f"ready http://{self.host}:{self.port}")
        while not self.stop.wait(0.2):
            self._watch()
        self.shutdown()
        return 0

    def _watch(self) -> None:
        now = time.monotonic()
        for inst in self.instances:
            assert inst.popen is not None
            if inst.restart_at is not None:
                if now >= inst.restart_at:
                    self.spawn(inst)
                continue
            rc = inst.popen.poll()
            if rc is None:
                continue
            quick = not inst.ready.is_set() or now - inst.started_at < 5
            inst.failures = inst.failures + 1 if quick else 0
            delay = min(RESTART_DELAY * (2 ** max(0, inst.failures - 1)), 30.0)
            self.emit(f"host: instance {inst.index} (pid {inst.popen.pid}, {inst.instance_id}) exited with "
                      f"code {rc}; restarting in {delay:.0f}s")
            inst.restart_at = now + delay

    def shutdown(self) -> None:
        alive = [i.popen for i in self.instances if i.popen is not None and i.popen.poll() is None]
        for p in alive:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE
        for p in alive:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.emit(f"host: pid {p.pid} did not stop in {STOP_GRACE:.0f}s; killing it")
                p.kill()
                p.wait(timeout=5)
        self.emit("host: stopped")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m local.host",
                                description="Local Azure Functions host for Python v2 apps")
    p.add_argument("--app-dir", required=True, help="function app root (holds host.json and function_app.py)")
    p.add_argument("--settings", required=True, help="local.settings.json whose Values become app settings")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None,
                   help="HTTP port (default: local.settings.json Host.LocalHttpPort, else 7071; 0 = a free port)")
    p.add_argument("--set", action="append", metavar="Name=Value", help="override an app setting")
    p.add_argument("--lease-dir", default=None, help="timer lease folder shared by instances (default: a temp dir)")
    p.add_argument("--keys", default=None, metavar="FILE",
                   help="the function keys (local.host.keys), made on first use; default: host-keys.json "
                        "beside the settings file")
    p.add_argument("--no-keys", action="store_true",
                   help="check no function key (as `func start`): every route is open, whatever its authLevel")
    args = p.parse_args(argv)
    if args.instances < 1:
        p.error("--instances must be at least 1")

    app_dir = Path(args.app_dir).resolve()
    if not app_dir.is_dir():
        p.error(f"--app-dir {app_dir} is not a folder")
    try:
        local = load_local_settings(Path(args.settings).resolve())
        overrides = parse_set_args(args.set)
    except (SettingError, ValueError) as e:
        p.error(str(e))
    env, skipped = worker_environment(os.environ, local["Values"], overrides)
    for name in skipped:
        if name not in overrides:
            # (Core Tools says "already defined"; that word would contain "ready" before we are.)
            print(f"host: skipping '{name}' from local settings: the environment defines it", flush=True)
    env.setdefault("FUNCTIONS_WORKER_RUNTIME", "python")
    env["AzureWebJobsScriptRoot"] = str(app_dir)

    port = args.port
    if port is None:
        port = int((local.get("Host") or {}).get("LocalHttpPort") or 7071)
    if port == 0:
        port = free_port(args.host)
    env.setdefault("WEBSITE_HOSTNAME", f"{args.host}:{port}")

    keys_file = None
    if args.no_keys:
        if args.keys:
            p.error("--keys and --no-keys exclude each other")
        print("host: --no-keys: function keys are not checked (authLevel is ignored)", flush=True)
    else:
        keys_file = Path(args.keys or Path(args.settings).resolve().with_name(KEYS_FILE)).resolve()
        try:
            load_or_create(keys_file)
        except (OSError, KeysError) as e:
            p.error(str(e))
        print(f"host: function keys from {keys_file}", flush=True)

    own_lease_dir = args.lease_dir is None
    lease_dir = Path(tempfile.mkdtemp(prefix="local-host-lease-")) if own_lease_dir else Path(args.lease_dir)
    lease_dir.mkdir(parents=True, exist_ok=True)

    sup = Supervisor(app_dir, env, args.instances, args.host, port, lease_dir, keys_file)

    def on_signal(signum: int, frame: object) -> None:
        sup.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return sup.run()
    finally:
        if own_lease_dir:
            shutil.rmtree(lease_dir, ignore_errors=True)
