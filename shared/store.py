"""The state store: Azure Table Storage, and an in-memory twin with the same semantics.

Table layout
------------
StateTable (setting ``StateTable``), PartitionKey = orderId (32 hex chars), so that every
row of an order can be written in ONE entity-group transaction:

* RowKey ``order``  - the accepted order: CustomerId, Currency, Items (JSON, decimal strings),
  Total (decimal string), Priority, StatusQueue, BodyHash, IdempotencyKey, Traceparent,
  CreatedAt. Written once, never updated.
* RowKey ``state``  - the order-level state row: OrderID, ProcessState (Pending | Processing |
  Processed | Error), LockedBy, ClaimToken, CompleteBy, FailureCount, Mode (forward |
  compensate | held | finished), Outcome, StepIndex/StepName/Attempt of the current step,
  CompIndex/CompFailureCount of the current compensation, LeaseKey (what is in flight:
  ``unclaimed``, ``STEP:ATTEMPT``, ``STEP:compensate:ATTEMPT`` or empty), ScheduleSeq,
  ClaimedSeq, FailedStep, Reason, CompensationState, UpdatedAt.
* RowKey ``step-NN-NAME`` - one per workflow step: Name, Index, State (Pending | Running |
  Done | Failed), Attempt, CompleteBy, StartedAt, FinishedAt, Result (JSON), FailureReason,
  Compensation ('' | Pending | Running | Done | Failed), CompensationAttempt,
  CompensationCompleteBy, CompensationStartedAt, CompensationFinishedAt, CompensationResult,
  CompensationReason.

DeadlineTable (setting ``DeadlineTable``): the Supervisor's index of deadlines, about ONE row
per order in flight (``shared.statemachine``, "The deadline index"). PartitionKey = due minute
``yyyyMMddHHmm`` (UTC), RowKey = ``orderId:due``, properties OrderId, Due. A row's Due is never
later than its order's CompleteBy; the submission writes it BEFORE its transaction, the forward
path never touches it, the last transition deletes it (best effort) and the sweep moves it
later when the order is slower than that. A sweep reads only buckets that are due:
``PartitionKey le @bucket``.

The state row's ``IndexDue`` names the row the order's own writes put (so that the last
transition can delete it).

Times are stored as ISO-8601 UTC strings with microseconds (they sort as text), money as
decimal strings, absent values as absent properties (REPLACE writes the full entity).

Concurrency: every update is a REPLACE conditioned on the ETag read
(``MatchConditions.IfNotModified``); a 412 (or a 409 on create) is a lost race and surfaces as
:class:`Conflict`. Multi-row writes use ``submit_transaction`` (same PartitionKey, atomic).
"""

from __future__ import annotations

import itertools
import re
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ETAG = "_etag"
_PART_STATUS = re.compile(rb"\r\nHTTP/1\.1 (\d{3}) ")

ORDER_ROW = "order"
STATE_ROW = "state"


def step_row_key(index: int, name: str) -> str:
    return f"step-{index:02d}-{name}"


class Conflict(Exception):
    """A conditional write lost: the row changed (412) or already exists (409)."""


class TooLarge(Exception):
    """An entity or transaction exceeds Table Storage limits."""


@dataclass(frozen=True)
class Op:
    """One write of a transaction. ``row`` holds RowKey and properties (no PartitionKey)."""

    kind: Literal["create", "replace", "delete"]
    row: dict[str, Any]
    etag: str | None = None  # required for replace/delete: the ETag the decision was made on

    @property
    def row_key(self) -> str:
        return str(self.row["RowKey"])


def clean(row: dict[str, Any]) -> dict[str, Any]:
    """Properties to write: no metadata, no None (absent = null)."""
    return {k: v for k, v in row.items() if not k.startswith("_") and v is not None and k != "PartitionKey"}


class Store(Protocol):
    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]: ...
    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None: ...
    def transact(self, order_id: str, ops: Sequence[Op]) -> None: ...
    def put_index(self, bucket: str, row_key: str, props: dict[str, Any]) -> None: ...
    def delete_index(self, bucket: str, row_key: str) -> None: ...
    def due_index(self, bucket: str, limit: int) -> list[dict[str, Any]]: ...


# ---------------------------------------------------------------------------------------------
# Limits shared by both implementations (Table Storage documented limits)
MAX_BATCH_OPS = 100
MAX_STRING_BYTES = 64 * 1024  # a String property is at most 64 KiB (UTF-16)
MAX_PROPERTIES = 252


def _check_entity(row: dict[str, Any]) -> None:
    props = clean(row)
    if len(props) > MAX_PROPERTIES:
        raise TooLarge(f"{len(props)} properties")
    for k, v in props.items():
        if isinstance(v, str) and len(v.encode("utf-16-le")) > MAX_STRING_BYTES:
            raise TooLarge(f"property {k} is larger than 64 KiB")


# ---------------------------------------------------------------------------------------------
class MemoryStore:
    """In-memory store with Table Storage's ETag and transaction semantics (for unit tests).

    * create of an existing row -> Conflict; replace/delete with a stale ETag or of a missing
      row -> Conflict; a transaction applies all of its ops or none; at most 100 ops, one op
      per row, string properties at most 64 KiB.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, str], tuple[dict[str, Any], str]] = {}
        self._etags = itertools.count(1)
        self.writes = 0  # number of successful write requests (tests of cost)
        self.reads: list[tuple[str, str]] = []  # (table, partition) of every read

    def _etag(self) -> str:
        return f'W/"{next(self._etags)}"'

    # state table ------------------------------------------------------------------------------
    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        with self._lock:
            self.reads.append(("state", order_id))
            return {rk: {**props, "PartitionKey": pk, "RowKey": rk, ETAG: etag}
                    for (t, pk, rk), (props, etag) in self._rows.items() if t == "state" and pk == order_id}

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        with self._lock:
            self.reads.append(("state", order_id))
            hit = self._rows.get(("state", order_id, row_key))
            if hit is None:
                return None
            props, etag = hit
            return {**props, "PartitionKey": order_id, "RowKey": row_key, ETAG: etag}

    def transact(self, order_id: str, ops: Sequence[Op]) -> None:
        if not ops:
            return
        if len(ops) > MAX_BATCH_OPS:
            raise TooLarge(f"{len(ops)} operations in one transaction")
        keys = [op.row_key for op in ops]
        if len(set(keys)) != len(keys):
            raise ValueError("a transaction may touch each row once")
        for op in ops:
            if op.kind != "delete":
                _check_entity(op.row)
        with self._lock:
            for op in ops:  # validate everything first: all or nothing
                cur = self._rows.get(("state", order_id, op.row_key))
                if op.kind == "create":
                    if cur is not None:
                        raise Conflict(f"{op.row_key} already exists")
                else:
                    if cur is None:
                        raise Conflict(f"{op.row_key} does not exist")
                    if op.etag is None:
                        raise ValueError("replace/delete need the ETag they were decided on")
                    if op.etag != "*" and op.etag != cur[1]:
                        raise Conflict(f"{op.row_key} was modified")
            for op in ops:
                key = ("state", order_id, op.row_key)
                if op.kind == "delete":
                    del self._rows[key]
                else:
                    props = clean(op.row)
                    props["RowKey"] = op.row_key
                    self._rows[key] = (props, self._etag())
            self.writes += 1

    # deadline index ---------------------------------------------------------------------------
    def put_index(self, bucket: str, row_key: str, props: dict[str, Any]) -> None:
        with self._lock:
            self._rows[("deadline", bucket, row_key)] = ({**clean(props), "RowKey": row_key}, self._etag())
            self.writes += 1

    def delete_index(self, bucket: str, row_key: str) -> None:
        with self._lock:
            self._rows.pop(("deadline", bucket, row_key), None)
            self.writes += 1

    def due_index(self, bucket: str, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            self.reads.append(("deadline", bucket))
            rows = sorted(((pk, rk), props) for (t, pk, rk), (props, _e) in self._rows.items()
                          if t == "deadline" and pk <= bucket)
            return [{**props, "PartitionKey": pk, "RowKey": rk} for (pk, rk), props in rows[:limit]]

    def index_rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**props, "PartitionKey": pk} for (t, pk, _rk), (props, _e) in sorted(self._rows.items())
                    if t == "deadline"]

    def snapshot(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        with self._lock:
            return {k: dict(v[0]) for k, v in self._rows.items()}


# ---------------------------------------------------------------------------------------------
class _IndexWriter:
    """Fewer requests for the deadline index, same guarantees (one per ``TableStore``).

    * ``put``: a group commit. The rows of one bucket (one partition) that threads of this
      worker put at the same time go out as ONE entity-group transaction of upserts; each
      caller returns only once the transaction holding its row is committed, so "the index
      row is written BEFORE the state write it guards" still holds. A lone put is sent at once
      (no added latency); while one transaction of a bucket is in flight, the next callers
      queue up and the first of them sends them all when it returns.
    * ``delete`` (best effort; the sweep deletes lazily anyway): queued and sent every
      ``delete_interval`` seconds, as transactions of up to 100 deletes per bucket. A delete
      that finds nothing (the sweep was first) fails its transaction: those rows are then
      deleted one by one (404 ignored). A crash loses at most the queued deletes: the sweep
      finds those rows, point-reads their state and deletes them. ``due_index`` flushes the
      queue first, so this worker's own reads never see a row it already deleted.
    """

    def __init__(self, table: Any, delete_interval: float = 0.25) -> None:
        self.table = table
        self.delete_interval = delete_interval
        self._lock = threading.Lock()
        self._puts: dict[str, list[tuple[dict[str, Any], _Waiter]]] = {}
        self._busy: set[str] = set()
        self._deletes: dict[str, set[str]] = {}
        self._flusher: threading.Thread | None = None
        self._wake = threading.Event()

    # group-committed puts --------------------------------------------------------------------
    def put(self, entity: dict[str, Any]) -> None:
        bucket = str(entity["PartitionKey"])
        me = _Waiter()
        with self._lock:
            self._puts.setdefault(bucket, []).append((entity, me))
            lead = bucket not in self._busy
            if lead:
                self._busy.add(bucket)
        if not lead:
            me.done.wait()  # committed by another caller's transaction, or promoted to send
            if not me.lead:
                if me.error is not None:
                    raise me.error
                return
        try:
            while not me.sent:  # send batches (ours among them), then hand over
                with self._lock:
                    queued = self._puts.get(bucket, [])
                    batch: list[tuple[dict[str, Any], _Waiter]] = []
                    keys: set[str] = set()
                    rest = []
                    for item in queued:
                        rk = str(item[0]["RowKey"])
                        if rk in keys or len(batch) >= MAX_BATCH_OPS:
                            rest.append(item)
                        else:
                            keys.add(rk)
                            batch.append(item)
                    self._puts[bucket] = rest
                self._send_puts(batch)
        finally:
            with self._lock:
                rest = self._puts.get(bucket, [])
                if rest:
                    rest[0][1].lead = True  # the next caller sends what queued up meanwhile
                    rest[0][1].done.set()
                else:
                    self._puts.pop(bucket, None)
                    self._busy.discard(bucket)
        if me.error is not None:
            raise me.error

    def _send_puts(self, batch: list[tuple[dict[str, Any], _Waiter]]) -> None:
        from azure.data.tables import UpdateMode

        error: BaseException | None = None
        try:
            if len(batch) == 1:
                self.table.upsert_entity(batch[0][0], mode=UpdateMode.REPLACE)
            else:
                self.table.submit_transaction([("upsert", e, {"mode": UpdateMode.REPLACE}) for e, _w in batch])
        except Exception as exc:  # every caller of this batch sees the failure (and is retried)
            error = exc
        for _e, w in batch:
            w.error = error
            w.sent = True
            w.done.set()

    # deferred, batched deletes ----------------------------------------------------------------
    def delete(self, bucket: str, row_key: str) -> None:
        with self._lock:
            self._deletes.setdefault(bucket, set()).add(row_key)
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._run, name="index-deletes", daemon=True)
                self._flusher.start()
                import atexit

                atexit.register(self.flush)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delete_interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - best effort: the sweep deletes lazily
                pass

    def flush(self) -> None:
        with self._lock:
            pending, self._deletes = self._deletes, {}
        for bucket, keys in pending.items():
            rows = sorted(keys)
            for i in range(0, len(rows), MAX_BATCH_OPS):
                chunk = rows[i:i + MAX_BATCH_OPS]
                try:
                    if len(chunk) == 1:
                        self.table.delete_entity(partition_key=bucket, row_key=chunk[0])  # 404 is ignored
                    else:
                        self.table.submit_transaction(
                            [("delete", {"PartitionKey": bucket, "RowKey": rk}) for rk in chunk])
                except Exception:  # noqa: BLE001 - e.g. one row already deleted by the sweep
                    for rk in chunk:
                        try:
                            self.table.delete_entity(partition_key=bucket, row_key=rk)
                        except Exception:  # noqa: BLE001,S110 - best effort
                            pass


class _Waiter:
    __slots__ = ("done", "error", "lead", "sent")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.lead = False  # promoted to send the queued batch
        self.sent = False  # its row's transaction was sent (error says how it went)


@dataclass
class TableStore:
    """Azure Table Storage (azure-data-tables ``TableClient`` for each table).

    ``batch_index``: the deadline index is written through :class:`_IndexWriter` (group-committed
    puts, deferred batched deletes); off, every put and delete is its own request."""

    state: Any  # azure.data.tables.TableClient
    deadlines: Any  # azure.data.tables.TableClient
    _select: tuple[str, ...] = field(default=("PartitionKey", "RowKey", "OrderId", "Due"))
    batch_index: bool = True
    raw_batch: bool = True  # entity-group transactions built here (see _raw_transact)
    _index: _IndexWriter | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.batch_index:
            self._index = _IndexWriter(self.deadlines)

    @staticmethod
    def _row(entity: Any) -> dict[str, Any]:
        row = dict(entity)
        row[ETAG] = entity.metadata.get("etag")
        return row

    def read_partition(self, order_id: str) -> dict[str, dict[str, Any]]:
        # parameterised filter: the SDK quotes the value; never string-concatenate input
        entities = self.state.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
        return {e["RowKey"]: self._row(e) for e in entities}

    def read_row(self, order_id: str, row_key: str) -> dict[str, Any] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self._row(self.state.get_entity(partition_key=order_id, row_key=row_key))
        except ResourceNotFoundError:
            return None

    def transact(self, order_id: str, ops: Sequence[Op]) -> None:
        from azure.core import MatchConditions
        from azure.core.exceptions import (
            ResourceExistsError,
            ResourceModifiedError,
            ResourceNotFoundError,
        )
        from azure.data.tables import RequestTooLargeError, TableTransactionError, UpdateMode

        if not ops:
            return
        if len(ops) > MAX_BATCH_OPS:
            raise TooLarge(f"{len(ops)} operations in one transaction")
        for op in ops:
            if op.kind != "delete":
                _check_entity(op.row)
        if self.raw_batch and hasattr(self.state, "_client") and hasattr(self.state._client, "send_request"):
            self._raw_transact(order_id, ops)
            return
        batch: list[Any] = []
        for op in ops:
            entity = {**clean(op.row), "PartitionKey": order_id, "RowKey": op.row_key}
            if op.kind == "create":
                batch.append(("create", entity))
            elif op.kind == "replace":
                batch.append(("update", entity, {"mode": UpdateMode.REPLACE, "etag": op.etag,
                                                 "match_condition": MatchConditions.IfNotModified}))
            else:
                batch.append(("delete", entity, {"etag": op.etag, "match_condition": MatchConditions.IfNotModified}))
        try:
            self.state.submit_transaction(batch)
        except RequestTooLargeError as exc:
            raise TooLarge(str(exc)) from exc
        except TableTransactionError as exc:
            if exc.status_code in (404, 409, 412):
                raise Conflict(f"{exc.status_code} {getattr(exc, 'error_code', '')}") from exc
            if exc.status_code == 413:
                raise TooLarge(str(exc)) from exc
            raise
        except (ResourceModifiedError, ResourceExistsError, ResourceNotFoundError) as exc:
            raise Conflict(str(exc)) from exc

    def _raw_transact(self, order_id: str, ops: Sequence[Op]) -> None:
        """The same entity-group transaction as ``submit_transaction``, built here.

        The SDK's ``submit_transaction`` parses its own multipart request and response with the
        email package and runs per-part policies on new threads; profiled, that was most of a
        transaction's client CPU. This builds the identical ``$batch`` body (one changeset, one
        ``application/http`` part per operation, ``If-Match`` = the ETag the decision was made
        on) and sends it through the table client's own pipeline (authentication, retries).
        The outcome is read from the parts' status lines: 409/412/404 is a lost race."""
        import json
        from urllib.parse import quote

        from azure.core.exceptions import HttpResponseError
        from azure.core.rest import HttpRequest
        from azure.data.tables._serialize import _add_entity_properties

        table_url = f"{self.state.url.rstrip('/')}/{self.state.table_name}"
        changeset, batch = f"changeset_{uuid.uuid4()}", f"batch_{uuid.uuid4()}"
        out = [f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"]
        pk = quote(order_id.replace("'", "''"), safe="")

        def entity_json(op: Op) -> str:
            return json.dumps(_add_entity_properties({**clean(op.row), "PartitionKey": order_id,
                                                      "RowKey": op.row_key}))

        for i, op in enumerate(ops):
            head = (f"--{changeset}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
                    f"Content-ID: {i}\r\n\r\n")
            common = "DataServiceVersion: 3.0\r\nAccept: application/json;odata=minimalmetadata\r\n"
            if op.kind == "create":
                body = entity_json(op)
                out.append(f"{head}POST {table_url} HTTP/1.1\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body.encode())}\r\nPrefer: return-no-content\r\n{common}\r\n"
                           f"{body}\r\n")
                continue
            rk = quote(op.row_key.replace("'", "''"), safe="")
            url = f"{table_url}(PartitionKey='{pk}',RowKey='{rk}')"
            if op.etag is None:
                raise ValueError("replace/delete need the ETag they were decided on")
            if op.kind == "replace":
                body = entity_json(op)
                out.append(f"{head}PUT {url} HTTP/1.1\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body.encode())}\r\nIf-Match: {op.etag}\r\n{common}\r\n"
                           f"{body}\r\n")
            else:
                out.append(f"{head}DELETE {url} HTTP/1.1\r\nIf-Match: {op.etag}\r\n{common}\r\n")
        out.append(f"--{changeset}--\r\n\r\n--{batch}--\r\n")
        request = HttpRequest("POST", f"{self.state.url.rstrip('/')}/$batch", content="".join(out).encode(),
                              headers={"x-ms-version": self.state.api_version, "DataServiceVersion": "3.0",
                                       "MaxDataServiceVersion": "3.0;NetFx", "Accept": "application/json",
                                       "Content-Type": f"multipart/mixed; boundary={batch}"})
        response = self.state._client.send_request(request, stream=True)  # no JSON decoding of a multipart
        content = response.read()
        status = response.status_code
        if status == 202:
            failed = [int(m) for m in _PART_STATUS.findall(content) if int(m) >= 300]
            if not failed:
                return
            status = failed[0]
        if status in (404, 409, 412):
            raise Conflict(f"{status} in transaction on {order_id}")
        if status == 413:
            raise TooLarge(f"transaction on {order_id}: 413")
        raise HttpResponseError(message=f"transaction on {order_id}: HTTP {status}", response=response)

    def put_index(self, bucket: str, row_key: str, props: dict[str, Any]) -> None:
        from azure.data.tables import UpdateMode

        entity = {**clean(props), "PartitionKey": bucket, "RowKey": row_key}
        if self._index is not None:
            self._index.put(entity)  # returns once committed (group commit)
            return
        self.deadlines.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def delete_index(self, bucket: str, row_key: str) -> None:
        if self._index is not None:
            self._index.delete(bucket, row_key)  # best effort, batched within a quarter second
            return
        # delete_entity is idempotent in azure-data-tables (404 is swallowed)
        self.deadlines.delete_entity(partition_key=bucket, row_key=row_key)

    def flush_index(self) -> None:
        if self._index is not None:
            self._index.flush()

    def due_index(self, bucket: str, limit: int) -> list[dict[str, Any]]:
        self.flush_index()  # this worker's queued deletes first
        rows: list[dict[str, Any]] = []
        pages: Iterable[Any] = self.deadlines.query_entities(
            "PartitionKey le @bucket", parameters={"bucket": bucket}, select=list(self._select),
            results_per_page=min(limit, 1000))
        for e in pages:
            rows.append(dict(e))
            if len(rows) >= limit:
                break
        return rows
