"""Client CPU per agent remote call: this tree's ``RemotePost`` against another git ref's.

``.venv/bin/python -m bench.remote_cpu [--ref 4654160] [--calls 2000] [--rounds 3] [--traced]``

A stdlib HTTP/1.1 keep-alive server in its own process answers every POST with a small JSON
object (its CPU is not counted). Each round runs, for the other ref's ``shared/`` (exported with
``git archive`` to a temporary directory) and then for this tree's, a child process that makes
``--calls`` sequential ``RemotePost`` calls (after 100 warm-up calls) and reports its own CPU
(``getrusage``, user + system, every thread) per call. Rounds alternate old/new so machine load
drifts hit both. ``--traced``: an SDK tracer provider (no exporter) and ``telemetry.setup({})``,
so the HTTP instrumentation makes a CLIENT span per call, as in Azure. Not a test: a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ANSWER = json.dumps({"reservationId": "r-1"}).encode()


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall between them

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)


def serve() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


def child(base: str, calls: int, traced: bool) -> None:
    """Make the calls with whatever ``shared`` is on sys.path; print the CPU µs per call."""
    from shared import agent
    from shared.agent.remote import RemotePost, RetryPolicy
    from shared.observability import telemetry

    if traced:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        telemetry.setup({})
    connect = getattr(agent, "pool_for", None) or agent.session_for  # type: ignore[attr-defined]
    conn = connect(base)
    body = {"kind": "step", "orderId": "o-bench", "step": "reserve-inventory", "operation": "reserve",
            "attempt": 1, "idempotencyKey": "o-bench:reserve-inventory",
            "completeBy": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
            "order": {"customerId": "c-1", "currency": "EUR", "total": "19.98",
                      "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}]}, "context": {}}
    request = agent.parse_request(json.dumps(body).encode(), message_id=f"m-{uuid.uuid4().hex}", reply_to="replies",
                                  agent="inventory")
    policy = RetryPolicy()

    def one() -> None:
        post = RemotePost.for_request(request, base, conn, policy, lambda: 3600.0, lambda: datetime.now(UTC))
        answer = post.run(time.sleep, on_retry=lambda _state: None)
        assert answer.status == 200, answer

    for _ in range(100):
        one()
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(calls):
        one()
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(json.dumps({"us_per_call": cpu / calls * 1e6}))


def _run_child(tree: Path, base: str, calls: int, traced: bool) -> float:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", base, "--calls", str(calls)]
    out = subprocess.run(cmd + (["--traced"] if traced else []), cwd=tree, check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(tree)}, timeout=600)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["us_per_call"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.remote_cpu", description=__doc__)
    ap.add_argument("--ref", default="4654160",
                    help="the git ref to compare this tree with (default: the last commit on requests)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--traced", action="store_true")
    ap.add_argument("--child", metavar="BASE_URL", help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve()
        return 0
    if args.child:
        child(args.child, args.calls, args.traced)
        return 0
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        base = f"http://127.0.0.1:{server.stdout.readline().strip()}/inventory"
        with tempfile.TemporaryDirectory() as old:
            archive = subprocess.run(["git", "archive", args.ref, "shared", "workflows"], cwd=REPO, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
            results: dict[str, list[float]] = {args.ref: [], "this tree": []}
            for _ in range(args.rounds):
                results[args.ref].append(_run_child(Path(old), base, args.calls, args.traced))
                results["this tree"].append(_run_child(REPO, base, args.calls, args.traced))
    finally:
        server.terminate()
        server.wait(timeout=10)
    for label, rounds in results.items():
        print(f"{label:>10}: {statistics.median(rounds):7.1f} µs CPU/call, median of "
              f"({', '.join(f'{r:.1f}' for r in rounds)}){' traced' if args.traced else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
