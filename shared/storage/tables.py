"""One table of Table Storage, as the store uses it: two ways to reach it, one interface.

``Table`` is every request the store makes: a point read, a query (paged, at most ``limit``
rows), an entity-group transaction on one partition, an upsert and a delete. Entities are dicts
of their properties with ``PartitionKey``, ``RowKey`` and their ETag under ``shared.core.rows.ETAG``.

* :class:`RestTable` sends the Table service's documented REST requests (Query Entities,
  Insert Or Replace Entity, Delete Entity, and ``$batch``: one changeset, an ``application/http``
  part per write, ``If-Match`` the ETag a decision was made on) through azure-core's public
  ``PipelineClient`` with public policies, on :class:`shared.storage.transport.Urllib3Transport`
  (azure-core's transport interface on urllib3), signed with the documented Shared Key Lite scheme for
  an account key, or a bearer token for an Entra ID credential. The wire format (entities as
  JSON, the ``$batch`` response's ETags) is :mod:`shared.storage.odata`.
* :class:`SdkTable` is the same through azure-data-tables' public ``TableClient`` methods
  (``submit_transaction``...): the fallback, for a credential :func:`table_for` cannot sign (a SAS
  in the URL), and the reference both are tested against (``tests/unit/store_contract.py`` on
  Azurite, once per path).

Why two: the SDK's ``submit_transaction`` builds and parses multipart bodies with the ``email``
package and starts threads per batch: on Azurite it costs several times the client CPU per
transaction of the REST path (measured: docs/reliability.md, "Table requests").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, Literal, Protocol
from urllib.parse import quote, urlencode, urlsplit

import requests
from azure.core import MatchConditions, PipelineClient
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.core.pipeline.policies import (
    AzureSasCredentialPolicy,
    BearerTokenCredentialPolicy,
    DistributedTracingPolicy,
    HeadersPolicy,
    RetryPolicy,
    SansIOHTTPPolicy,
    UserAgentPolicy,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.core.rest import HttpRequest
from azure.data.tables import RequestTooLargeError, TableTransactionError, UpdateMode

from shared.core.jsonio import present
from shared.core.rows import ETAG, Entity
from shared.storage.odata import (
    ACCEPT,
    PART_HEADERS,
    batch_etags,
    bind,
    failed_statuses,
    from_json,
    key_path,
    to_json,
)
from shared.storage.store import Conflict, TooLarge
from shared.storage.transport import Urllib3Transport

STORAGE_SCOPE = "https://storage.azure.com/.default"
API_VERSION = "2019-02-02"
MAX_PAGE = 1000  # rows a query returns per request at most (the service's own limit)
POOL_SIZE = 64  # connections per worker: the sync thread pool's threads, with room to spare


@dataclass(frozen=True)
class Write:
    """One write of a transaction. ``etag``: ``If-Match`` of a replace or delete (None = ``*``)."""

    kind: Literal["create", "replace", "upsert", "delete"]
    row_key: str
    props: Mapping[str, Any] = field(default_factory=dict)  # no PartitionKey; None = absent
    etag: str | None = None


@dataclass(frozen=True)
class Page:
    rows: list[Entity]
    more: bool  # the service said there may be rows past ``limit`` (a continuation)


class Table(Protocol):
    name: str

    def get(self, partition_key: str, row_key: str) -> Entity | None: ...

    def query(self, filter: str, parameters: Mapping[str, str], *, limit: int,
              select: Sequence[str] | None = None) -> Page:
        """The first ``limit`` rows that match (``@name`` in ``filter`` is a quoted parameter); at most
        ``limit`` rows are read, and whether there may be more is the service's continuation."""

    def transact(self, partition_key: str, writes: Sequence[Write]) -> dict[str, str]:
        """All of ``writes`` or none (``Conflict`` for a 404/409/412, ``TooLarge`` for a 413): the
        new ETag of each written row (RowKey -> ETag; a row the service gave none for is left out)."""

    def upsert(self, entity: Mapping[str, Any]) -> None: ...

    def delete(self, partition_key: str, row_key: str) -> None:
        """Unconditional; a row already gone is fine."""


def new_etags(writes: Sequence[Write], etags: Sequence[str | None]) -> dict[str, str]:
    """RowKey -> ETag of each written (not deleted) row, ``etags`` in the order of ``writes``;
    nothing at all when the counts differ (the parts cannot be matched to the writes)."""
    if len(etags) != len(writes):
        return {}
    return {w.row_key: e for w, e in zip(writes, etags, strict=True) if w.kind != "delete" and e}


def entity_of(partition_key: str, write: Write) -> Entity:
    return {**present(write.props),
            "PartitionKey": partition_key, "RowKey": write.row_key}


# ---------------------------------------------------------------------------------------------
# The REST path
# Multipart boundaries need only differ from the body's text: a per-process prefix and a counter.
_BOUNDARY_PREFIX = secrets.token_hex(12)
_BOUNDARY_COUNTER = itertools.count()


def etags_of(body: bytes, writes: Sequence[Write]) -> dict[str, str]:
    """The new ETags in a successful ``$batch`` response (RowKey -> ETag)."""
    return new_etags(writes, batch_etags(body, len(writes)))


class SharedKeyLite(SansIOHTTPPolicy):  # type: ignore[type-arg]
    """Signs each request with the Table service's documented Shared Key Lite scheme:
    ``HMAC-SHA256(key, x-ms-date + "\\n" + "/" + account + path)``."""

    def __init__(self, account: str, key: str) -> None:
        super().__init__()
        self.account, self.key = account, base64.b64decode(key)

    def on_request(self, request: Any) -> None:
        http = request.http_request
        date = formatdate(usegmt=True)
        resource = f"/{self.account}{urlsplit(http.url).path}"
        signature = hmac.new(self.key, f"{date}\n{resource}".encode(), hashlib.sha256).digest()
        http.headers["x-ms-date"] = date
        http.headers["Authorization"] = f"SharedKeyLite {self.account}:{base64.b64encode(signature).decode()}"


class RestTable:
    """One table over ``send`` (an azure-core ``PipelineClient.send_request``)."""

    def __init__(self, endpoint: str, name: str, send: Callable[..., Any]) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.name = name
        self.url = f"{self.endpoint}/{name}"
        self.send = send

    def _request(self, method: str, url: str, *, body: bytes | None = None, headers: Mapping[str, str] | None = None,
                 params: Mapping[str, str] | None = None) -> Any:
        if params:  # azure-core would put them in the URL as they are: each is percent-encoded here
            url = f"{url}?{urlencode(params, quote_via=quote)}"
        request = HttpRequest(method, url, content=body,
                              headers={"Accept": ACCEPT, "DataServiceVersion": "3.0", **(headers or {})})
        return self.send(request)

    @staticmethod
    def _failed(response: Any, what: str) -> Exception:
        return HttpResponseError(message=f"{what}: HTTP {response.status_code}", response=response)

    def get(self, partition_key: str, row_key: str) -> Entity | None:
        response = self._request("GET", self.url + key_path(partition_key, row_key))
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._failed(response, f"get {self.name}")
        return from_json(response.json())

    def query(self, filter: str, parameters: Mapping[str, str], *, limit: int,
              select: Sequence[str] | None = None) -> Page:
        params = {"$filter": bind(filter, parameters)}
        if select:
            params["$select"] = ",".join(select)
        rows: list[Entity] = []
        while True:
            params["$top"] = str(min(limit - len(rows), MAX_PAGE))
            response = self._request("GET", self.url + "()", params=params)
            if response.status_code != 200:
                raise self._failed(response, f"query {self.name}")
            rows += (from_json(e) for e in response.json().get("value", ()))
            next_pk = response.headers.get("x-ms-continuation-NextPartitionKey")
            if len(rows) >= limit or not next_pk:
                return Page(rows[:limit], bool(next_pk))
            params["NextPartitionKey"] = next_pk
            next_rk = response.headers.get("x-ms-continuation-NextRowKey")
            if next_rk:
                params["NextRowKey"] = next_rk
            else:
                params.pop("NextRowKey", None)

    def upsert(self, entity: Mapping[str, Any]) -> None:
        body = json.dumps(to_json(entity)).encode()
        response = self._request("PUT", self.url + key_path(str(entity["PartitionKey"]), str(entity["RowKey"])),
                                 body=body, headers={"Content-Type": "application/json"})
        if response.status_code not in (200, 204):
            raise self._failed(response, f"upsert {self.name}")

    def delete(self, partition_key: str, row_key: str) -> None:
        response = self._request("DELETE", self.url + key_path(partition_key, row_key), headers={"If-Match": "*"})
        if response.status_code not in (200, 204, 404):
            raise self._failed(response, f"delete {self.name}")

    def _part(self, index: int, partition_key: str, write: Write) -> str:
        head = (f"Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
                f"Content-ID: {index}\r\n\r\n")
        if write.kind == "create":
            body = json.dumps(to_json(entity_of(partition_key, write)))
            return (f"{head}POST {self.url} HTTP/1.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body.encode())}\r\nPrefer: return-no-content\r\n{PART_HEADERS}\r\n"
                    f"{body}\r\n")
        url = self.url + key_path(partition_key, write.row_key)
        if_match = "" if write.kind == "upsert" else f"If-Match: {write.etag or '*'}\r\n"
        if write.kind == "delete":
            return f"{head}DELETE {url} HTTP/1.1\r\n{if_match}{PART_HEADERS}\r\n"
        body = json.dumps(to_json(entity_of(partition_key, write)))  # replace / upsert: PUT
        return (f"{head}PUT {url} HTTP/1.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body.encode())}\r\n{if_match}{PART_HEADERS}\r\n{body}\r\n")

    def transact(self, partition_key: str, writes: Sequence[Write]) -> dict[str, str]:
        unique = f"{_BOUNDARY_PREFIX}-{next(_BOUNDARY_COUNTER):x}"
        changeset, batch = f"changeset_{unique}", f"batch_{unique}"
        out = [f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"]
        out += [f"--{changeset}\r\n{self._part(i, partition_key, w)}" for i, w in enumerate(writes)]
        out.append(f"--{changeset}--\r\n\r\n--{batch}--\r\n")
        response = self._request("POST", f"{self.endpoint}/$batch", body="".join(out).encode(),
                                 headers={"Content-Type": f"multipart/mixed; boundary={batch}",
                                          "MaxDataServiceVersion": "3.0;NetFx", "x-ms-client-request-id": unique})
        status, what = response.status_code, f"transaction on {partition_key}"
        if status == 202:
            body = response.content
            failed = failed_statuses(body)
            if not failed:
                return etags_of(body, writes)
            status, what = failed[0], f"{what} (a part answered {failed[0]})"
        if status in (404, 409, 412):
            raise Conflict(f"{status} in transaction on {partition_key}")
        if status == 413:
            raise TooLarge(f"transaction on {partition_key}: 413")
        raise self._failed(response, what)


def rest_pipeline(client: Any, transport: Any) -> Any | None:
    """An azure-core ``PipelineClient`` for the account of ``client`` (a ``TableClient`` or
    ``TableServiceClient``), signing as its credential does; None when it has none this module can
    sign with (a SAS in the URL: the SDK path is used)."""

    credential = client.credential
    if isinstance(credential, AzureNamedKeyCredential):
        sign: Any = SharedKeyLite(credential.named_key.name, credential.named_key.key)
    elif isinstance(credential, AzureSasCredential):
        sign = AzureSasCredentialPolicy(credential)
    elif hasattr(credential, "get_token"):
        sign = BearerTokenCredentialPolicy(credential, STORAGE_SCOPE)
    else:
        return None
    policies = [HeadersPolicy({"x-ms-version": API_VERSION}), UserAgentPolicy(sdk_moniker="orders-tables"),
                RetryPolicy(), sign, DistributedTracingPolicy()]
    return PipelineClient(base_url=client.url, policies=policies, transport=transport)


def table_for(client: Any, transport: Any | None = None, *, rest: bool = True) -> Table:
    """``client`` (a ``TableClient``) as a :class:`Table`: the REST path when asked for and its
    credential can be signed (over ``transport``, else a new ``Urllib3Transport``), else the SDK's."""
    pipeline = rest_pipeline(client, transport or Urllib3Transport(POOL_SIZE)) if rest else None
    if pipeline is None:
        return SdkTable(client)
    return RestTable(client.url, client.table_name, pipeline.send_request)


def requests_transport() -> Any:
    """azure-core's ``RequestsTransport`` on one pooled session (``POOL_SIZE`` connections, enough for
    the worker's thread pool) that reads no proxy settings from the environment per call: the SDK
    clients' (table creation, the SDK path)."""
    session = requests.Session()
    session.trust_env = False
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(session=session, session_owner=False, use_env_settings=False)


# ---------------------------------------------------------------------------------------------
# The SDK path
class SdkTable:
    """One table through azure-data-tables' public ``TableClient`` methods."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.name = client.table_name

    @staticmethod
    def _entity(entity: Any) -> Entity:
        row = dict(entity)
        row[ETAG] = entity.metadata.get("etag")
        return row

    def get(self, partition_key: str, row_key: str) -> Entity | None:
        try:
            return self._entity(self.client.get_entity(partition_key=partition_key, row_key=row_key))
        except ResourceNotFoundError:
            return None

    def query(self, filter: str, parameters: Mapping[str, str], *, limit: int,
              select: Sequence[str] | None = None) -> Page:
        pages = self.client.query_entities(filter, parameters=dict(parameters), select=list(select) if select else None,
                                           results_per_page=min(limit, MAX_PAGE)).by_page()
        rows: list[Entity] = []
        for page in pages:
            rows += (self._entity(e) for e in page)
            if len(rows) >= limit:
                break
        return Page(rows[:limit], bool(pages.continuation_token))

    def upsert(self, entity: Mapping[str, Any]) -> None:
        self.client.upsert_entity(dict(entity), mode=UpdateMode.REPLACE)

    def delete(self, partition_key: str, row_key: str) -> None:
        self.client.delete_entity(partition_key=partition_key, row_key=row_key)  # a 404 is ignored

    @staticmethod
    def _operation(partition_key: str, write: Write) -> tuple[Any, ...]:
        entity = entity_of(partition_key, write)
        if write.kind == "create":
            return ("create", entity)
        if write.kind == "upsert":
            return ("upsert", entity, {"mode": UpdateMode.REPLACE})
        condition: dict[str, Any] = ({"match_condition": MatchConditions.Unconditionally} if write.etag in (None, "*")
                                     else {"etag": write.etag, "match_condition": MatchConditions.IfNotModified})
        if write.kind == "replace":
            return ("update", entity, {"mode": UpdateMode.REPLACE, **condition})
        return ("delete", entity, condition)

    def transact(self, partition_key: str, writes: Sequence[Write]) -> dict[str, str]:
        try:
            parts = self.client.submit_transaction([self._operation(partition_key, w) for w in writes])
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
        # one mapping per operation, in order ('etag' when the part had an ETag header)
        return new_etags(writes, [p.get("etag") if isinstance(p, Mapping) else None for p in parts or ()])
