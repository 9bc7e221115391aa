"""``python -m local.servicebus --config FILE --host 127.0.0.1 --port PORT --data-dir DIR``

Prints a line containing ``ready`` once it listens. SIGTERM/SIGINT stop it cleanly: the
loop finishes its iteration, the store is committed and checkpointed, sockets are closed.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
from pathlib import Path

from .broker import Broker
from .config import load_config
from .server import Server
from .store import Store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m local.servicebus", description=__doc__)
    ap.add_argument("--config", required=True, help="Config.json of the official emulator (UserConfig format)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5672)
    ap.add_argument("--data-dir", default=None, help="folder for the SQLite store (default: a temporary folder)")
    ap.add_argument("--log-level", default="WARNING")
    ap.add_argument("--profile", default=None, help=argparse.SUPPRESS)  # cProfile stats file (development)
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
    print("servicebus emulator stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
