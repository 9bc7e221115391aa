"""Table-request counting is the benchmark's, attached to the host processes from outside the app:
``bench/startup/sitecustomize.py`` + ``BENCH_OPCOUNT_DIR`` wrap the app's table transport, azure-core's
RequestsTransport (``shared.storage.tables.requests_transport``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from bench import opcount
from local.procs import REPO_ROOT

# A process started as the bench starts the host: a tiny table service answers every request,
# the app's transport (as shared.runtime.clients builds it: BUILDER) sends one request of each kind. The
# app's folder comes on sys.path after start-up, as in the host.
CHILD = r'''
import json, sys, threading
sys.path.insert(0, REPO_ROOT)
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from azure.core.rest import HttpRequest
from shared.storage.tables import requests_transport

class Table(BaseHTTPRequestHandler):
    def _answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"value": [{"PartitionKey": "a"}, {"PartitionKey": "b"}]}).encode()
        self.send_response(404 if "missing" in self.path else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = do_MERGE = _answer
    def log_message(self, *a):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Table)
threading.Thread(target=server.serve_forever, daemon=True).start()
base = f"http://127.0.0.1:{server.server_port}/devstoreaccount1"
batch = (b"--changeset\r\nContent-Type: application/http\r\n\r\nPOST " + base.encode() + b"/orders HTTP/1.1\r\n\r\n"
         b"--changeset\r\nContent-Type: application/http\r\n\r\nMERGE " + base.encode() + b"/orders HTTP/1.1\r\n\r\n")
with requests_transport() as transport:
    for method, url, data in [
        ("GET", base + "/orders()?$filter=PartitionKey%20eq%20'a'", None),
        ("GET", base + "/orders(PartitionKey='a',RowKey='state')", None),
        ("POST", base + "/$batch", batch),
        ("PUT", base + "/deadlines(PartitionKey='d',RowKey='o')", b"{}"),
        ("DELETE", base + "/missing(PartitionKey='d',RowKey='o')", None),
    ]:
        transport.send(HttpRequest(method, url, content=data)).read()
counted = getattr(type(transport).send, "counted_by_bench", False)
print(type(transport).__name__, "counted" if counted else "not counted")
'''


def run_child(env: dict[str, str]) -> str:
    code = CHILD.replace("REPO_ROOT", repr(str(REPO_ROOT)))
    proc = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_process_started_with_host_env_counts_its_table_requests(tmp_path: Path) -> None:
    """The app's transport counts each kind of request the store sends."""
    env = {**os.environ, **opcount.host_env(tmp_path / "counts")}
    assert run_child(env) == "RequestsTransport counted"
    totals = opcount.read_totals(tmp_path / "counts")
    got = {k: (v["requests"], v["entities"], v["failed"]) for k, v in totals.items()}
    assert got == {
        "orders|query": (1, 2, 0),  # entities returned
        "orders|get": (1, 2, 0),
        "orders|batch": (1, 2, 0),  # operations of the changeset, named by the table inside it
        "deadlines|upsert": (1, 1, 0),
        "missing|delete": (1, 1, 1),  # a 404 is a failed request
    }


def test_without_the_variable_nothing_is_counted(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != opcount.ENV}
    env["PYTHONPATH"] = str(opcount.STARTUP_DIR)
    assert run_child(env) == "RequestsTransport not counted"
    assert opcount.read_totals(tmp_path) == {}


def test_host_env_puts_the_startup_folder_first() -> None:
    env = opcount.host_env("/tmp/c", base={"PYTHONPATH": "/a" + os.pathsep + "/b"})
    assert env == {opcount.ENV: "/tmp/c", "PYTHONPATH": os.pathsep.join([str(opcount.STARTUP_DIR), "/a", "/b"])}
    assert (opcount.STARTUP_DIR / "sitecustomize.py").is_file()
    assert sorted(p.name for p in opcount.STARTUP_DIR.iterdir() if p.suffix == ".py") == ["sitecustomize.py"]


def test_the_app_holds_no_benchmark_code() -> None:
    files = [REPO_ROOT / "function_app.py", *(REPO_ROOT / "shared").rglob("*.py"),
             *(REPO_ROOT / "functions").rglob("*.py")]
    pattern = re.compile(r"opcount|OPCOUNT|bench")  # issue 10 §4: the app holds only the app
    hits = [f"{f.relative_to(REPO_ROOT)}:{n}" for f in files
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_search_index_requests_are_counted_under_their_own_table() -> None:
    """OrderIndexTable (issue 11): its queries, point operations and group-committed batches
    are told apart from the state and deadline tables by the table they name."""
    base = "http://127.0.0.1:1/devstoreaccount1"
    part = ("--changeset\r\nContent-Type: application/http\r\n\r\n{} " + base +
            "/orderindex(PartitionKey='orders',RowKey='{}') HTTP/1.1\r\n\r\n")
    batch = "".join(part.format(*op) for op in (("PUT", "all-1"), ("PUT", "cat-processed-1"),
                                                 ("DELETE", "cat-inFlight-1")))
    assert opcount.classify("POST", base + "/$batch", batch.encode()) == ("orderindex", "batch", 3)
    query = base + "/orderindex()?$filter=PartitionKey%20eq%20%27orders%27%20and%20RowKey%20ge%20%27cat-%27&$top=51"
    assert opcount.classify("GET", query, None) == ("orderindex", "query", 0)
    row = base + "/orderindex(PartitionKey='orders',RowKey='fin-20261123-1')"
    assert opcount.classify("DELETE", row, None) == ("orderindex", "delete", 1)
    assert opcount.classify("PUT", row, b"{}") == ("orderindex", "upsert", 1)


def test_the_breakers_partitions_are_told_apart_from_the_orders() -> None:
    """Issue 15: the circuit breaker's point read per agent call (partition ``breakers`` of the
    state table) gets its own kind, as do the waiting-step index's requests (``waiting-{remote}``);
    an order's own requests keep theirs."""
    base = "http://127.0.0.1:1/devstoreaccount1"
    assert opcount.classify("GET", base + "/orders(PartitionKey=%27breakers%27,RowKey=%27shipping%27)", None) == \
        ("orders", "get|breakers", 0)
    assert opcount.classify("GET", base + "/orders(PartitionKey='0af3',RowKey='state')", None) == ("orders", "get", 0)
    # an agent instance's one query of every breaker (shared.agent.board)
    every = base + "/orders()?$filter=PartitionKey%20eq%20%27breakers%27&$top=1000"
    assert opcount.classify("GET", every, None) == ("orders", "query|breakers", 0)
    assert opcount.is_read("orders|query|breakers") and opcount.mark_of("orders|query|breakers") == "breakers"
    waiting = base + "/orders()?$filter=PartitionKey%20eq%20%27waiting-shipping%27&$select=RowKey"
    assert opcount.classify("GET", waiting, None) == ("orders", "query|waiting", 0)
    order = base + "/orders()?$filter=PartitionKey%20eq%20%270af3%27"
    assert opcount.classify("GET", order, None) == ("orders", "query", 0)
    part = "--changeset\r\nContent-Type: application/http\r\n\r\nPOST " + base + "/orders HTTP/1.1\r\n\r\n{}\r\n"
    created = part.replace("{}", '{"PartitionKey": "breakers", "RowKey": "shipping"}')
    assert opcount.classify("POST", base + "/$batch", created.encode()) == ("orders", "batch|breakers", 1)
    replaced = ("--changeset\r\nContent-Type: application/http\r\n\r\nPUT " + base +
                "/orders(PartitionKey='waiting-shipping',RowKey='k') HTTP/1.1\r\n\r\n{}\r\n")
    assert opcount.classify("POST", base + "/$batch", replaced.encode()) == ("orders", "batch|waiting", 1)
    submission = part.replace("{}", '{"PartitionKey": "0af3", "RowKey": "state"}')
    assert opcount.classify("POST", base + "/$batch", submission.encode()) == ("orders", "batch", 1)
    stats = ("--changeset\r\nContent-Type: application/http\r\n\r\nPATCH " + base +
             "/orderindex(PartitionKey='stats',RowKey='m-202611261000-p1') HTTP/1.1\r\n\r\n{}\r\n")
    assert opcount.classify("POST", base + "/$batch", stats.encode()) == ("orderindex", "batch|stats", 1)
    index = stats.replace("'stats'", "'orders'")
    assert opcount.classify("POST", base + "/$batch", index.encode()) == ("orderindex", "batch", 1)


def test_a_marked_kind_is_still_a_read_or_a_write() -> None:
    """Consumers that ask "read or write?" (the search page's and the overview's cost, the sweep's
    reads) see through the partition mark."""
    assert opcount.kind_of("orders|get|breakers") == "get" and opcount.is_read("orders|get|breakers")
    assert opcount.is_read("orders|query|waiting") and opcount.is_read("orderindex|query")
    assert not opcount.is_read("orders|batch|breakers") and not opcount.is_read("orders|batch")
    assert opcount.mark_of("orders|get|breakers") == "breakers" and opcount.mark_of("orders|query|waiting") == "waiting"
    assert opcount.mark_of("orders|get") == ""


class _Request:
    def __init__(self, url: str) -> None:
        self.method, self.url, self.body = "GET", url, None


class _Response:
    status_code = 200

    def __init__(self, body: bytes) -> None:
        self._body = body

    def body(self) -> bytes:
        return self._body


def test_the_entities_a_marked_read_returns_are_counted() -> None:
    """A read of a marked partition (the stats rows, a breaker, the waiting steps) counts the
    entities it returns as an unmarked one does (they were counted as 0 once marked)."""
    base = "http://127.0.0.1:1/devstoreaccount1"
    two = b'{"value":[{"PartitionKey":"stats","RowKey":"m-1"},{"PartitionKey":"stats","RowKey":"m-2"}]}'
    c = opcount.Counter(None)
    opcount.count_request(c, _Request(base + "/orderindex()?$filter=PartitionKey%20eq%20%27stats%27"), _Response(two),
                          0.01)
    opcount.count_request(c, _Request(base + "/orders()?$filter=PartitionKey%20eq%20%27waiting-shipping%27"),
                          _Response(two.replace(b"stats", b"waiting-shipping")), 0.01)
    opcount.count_request(c, _Request(base + "/orders()?$filter=PartitionKey%20eq%20%270af3%27"), _Response(two), 0.01)
    totals = c.snapshot()
    assert totals["orderindex|query|stats"]["entities"] == 2
    assert totals["orders|query|waiting"]["entities"] == 2
    assert totals["orders|query"]["entities"] == 2
