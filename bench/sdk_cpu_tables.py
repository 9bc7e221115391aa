"""``bench.sdk_cpu``'s Table Storage cases: client CPU per request, SDK (sync, aio) and raw HTTP.

* sync: a ``TableClient`` on the app's transport (``shared.runtime.clients.table_service_client``:
  azure-core's requests transport, one pool); ``upsert_entity``, ``get_entity`` and the store's
  ``$batch`` REST path (``shared.storage.tables.RestTable.transact``, 3 upserts per transaction);
* aio: ``azure.data.tables.aio`` needs an async transport. aiohttp (azure-core's default) is
  not installed; azure-core's ``AsyncioRequestsTransport`` (requests in the loop's thread pool)
  is used instead when aiohttp is missing, which measures the aio pipeline, not a lighter socket;
* raw: ``bench.azraw.TableHttp`` (http.client keep-alive, SharedKeyLite signing, JSON decoded):
  a bound on what a lighter transport could give; and the same point read through a
  ``requests.Session`` (as the app's transport was, without azure-core): the SDK's get less this is
  what azure-core's pipeline and the tables SDK add on top of the transport.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

from bench.sdk_cpu_measure import Result, in_threads, sequential, timed, timed_async

WARMUP = 20
BATCH_WRITES = 3


def entity(pk: str, rk: str) -> dict[str, Any]:
    """A row of roughly the app's size (an order's state row)."""
    return {"PartitionKey": pk, "RowKey": rk, "status": "Running", "step": "charge", "attempt": 1,
            "version": 7, "customerId": "c-1", "currency": "EUR", "amount": "38.98",
            "doc": json.dumps({"items": [{"sku": "SKU-1", "quantity": 2}], "history": ["x" * 40] * 4})}


def _sync_table(conn_str: str, name: str) -> Any:
    from shared.runtime.clients import table_service_client
    from shared.settings import Connection

    service = table_service_client(Connection("StateStorage", connection_string=conn_str))
    return service.create_table_if_not_exists(name)


def _writes(i: int) -> list[Any]:
    from shared.storage.tables import Write

    return [Write("upsert", f"r{j}", {k: v for k, v in entity("", "").items() if k not in ("PartitionKey", "RowKey")})
            for j in range(BATCH_WRITES)]


def _batch(table: Any) -> Callable[[str, list[Any]], Any]:
    """The store's REST path's transaction on ``table``."""
    from shared.storage.tables import table_for

    return table_for(table).transact


def sync_cases(conn_str: str, ops: int, threads: list[int]) -> list[Result]:
    """Sequential upsert, get, fast ``$batch``; then threaded (get + batch alternating) per K."""
    table = _sync_table(conn_str, f"sdkcpu{uuid.uuid4().hex[:8]}")
    batch = _batch(table)
    for i in range(WARMUP):
        table.upsert_entity(entity("p", f"r{i}"))
        table.get_entity("p", f"r{i}")
        batch(f"w{i}", _writes(i))
    out = [
        timed("tables sync upsert_entity", ops, sequential(ops, lambda i: table.upsert_entity(entity("p", f"u{i}")))),
        timed("tables sync get_entity", ops, sequential(ops, lambda i: table.get_entity("p", f"u{i}"))),
        timed(f"tables sync $batch rest path ({BATCH_WRITES} upserts)", ops,
              sequential(ops, lambda i: batch(f"b{i}", _writes(i))), note="shared.storage.tables.RestTable"),
    ]

    def mixed(i: int) -> None:
        if i % 2:
            batch(f"t{i}", _writes(i))
        else:
            table.get_entity("p", f"u{i}")

    for k in threads:
        out.append(timed(f"tables sync get/$batch alternating, {k} threads", ops, in_threads(k, ops, mixed),
                         concurrency=k, note="one TableClient shared, as the app does"))
    return out


def mixed_op(table: Any, batch: Any) -> Callable[[int], None]:
    """Operation ``i`` of the alternating case on warmed-up rows: odd, a ``$batch`` of
    ``_writes(i)``; even, a point read of a warm-up row."""
    def op(i: int) -> None:
        if i % 2:
            batch(f"t{i}", _writes(i))
        else:
            table.get_entity("p", f"u{i % WARMUP}")

    return op


def threaded_mixed(conn_str: str, ops: int, threads: int) -> Result:
    """The threaded case alone, on a table of its own (``bench.sdk_cpu_procs``' children)."""
    table = _sync_table(conn_str, f"sdkcpu{uuid.uuid4().hex[:8]}")
    batch = _batch(table)
    for i in range(WARMUP):
        table.upsert_entity(entity("p", f"u{i}"))
        batch(f"w{i}", _writes(i))

    return timed(f"tables sync get/$batch alternating, {threads} threads", ops,
                 in_threads(threads, ops, mixed_op(table, batch)),
                 concurrency=threads)


def _aio_transport() -> tuple[Any, str]:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        from azure.core.pipeline.transport import AsyncioRequestsTransport

        return AsyncioRequestsTransport(), "AsyncioRequestsTransport (aiohttp not installed)"
    from azure.core.pipeline.transport import AioHttpTransport

    return AioHttpTransport(), "AioHttpTransport"


async def _aio_cases(conn_str: str, ops: int, tasks: list[int]) -> list[Result]:
    from azure.data.tables.aio import TableServiceClient

    transport, label = _aio_transport()
    async with TableServiceClient.from_connection_string(conn_str, transport=transport) as service:
        table = await service.create_table_if_not_exists(f"sdkcpuaio{uuid.uuid4().hex[:8]}")
        for i in range(WARMUP):
            await table.upsert_entity(entity("p", f"r{i}"))
            await table.get_entity("p", f"r{i}")

        def loop(op: Callable[[int], Any], workers: int) -> Callable[[], Any]:
            async def worker(t: int) -> int:
                errors = 0
                for i in range(t, ops, workers):
                    try:
                        await op(i)
                    except Exception:
                        errors += 1
                return errors

            async def body() -> int:
                return sum(await asyncio.gather(*(worker(t) for t in range(workers))))
            return body

        out = [await timed_async("tables aio upsert_entity", ops, loop(lambda i: table.upsert_entity(
                   entity("p", f"u{i}")), 1), note=label),
               await timed_async("tables aio get_entity", ops, loop(lambda i: table.get_entity("p", f"u{i}"), 1),
                                 note=label)]
        for k in tasks:
            out.append(await timed_async(f"tables aio get_entity, {k} tasks", ops,
                                         loop(lambda i: table.get_entity("p", f"u{i}"), k), concurrency=k,
                                         note=label))
        return out


def aio_cases(conn_str: str, ops: int, tasks: list[int]) -> list[Result]:
    return asyncio.run(_aio_cases(conn_str, ops, tasks))


def raw_cases(host: str, port: int, ops: int) -> list[Result]:
    """http.client keep-alive: point read (JSON decoded) and a 3-upsert ``$batch``."""
    from bench.azraw import TableHttp

    name = f"sdkcpuraw{uuid.uuid4().hex[:8]}"
    http = TableHttp(host, port)
    http.create_table(name)
    rows = [entity("p", f"u{i}") for i in range(ops)]
    http.batch(name, rows[:1], op="PUT")

    def read(i: int) -> None:
        status, data = http.request("GET", f"/{http.account}/{name}(PartitionKey='p',RowKey='u0')")
        if status != 200:
            raise RuntimeError(status)
        json.loads(data)

    def batch(i: int) -> None:
        http.batch(name, [entity(f"b{i}", f"r{j}") for j in range(BATCH_WRITES)], op="PUT")

    session_read = _requests_read(http, name)
    for i in range(WARMUP):
        read(i)
        session_read(i)
    try:
        return [timed("raw http.client get (point read)", ops, sequential(ops, read)),
                timed("raw requests.Session get (point read)", ops, sequential(ops, session_read)),
                timed(f"raw http.client $batch ({BATCH_WRITES} upserts)", ops, sequential(ops, batch))]
    finally:
        http.close()


def _requests_read(http: Any, name: str) -> Callable[[int], None]:
    """A signed point read through one ``requests.Session`` (the app's transport settings)."""
    from email.utils import formatdate

    import requests

    session = requests.Session()
    session.trust_env = False
    path = f"/{http.account}/{name}(PartitionKey='p',RowKey='u0')"
    url = f"http://{http.host}:{http.port}{path}"

    def read(_i: int) -> None:
        date = formatdate(usegmt=True)
        r = session.get(url, headers={"x-ms-date": date, "x-ms-version": "2019-02-02", "DataServiceVersion": "3.0",
                                      "MaxDataServiceVersion": "3.0;NetFx",
                                      "Accept": "application/json;odata=nometadata",
                                      "Authorization": http._sign(path, date)})
        if r.status_code != 200:
            raise RuntimeError(r.status_code)
        r.json()

    return read
