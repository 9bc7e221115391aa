"""Counting of Table Storage requests, attached to the host processes from outside the app.

The benchmark starts the host processes with ``bench/startup`` first on ``PYTHONPATH`` and
``BENCH_OPCOUNT_DIR`` set (:func:`host_env`); that folder's ``sitecustomize.py`` calls
:func:`install`, which wraps the ``send`` of the store's table transport
(``shared.storage.transport.Urllib3Transport``, as its module is imported) and of azure-core's
``RequestsTransport`` (the SDK's). Every request to the table service is counted there, retries
included, by table and kind (:func:`classify`: ``batch``, ``query``, ``get``, ``insert``, ``upsert``,
``delete``, ``table``; a request on the breakers', waiting steps' or stats partitions carries the
mark ``|breakers``, ``|waiting`` or ``|stats``), with the entities it carries or returns. A thread
writes the totals to ``DIR/table-<pid>.json`` twice a second; :func:`read_totals` sums them. Cost:
a regular-expression search and a dictionary update per request. Standard library only at import
(``sitecustomize`` loads this file by its path, before the app's folder is on ``sys.path``).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

ENV = "BENCH_OPCOUNT_DIR"
STARTUP_DIR = Path(__file__).resolve().parent / "startup"  # holds the sitecustomize.py
_APP_HTTP = b"application/http"
_PART_LINE = re.compile(rb"(?:POST|PUT|MERGE|PATCH|DELETE) (https?://\S+) HTTP/1")
# the first partition a request names: in a key (PartitionKey='p'), a filter (PartitionKey eq 'p')
# or an entity's JSON ("PartitionKey": "p")
_PARTITION = re.compile(r"""PartitionKey(?:='|[\s+]+eq[\s+]+'|"\s*:\s*")([^'"]*)""")


def enabled() -> bool:
    return bool(os.environ.get(ENV))


class Counter:
    """Totals by (table, kind): requests, entities, failures (status >= 400), seconds."""

    def __init__(self, path: Path | None, interval: float = 0.5) -> None:
        self.path = path
        self.interval = interval
        self._lock = threading.Lock()
        self.totals: dict[str, dict[str, float]] = {}
        self._dirty = False
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            threading.Thread(target=self._writer, name="opcount", daemon=True).start()
            atexit.register(self.flush)

    def add(self, table: str, kind: str, entities: int, status: int, seconds: float) -> None:
        key = f"{table}|{kind}"
        with self._lock:
            t = self.totals.get(key)
            if t is None:
                t = self.totals[key] = {"requests": 0, "entities": 0, "failed": 0, "seconds": 0.0}
            t["requests"] += 1
            t["entities"] += entities
            if status >= 400:
                t["failed"] += 1
            t["seconds"] += seconds
            self._dirty = True

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {k: dict(v) for k, v in self.totals.items()}

    def flush(self) -> None:
        if self.path is None:
            return
        with self._lock:
            if not self._dirty:
                return
            data = {"pid": os.getpid(), "at": time.time(), "totals": {k: dict(v) for k, v in self.totals.items()}}
            self._dirty = False
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)

    def _writer(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.flush()
            except OSError:
                pass


def _table_of(path: str) -> str:
    """``/account/orders(PartitionKey='x',RowKey='y')`` -> ``orders``; ``/account/Tables`` -> ``Tables``."""
    parts = [p for p in unquote(path).split("/") if p]
    last = parts[-1] if parts else ""
    return last.split("(", 1)[0]


READ_KINDS = ("get", "query")


def kind_of(key: str) -> str:
    """The request kind of a ``table|kind`` key, without its partition mark: ``orders|get|breakers``
    -> ``get`` (the mark is a third field, so ``key.split("|")[:2]`` still reads table and kind)."""
    parts = key.split("|")
    return parts[1] if len(parts) > 1 else parts[0]


def mark_of(key: str) -> str:
    """The partition a ``table|kind|mark`` key names (``breakers``, ``waiting``, ``stats``), or ""."""
    parts = key.split("|")
    return parts[2] if len(parts) > 2 else ""


def is_read(key: str) -> bool:
    """A point read or a query (of any partition)."""
    return kind_of(key) in READ_KINDS


def _marked(kind: str, text: str) -> str:
    """``kind``, suffixed with the partition it names (``get|breakers``, ``query|waiting``, ``batch|stats``)."""
    m = _PARTITION.search(text)
    partition = m.group(1) if m else ""
    if partition == "breakers":
        return f"{kind}|breakers"
    if partition.startswith("waiting-"):
        return f"{kind}|waiting"
    if partition == "stats":
        return f"{kind}|stats"
    return kind


def classify(method: str, url: str, body: Any) -> tuple[str, str, int]:
    """(table, kind, entities sent) of one request."""
    table, kind, entities = _classify(method, url, body)
    raw = body.decode("latin-1") if isinstance(body, (bytes, bytearray)) else (body if isinstance(body, str) else "")
    return table, _marked(kind, f"{unquote(url)} {raw}") if table != "Tables" else kind, entities


def _classify(method: str, url: str, body: Any) -> tuple[str, str, int]:
    split = urlsplit(url)
    table = _table_of(split.path)
    method = method.upper()
    if table == "$batch":
        raw = body if isinstance(body, (bytes, bytearray)) else (body.encode() if isinstance(body, str) else b"")
        # each operation of the changeset is one application/http part
        ops = raw.count(_APP_HTTP)
        m = _PART_LINE.search(raw)
        name = _table_of(urlsplit(m.group(1).decode("latin-1")).path) if m else "?"
        return name, "batch", ops
    if table in ("Tables",) or table.startswith("Tables"):
        return "Tables", "table", 0
    keyed = "(" in unquote(split.path).rsplit("/", 1)[-1] and "PartitionKey=" in unquote(split.path)
    if method == "GET":
        return table, ("get" if keyed else "query"), 0
    if method == "DELETE":
        return table, "delete", 1
    if method == "POST":
        return table, "insert", 1
    return table, "upsert", 1  # PUT / MERGE / PATCH


def _body(request: Any) -> Any:
    for attr in ("body", "content", "data"):
        try:
            value = getattr(request, attr)
        except Exception:  # noqa: BLE001
            continue
        if isinstance(value, (bytes, bytearray, str)):
            return value
    return None


def _entities_returned(response: Any) -> int:
    try:
        body = response.content  # a rest response (read); a legacy one has body()
    except Exception:  # noqa: BLE001 - a streamed or failed response: nothing counted
        try:
            body = response.body()
        except Exception:  # noqa: BLE001
            return 0
    if not body:
        return 0
    return body.count(b'"PartitionKey"')


_counter: Counter | None = None
_lock = threading.Lock()


def counter() -> Counter:
    """This process's counter (writing to ``$BENCH_OPCOUNT_DIR/table-<pid>.json`` if set)."""
    global _counter
    if _counter is None:
        with _lock:
            if _counter is None:
                d = os.environ.get(ENV)
                _counter = Counter(Path(d) / f"table-{os.getpid()}.json" if d else None)
    return _counter


def count_request(counter: Counter, request: Any, response: Any, seconds: float) -> None:
    """Add one sent request (and its response) to ``counter``; never raises."""
    try:
        table, kind, entities = classify(request.method, request.url, _body(request))
        if kind.split("|")[0] in READ_KINDS:  # marked reads too (query|stats, get|breakers)
            entities = _entities_returned(response)
        counter.add(table, kind, entities, int(getattr(response, "status_code", 0) or 0), seconds)
    except Exception:  # noqa: BLE001 - counting must never break a request
        pass


APP_TRANSPORT = ("shared.storage.transport", "Urllib3Transport")


def _count_sends(cls: Any, totals: Counter) -> None:
    """Wrap ``cls.send`` (once) so that every request it sends is added to ``totals``."""
    original = cls.__dict__.get("send", cls.send)
    if getattr(original, "counted_by_bench", False):
        return

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        response = original(self, request, **kwargs)
        count_request(totals, request, response, time.perf_counter() - started)
        return response

    send.counted_by_bench = True  # type: ignore[attr-defined]
    send.__wrapped__ = original  # type: ignore[attr-defined]
    cls.send = send


class _CountOnImport(importlib.abc.MetaPathFinder):
    """Wraps the app transport's ``send`` as its module is imported: ``sitecustomize`` runs before
    the app's folder is on ``sys.path``, so the module cannot be imported here."""

    def __init__(self, totals: Counter) -> None:
        self.totals = totals

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != APP_TRANSPORT[0]:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, totals = spec.loader, self.totals
        load = loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            _count_sends(getattr(module, APP_TRANSPORT[1]), totals)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> bool:
    """Count every request the store's table transport and azure-core's ``RequestsTransport`` send
    in this process (once).

    Returns False (and changes nothing) if counting is not switched on (``BENCH_OPCOUNT_DIR``)."""
    if not enabled():
        return False
    from azure.core.pipeline.transport import RequestsTransport

    totals = counter()
    _count_sends(RequestsTransport, totals)
    module = sys.modules.get(APP_TRANSPORT[0])
    if module is not None:
        _count_sends(getattr(module, APP_TRANSPORT[1]), totals)
    elif not any(isinstance(f, _CountOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _CountOnImport(totals))
    return True


def host_env(directory: Path | str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that switches counting on in the processes it is given to."""
    base = dict(os.environ) if base is None else base
    paths = [str(STARTUP_DIR), *(p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {ENV: str(directory), "PYTHONPATH": os.pathsep.join(paths)}


def read_totals(directory: Path | str) -> dict[str, dict[str, float]]:
    """Sum of every process's totals in ``directory`` (the benchmark's side)."""
    out: dict[str, dict[str, float]] = {}
    for f in Path(directory).glob("table-*.json"):
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key, t in data.get("totals", {}).items():
            acc = out.setdefault(key, {"requests": 0, "entities": 0, "failed": 0, "seconds": 0.0})
            for k, v in t.items():
                acc[k] = acc.get(k, 0) + v
    return out
