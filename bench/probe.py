"""A latency probe of Azurite, run as its own process (no GIL shared with the stack) during the
saturation, latency and sustained phases: ``python -m bench.probe --host H --port P --table T``.

It point-reads one absent entity every 50 ms over a keep-alive connection and prints one JSON
line when stopped: the percentiles, and the reads slower than ``--slow-ms`` with their times
(``bench.tail`` lays them beside the slowest orders).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time


def percentiles(samples: list[float]) -> dict[str, float | int | None]:
    if not samples:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    s = sorted(samples)
    return {"n": len(s), "p50": round(statistics.median(s), 2), "p95": round(s[int(0.95 * (len(s) - 1))], 2),
            "max": round(s[-1], 2)}


def main(argv: list[str] | None = None) -> int:
    from bench.azraw import TableHttp

    ap = argparse.ArgumentParser(prog="python -m bench.probe")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--slow-ms", type=float, default=25.0)
    a = ap.parse_args(argv)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    conn = TableHttp(a.host, a.port)
    samples: list[float] = []
    slow: list[tuple[float, float]] = []  # (epoch seconds at the start, ms)
    errors = 0
    end = time.monotonic() + a.seconds
    try:
        while not stop[0] and time.monotonic() < end:
            at, t0 = time.time(), time.perf_counter()
            try:
                conn.request("GET", f"/{a.table}(PartitionKey='probe',RowKey='probe')")
                took = 1000 * (time.perf_counter() - t0)
                samples.append(took)
                if took >= a.slow_ms and len(slow) < 200:
                    slow.append((round(at, 3), round(took, 1)))
            except OSError:
                errors += 1
            time.sleep(a.interval)
    finally:
        conn.close()
    print(json.dumps({"point_read_ms": percentiles(samples), "errors": errors, "slow_ms": a.slow_ms, "slow": slow}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
