"""Raw Table Storage HTTP for the benchmark: entity-group transactions without the SDK.

One keep-alive ``http.client`` connection per thread, SharedKeyLite signing, and the
``$batch`` body the azure-data-tables SDK sends (one changeset, one ``application/http``
part per entity). Used to seed finished orders quickly and by Azurite's probe.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from typing import Any

from local.connections import AZURITE_ACCOUNT, AZURITE_KEY


class TableHttp:
    """A signed, keep-alive connection to one table endpoint (``http://host:port/account``)."""

    def __init__(self, host: str, port: int, account: str = AZURITE_ACCOUNT, key: str = AZURITE_KEY) -> None:
        self.host, self.port, self.account = host, port, account
        self._key = base64.b64decode(key)
        self._conn: http.client.HTTPConnection | None = None

    def _sign(self, path: str, date: str) -> str:
        to_sign = f"{date}\n/{self.account}{path}".encode()
        sig = base64.b64encode(hmac.new(self._key, to_sign, hashlib.sha256).digest()).decode()
        return f"SharedKeyLite {self.account}:{sig}"

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                ) -> tuple[int, bytes]:
        status, _, data = self.exchange(method, path, body, headers)
        return status, data

    def exchange(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                 ) -> tuple[int, dict[str, str], bytes]:
        """One signed request, sent again once on a fresh connection if the kept one broke.
        -> (status, response headers, body)."""
        date = formatdate(usegmt=True)
        h = {"x-ms-date": date, "x-ms-version": "2019-02-02", "DataServiceVersion": "3.0",
             "MaxDataServiceVersion": "3.0;NetFx", "Accept": "application/json;odata=nometadata",
             "Authorization": self._sign(path.split("?", 1)[0], date)}
        h.update(headers or {})
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                self._conn.request(method, path, body=body, headers=h)
                r = self._conn.getresponse()
                data = r.read()
                return r.status, dict(r.getheaders()), data
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def create_table(self, name: str) -> None:
        status, data = self.request("POST", f"/{self.account}/Tables", json.dumps({"TableName": name}).encode(),
                                    {"Content-Type": "application/json", "Prefer": "return-no-content"})
        if status not in (201, 204, 409):
            raise RuntimeError(f"create table {name}: {status} {data[:300]!r}")

    def batch(self, table: str, entities: Sequence[dict[str, Any]], op: str = "POST") -> None:
        """One entity-group transaction inserting (POST) / upserting (PUT) ``entities``."""
        bb, cb = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
        base = f"http://{self.host}:{self.port}/{self.account}/{table}"
        parts = [f"--{bb}\r\nContent-Type: multipart/mixed; boundary={cb}\r\n\r\n"]
        for i, e in enumerate(entities):
            payload = json.dumps(e)
            url = base if op == "POST" else (f"{base}(PartitionKey='{e['PartitionKey']}',"
                                             f"RowKey='{e['RowKey']}')")
            parts.append(
                f"--{cb}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
                f"Content-ID: {i}\r\n\r\n{op} {url} HTTP/1.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload.encode())}\r\nAccept: application/json;odata=minimalmetadata\r\n"
                f"Prefer: return-no-content\r\nDataServiceVersion: 3.0\r\n\r\n{payload}\r\n")
        parts.append(f"--{cb}--\r\n\r\n--{bb}--\r\n")
        body = "".join(parts).encode()
        status, data = self.request("POST", f"/{self.account}/$batch", body,
                                    {"Content-Type": f"multipart/mixed; boundary={bb}"})
        if status != 202 or b" 20" not in data[:400] or b"HTTP/1.1 4" in data or b"HTTP/1.1 5" in data:
            raise RuntimeError(f"batch on {table}: {status} {data[:500]!r}")

    def query(self, table: str, filter_: str | None = None, select: str | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
        """Every entity matching ``filter_`` (follows continuation tokens)."""
        from urllib.parse import quote

        out: list[dict[str, Any]] = []
        nxt: dict[str, str] = {}
        while True:
            q = []
            if filter_:
                q.append("$filter=" + quote(filter_))
            if select:
                q.append("$select=" + quote(select))
            if limit:
                q.append(f"$top={limit}")
            q += [f"{k}={quote(v)}" for k, v in nxt.items()]
            path = f"/{self.account}/{table}()" + ("?" + "&".join(q) if q else "")
            status, hdrs, data = self.exchange("GET", path)
            if status != 200:
                raise RuntimeError(f"query {table}: {status} {data[:300]!r}")
            out += json.loads(data).get("value", [])
            npk, nrk = hdrs.get("x-ms-continuation-NextPartitionKey"), hdrs.get("x-ms-continuation-NextRowKey")
            if not npk or (limit and len(out) >= limit):
                return out
            nxt = {"NextPartitionKey": npk, **({"NextRowKey": nrk} if nrk else {})}


def run_parallel(host: str, port: int, jobs: Iterable[Callable[[TableHttp], None]], threads: int,
                 progress: Callable[[int], None] | None = None) -> int:
    """Run ``jobs`` (each given its thread's connection) on ``threads`` threads; returns count."""
    local = threading.local()
    conns: list[TableHttp] = []
    lock = threading.Lock()
    done = 0

    def run(job: Callable[[TableHttp], None]) -> None:
        nonlocal done
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = TableHttp(host, port)
            with lock:
                conns.append(c)
        job(c)
        with lock:
            done += 1
            n = done
        if progress is not None:
            progress(n)

    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="azraw")
    try:
        pending: list[Any] = []
        for j in jobs:  # at most a few jobs queued per thread: an interrupt stops the run promptly
            pending.append(pool.submit(run, j))
            if len(pending) >= threads * 4:
                pending.pop(0).result()
        for f in pending:
            f.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for c in conns:
            c.close()
    return done

