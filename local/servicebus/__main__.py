"""``python -m local.servicebus --config FILE --host 127.0.0.1 --port PORT --data-dir DIR``

Prints a line containing ``ready`` once it listens. SIGTERM/SIGINT stop it cleanly: the
loop finishes its iteration, the store is committed and checkpointed, sockets are closed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from .broker import Broker
from .config import load_config
from .server import Server
from .store import Store

STATS_ENV = "LOCAL_SERVICEBUS_STATS_FILE"


class StatsWriter:
    """Writes ``Broker.op_stats()`` as JSON (atomically), from the server loop: every second,
    at once after SIGUSR1 (the signal wakes the selector), and at exit."""

    def __init__(self, path: Path, broker: Broker, interval: float = 1.0) -> None:
        self.path = path
        self.broker = broker
        self.interval = interval
        self._last = 0.0
        self._requested = False
        path.parent.mkdir(parents=True, exist_ok=True)

    def request(self) -> None:
        self._requested = True

    def maybe_write(self) -> None:
        now = time.monotonic()
        if self._requested or now - self._last >= self.interval:
            self.write()

    def write(self) -> None:
        self._requested = False
        self._last = time.monotonic()
        data = {"pid": os.getpid(), "at": time.time(), "queues": self.broker.op_stats()}
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m local.servicebus", description=__doc__)
    ap.add_argument("--config", required=True, help="Config.json of the official emulator (UserConfig format)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5672)
    ap.add_argument("--data-dir", default=None, help="folder for the SQLite store (default: a temporary folder)")
    ap.add_argument("--log-level", default="WARNING")
    ap.add_argument("--profile", default=None, help=argparse.SUPPRESS)  # cProfile stats file (development)
    ap.add_argument("--stats-file", default=os.environ.get(STATS_ENV) or None,
                    help="write per-queue operation counters (JSON) here every second, on SIGUSR1 and at exit "
                         f"(default: ${STATS_ENV})")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    config = load_config(args.config)
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="servicebus-"))
    store = Store(data_dir)
    broker = Broker(config, store)
    server = Server(broker, args.host, args.port)

    def _stop(signum: int, _frame: object) -> None:
        server.stop()

    stats = StatsWriter(Path(args.stats_file), broker) if args.stats_file else None
    if stats is not None:
        server.after_iteration = stats.maybe_write
        signal.signal(signal.SIGUSR1, lambda _s, _f: stats.request())

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.set_wakeup_fd(server.wakeup_fd, warn_on_full_buffer=False)
    host, port = server.address[:2]
    queues = ", ".join(q.name for q in config.queues)
    print(f"servicebus emulator ready on amqp://{host}:{port} (queues: {queues}; data: {data_dir})", flush=True)
    try:
        if args.profile:
            import cProfile
            import time as _time

            prof = cProfile.Profile(_time.process_time)  # CPU time, not wall time
            try:
                prof.runcall(server.run)
            finally:
                prof.dump_stats(args.profile)
        else:
            server.run()
    finally:
        store.close()
        if stats is not None:
            stats.write()
    print("servicebus emulator stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
