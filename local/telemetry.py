"""A local stand-in for Application Insights' ingestion endpoint: what the app would send, counted.

    python -m local.telemetry [--host 127.0.0.1] [--port P] [--keep N]

Prints ``telemetry ready http://HOST:PORT`` once it serves; stops on SIGTERM or Ctrl-C. The app's
exporter (``azure-monitor-opentelemetry``, as ``shared.observability.telemetry`` sets it up) is
pointed here by the connection string's ``IngestionEndpoint`` and ``LiveEndpoint``
(:func:`connection_string`; ``local.stack --telemetry`` does it). It takes what the service takes:

* ``POST /v2.1/track`` (and ``/v2/track``): the envelopes, a JSON array or one JSON object a line,
  gzip-compressed (``Content-Encoding: gzip``) or not. Answers as the service does: 200
  ``{"itemsReceived": n, "itemsAccepted": n, "errors": []}``; a body that is not envelopes gets
  400 with the same shape, naming why, and nothing of it is kept.
* ``POST /QuickPulseService.svc/ping`` and ``/post`` (live metrics): 200 with
  ``x-ms-qps-subscribed: false``, what the service answers while no one watches the portal's live
  view. Counted, as calls and bytes: live metrics are not billed as ingestion.

And for a person or a test:

* ``GET /_items``: ``{"items": [...]}``, the envelopes as received (``name``, ``time``, ``tags``,
  ``data``), oldest first; the last ``--keep`` of them (default 100,000: counts go on past it).
* ``GET /_stats``: by type (request, dependency, message, exception, metric, event, other), the
  items and their bytes (each envelope's compact JSON, the size Application Insights stores and
  bills, before compression), the same by origin (``app``, or ``host``: the local Functions host's
  own log lines, :func:`origin_of`), the request items by name (``requestsByName``: a sampled
  order's submission is one ``POST /api/orders``), the requests' bytes as sent, and the
  live-metrics calls.
* ``DELETE /_items``: forget the items and zero the counts (before a measurement).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import threading
import zlib
from collections import Counter, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from local.procs import serve_until_signalled

TRACK_PATHS = ("/v2.1/track", "/v2/track")
LIVE_PATHS = ("/QuickPulseService.svc/ping", "/QuickPulseService.svc/post")
# The envelope's data.baseType -> the item type Application Insights bills it as.
TYPES = {"RequestData": "request", "RemoteDependencyData": "dependency", "MessageData": "message",
         "ExceptionData": "exception", "MetricData": "metric", "EventData": "event"}
KINDS = (*TYPES.values(), "other")
ORIGINS = ("app", "host")  # origin_of
MAX_BODY = 64 * 1024 * 1024  # the exporter sends batches of at most 512 items: far below this
DEFAULT_KEEP = 100_000
ZERO_KEY = "00000000-0000-0000-0000-000000000000"


class BadEnvelopes(ValueError):
    """A track body that is not envelopes."""


def connection_string(base_url: str, instrumentation_key: str = ZERO_KEY) -> str:
    """The Application Insights connection string that sends an exporter's telemetry here."""
    base = base_url.rstrip("/") + "/"
    return f"InstrumentationKey={instrumentation_key};IngestionEndpoint={base};LiveEndpoint={base}"


def kind_of(envelope: dict[str, Any]) -> str:
    data = envelope.get("data")
    return TYPES.get(str(data.get("baseType")) if isinstance(data, dict) else "", "other")


def origin_of(envelope: dict[str, Any]) -> str:
    """``host`` for a log line of the local Functions host (its logger ``local.*``): in Azure the host
    sends its own telemetry, not the app's exporter; here it runs in the worker, so its lines come
    through the app's exporter and are told apart by their ``logger_name``. Else ``app``."""
    data = envelope.get("data")
    base = data.get("baseData") if isinstance(data, dict) else None
    props = base.get("properties") if isinstance(base, dict) else None
    logger = str(props.get("logger_name") or "") if isinstance(props, dict) else ""
    return "host" if logger == "local" or logger.startswith("local.") else "app"


def parse_envelopes(body: bytes, encoding: str | None) -> list[dict[str, Any]]:
    """The envelopes of a track request's body (a JSON array, or one JSON object a line); a
    ``BadEnvelopes`` saying why when it holds none."""
    if (encoding or "").strip().lower() == "gzip":
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as e:
            raise BadEnvelopes(f"Content-Encoding is gzip but the body is not: {e}") from None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadEnvelopes("the body is not UTF-8") from None
    try:
        doc = json.loads(text)
        items = doc if isinstance(doc, list) else [doc]
    except json.JSONDecodeError:
        try:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise BadEnvelopes(f"neither a JSON array nor one JSON object a line: {e}") from None
    if not items:
        raise BadEnvelopes("no envelope in the body")
    for i, item in enumerate(items):
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("data"), dict)):
            raise BadEnvelopes(f"item {i} is not an envelope (an object with a name and data)")
    return items


class Received:
    """What the receiver was sent: the items (the last ``keep``) and the counts, thread-safe."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        self._lock = threading.Lock()
        self._items: deque[dict[str, Any]] = deque(maxlen=keep)
        self._counts: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()
        self._wire = 0
        self._requests = 0
        self._live: Counter[str] = Counter()
        self._request_names: Counter[str] = Counter()

    def add(self, items: list[dict[str, Any]], wire_bytes: int) -> None:
        sized = [(kind_of(item), origin_of(item), len(json.dumps(item, separators=(",", ":")).encode("utf-8")))
                 for item in items]
        names = [str(item["data"].get("baseData", {}).get("name")) for item in items if kind_of(item) == "request"]
        with self._lock:
            self._items.extend(items)
            self._request_names.update(names)
            for kind, origin, size in sized:
                self._counts[kind] += 1
                self._bytes[kind] += size
                self._counts[origin] += 1
                self._bytes[origin] += size
            self._wire += wire_bytes
            self._requests += 1

    def add_live(self, path: str, wire_bytes: int) -> None:
        with self._lock:
            self._live["calls"] += 1
            self._live["bytes"] += wire_bytes
            self._live[path.rsplit("/", 1)[-1]] += 1

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._items)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"items": sum(self._counts[k] for k in KINDS), "bytes": sum(self._bytes[k] for k in KINDS),
                    "byType": {k: {"items": self._counts[k], "bytes": self._bytes[k]} for k in KINDS},
                    "byOrigin": {k: {"items": self._counts[k], "bytes": self._bytes[k]} for k in ORIGINS},
                    "requestsByName": dict(self._request_names),
                    "trackRequests": self._requests, "wireBytes": self._wire,
                    "liveMetrics": {"calls": self._live["calls"], "bytes": self._live["bytes"],
                                    "ping": self._live["ping"], "post": self._live["post"]}}

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._counts.clear()
            self._bytes.clear()
            self._live.clear()
            self._request_names.clear()
            self._wire = self._requests = 0


class TelemetryReceiver(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0, keep: int = DEFAULT_KEEP) -> None:
        self.received = Received(keep)
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}" if isinstance(host, str) else f"http://{host.decode()}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: TelemetryReceiver
    protocol_version = "HTTP/1.1"
    server_version = "local-telemetry"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _reply(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(doc).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, {"itemsReceived": 0, "itemsAccepted": 0,
                              "errors": [{"index": 0, "statusCode": 413, "message": "body too large"}]})
            self.close_connection = True
            return None
        return self.rfile.read(length) if length else b""

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        path = urlsplit(self.path).path.rstrip("/")
        body = self._body()
        if body is None:
            return
        if path in TRACK_PATHS:
            try:
                items = parse_envelopes(body, self.headers.get("Content-Encoding"))
            except BadEnvelopes as e:
                self._reply(400, {"itemsReceived": 0, "itemsAccepted": 0,
                                  "errors": [{"index": 0, "statusCode": 400, "message": str(e)}]})
                return
            self.server.received.add(items, len(body))
            self._reply(200, {"itemsReceived": len(items), "itemsAccepted": len(items), "errors": []})
        elif path in LIVE_PATHS:
            self.server.received.add_live(path, len(body))
            self._reply(200, {}, {"x-ms-qps-subscribed": "false"})
        else:
            self._reply(404, {"error": f"no such endpoint: POST {path}"})

    def do_GET(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/_items":
            self._reply(200, {"items": self.server.received.items()})
        elif path == "/_stats":
            self._reply(200, self.server.received.stats())
        else:
            self._reply(404, {"error": f"no such endpoint: GET {path}"})

    def do_DELETE(self) -> None:  # noqa: N802
        if urlsplit(self.path).path.rstrip("/") == "/_items":
            self.server.received.clear()
            self._reply(200, {"cleared": True})
        else:
            self._reply(404, {"error": f"no such endpoint: DELETE {self.path}"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m local.telemetry", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed on the ready line)")
    ap.add_argument("--keep", type=int, default=DEFAULT_KEEP,
                    help=f"items kept for GET /_items (default {DEFAULT_KEEP}; the counts go on past it)")
    args = ap.parse_args(argv)
    if args.keep < 1:
        ap.error("--keep must be at least 1")
    server = TelemetryReceiver(args.host, args.port, args.keep)
    serve_until_signalled(server, f"telemetry ready {server.url}")
    print("telemetry stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
