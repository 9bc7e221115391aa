"""shared.storage.tables without Azure: which path a client gets, the REST path's requests (Shared Key
Lite, ``$batch``, queries) and how it reads their answers. Both paths' behaviour on real Table
Storage is the store contract (tests/integration/test_store_azurite.py runs it on each)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core.credentials import AzureSasCredential
from azure.core.exceptions import HttpResponseError, ServiceRequestError
from azure.core.pipeline.transport import HttpTransport
from azure.data.tables import TableClient

from shared.core.rows import ETAG
from shared.storage.odata import from_json, odata_literal, to_json
from shared.storage.store import Conflict, TooLarge
from shared.storage.tables import (
    Page,
    RestTable,
    SdkTable,
    Write,
    etags_of,
    table_for,
)

KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
           "TableEndpoint=http://127.0.0.1:1/devstoreaccount1;")


class Capture(HttpTransport):  # type: ignore[type-arg]
    """A transport that records each request and answers it with the next response given."""

    def __init__(self, *responses: Any) -> None:
        self.sent: list[Any] = []
        self.responses = list(responses)

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.sent.append(request)
        if not self.responses:
            raise ServiceRequestError("no answer left")
        return self.responses.pop(0)

    def open(self) -> None: ...
    def close(self) -> None: ...
    def __exit__(self, *args: Any) -> None: ...


class Response:
    """The rest response protocol, as far as ``RestTable`` reads it."""

    def __init__(self, status: int, body: bytes | dict[str, Any] = b"", headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        self.content = json.dumps(body).encode() if isinstance(body, dict) else body
        self.headers = headers or {}
        self.reason, self.content_type = "", ""

    def json(self) -> Any:
        return json.loads(self.content)

    def read(self) -> bytes:
        return self.content

    def text(self, encoding: str | None = None) -> str:
        return self.content.decode()


def rest(*responses: Response) -> tuple[RestTable, list[Any]]:
    """A RestTable whose requests go nowhere: each gets the next of ``responses``."""
    sent: list[Any] = []
    queue = list(responses)

    def send(request: Any) -> Response:
        sent.append(request)
        return queue.pop(0)

    return RestTable("http://127.0.0.1:1/devstoreaccount1", "orders", send), sent


# ---- which path ---------------------------------------------------------------------------------
def test_an_account_key_or_a_sas_credential_gets_the_rest_path() -> None:
    assert isinstance(table_for(TableClient.from_connection_string(AZURITE, "orders")), RestTable)
    sas = TableClient(endpoint="https://acct.table.core.windows.net", table_name="orders",
                      credential=AzureSasCredential("sv=2019-02-02&sig=x"))
    assert isinstance(table_for(sas), RestTable)
    assert isinstance(table_for(TableClient.from_connection_string(AZURITE, "orders"), rest=False), SdkTable)


def test_a_sas_in_the_url_is_left_to_the_sdk() -> None:
    client = TableClient(endpoint="https://acct.table.core.windows.net/?sv=2019-02-02&sig=x", table_name="orders")
    assert isinstance(table_for(client), SdkTable)


def test_a_request_is_signed_with_shared_key_lite_as_documented() -> None:
    transport = Capture(Response(404))
    table = table_for(TableClient.from_connection_string(AZURITE, "orders"), transport)
    assert table.get("p", "r") is None
    [request] = transport.sent
    date = request.headers["x-ms-date"]
    resource = "/devstoreaccount1/devstoreaccount1/orders(PartitionKey='p',RowKey='r')"
    expected = base64.b64encode(hmac.new(base64.b64decode(KEY), f"{date}\n{resource}".encode(),
                                         hashlib.sha256).digest()).decode()
    assert request.headers["Authorization"] == f"SharedKeyLite devstoreaccount1:{expected}"
    assert request.headers["x-ms-version"] and request.headers["Accept"] == "application/json;odata=minimalmetadata"


def test_a_token_credential_signs_with_a_bearer_token_for_storage() -> None:
    from azure.core.credentials import AccessToken

    class Token:
        scopes: tuple[str, ...] = ()

        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            Token.scopes = scopes
            return AccessToken("t0k3n", 2 ** 40)

    transport = Capture(Response(200, {"odata.etag": 'W/"1"', "PartitionKey": "p", "RowKey": "r"}))
    table = table_for(TableClient(endpoint="https://acct.table.core.windows.net", table_name="orders",
                                  credential=Token()), transport)
    assert table.get("p", "r") == {"PartitionKey": "p", "RowKey": "r", ETAG: 'W/"1"'}
    assert transport.sent[0].headers["Authorization"] == "Bearer t0k3n"
    assert Token.scopes == ("https://storage.azure.com/.default",)


# ---- entities ------------------------------------------------------------------------------------
def test_entities_round_trip_with_their_types() -> None:
    at = datetime(2026, 11, 28, 8, 0, tzinfo=UTC)
    entity = {"S": "x", "B": True, "I": 7, "L": 2 ** 40, "F": 1.5, "D": at, "Y": b"\x00\x01", "N": None}
    wire = to_json(entity)
    assert wire["L"] == str(2 ** 40) and wire["L@odata.type"] == "Edm.Int64" and "N" not in wire
    assert wire["I"] == 7 and "I@odata.type" not in wire
    back = from_json({**json.loads(json.dumps(wire)), "odata.etag": 'W/"e"', "Timestamp": "2026-11-28T08:00:00Z",
                      "Timestamp@odata.type": "Edm.DateTime", "odata.metadata": "x"})
    assert back == {"S": "x", "B": True, "I": 7, "L": 2 ** 40, "F": 1.5, "D": at, "Y": b"\x00\x01", ETAG: 'W/"e"'}
    with pytest.raises(TypeError, match="property X"):
        to_json({"X": object()})


def test_filter_parameters_are_quoted_literals() -> None:
    assert odata_literal("o'brien") == "'o''brien'"
    table, sent = rest(Response(200, {"value": []}))
    assert table.query("PartitionKey eq @pk and RowKey ge @rk", {"pk": "a' or 1 eq 1", "rk": "x"}, limit=5) == \
        Page([], False)
    assert sent[0].url.startswith("http://127.0.0.1:1/devstoreaccount1/orders()?")
    assert "a%27%27%20or%201%20eq%201%27" in sent[0].url and "%24top=5" in sent[0].url  # no more rows than asked
    table, sent = rest(Response(200, {"value": []}))
    table.query("PartitionKey eq @pk", {"pk": "a&b=c#d+e%f"}, limit=1)  # nothing in a value can end it early
    assert sent[0].url.endswith("%24filter=PartitionKey%20eq%20%27a%26b%3Dc%23d%2Be%25f%27&%24top=1")


def test_a_query_follows_continuations_until_it_has_enough() -> None:
    rows = [{"PartitionKey": "p", "RowKey": f"r{i}", "odata.etag": f'W/"{i}"'} for i in range(5)]
    more = {"x-ms-continuation-NextPartitionKey": "p", "x-ms-continuation-NextRowKey": "r3"}
    table, sent = rest(Response(200, {"value": rows[:3]}, more), Response(200, {"value": rows[3:]}, more))
    page = table.query("PartitionKey eq @pk", {"pk": "p"}, limit=4, select=["RowKey"])
    assert [r["RowKey"] for r in page.rows] == ["r0", "r1", "r2", "r3"] and page.more
    assert "NextRowKey=r3" in sent[1].url and "%24select=RowKey" in sent[1].url and "%24top=1" in sent[1].url
    table, _sent = rest(Response(200, {"value": rows[:2]}))  # no continuation: that was all
    assert table.query("PartitionKey eq @pk", {"pk": "p"}, limit=4) == Page([from_json(r) for r in rows[:2]], False)


def test_point_reads_writes_and_deletes() -> None:
    table, sent = rest(Response(200, {"PartitionKey": "p'k", "RowKey": "r", "A": 1, "odata.etag": 'W/"1"'}),
                       Response(204), Response(404), Response(500))
    assert table.get("p'k", "r") == {"PartitionKey": "p'k", "RowKey": "r", "A": 1, ETAG: 'W/"1"'}
    assert sent[0].url.endswith("orders(PartitionKey='p%27%27k',RowKey='r')")
    table.upsert({"PartitionKey": "p", "RowKey": "r", "A": 2})
    assert sent[1].method == "PUT" and "If-Match" not in sent[1].headers  # insert or replace
    assert json.loads(sent[1].content) == {"PartitionKey": "p", "RowKey": "r", "A": 2}
    table.delete("p", "gone")  # a 404 is fine
    assert sent[2].method == "DELETE" and sent[2].headers["If-Match"] == "*"
    with pytest.raises(HttpResponseError):
        table.delete("p", "r")


# ---- $batch --------------------------------------------------------------------------------------
def part(status: str) -> bytes:
    return f"--changesetresponse_x\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 {status}\r\n\r\n".encode()


def test_a_transaction_is_one_changeset_with_the_etags() -> None:
    table, sent = rest(Response(202, part("201 Created") + part("204 No Content") * 3))
    table.transact("p'k", [Write("create", "order", {"A": 1}), Write("replace", "state", {"B": "x"}, 'W/"1"'),
                           Write("upsert", "u", {"C": 2}), Write("delete", "d")])
    body = sent[0].content.decode()
    assert sent[0].url == "http://127.0.0.1:1/devstoreaccount1/$batch"
    assert sent[0].headers["Content-Type"].startswith("multipart/mixed; boundary=batch_")
    assert body.count("Content-Type: application/http") == 4
    assert "POST http://127.0.0.1:1/devstoreaccount1/orders HTTP/1.1" in body
    assert "PUT http://127.0.0.1:1/devstoreaccount1/orders(PartitionKey='p%27%27k',RowKey='state') HTTP/1.1" in body
    assert 'If-Match: W/"1"' in body and "If-Match: *" in body  # the delete without an ETag: whatever is there
    assert body.count("If-Match") == 2  # the upsert is unconditional: no If-Match at all
    assert '{"A": 1, "PartitionKey": "p\'k", "RowKey": "order"}' in body


@pytest.mark.parametrize(("response", "error"), [
    (Response(202, part("412 Precondition Failed")), Conflict),
    (Response(202, part("404 Not Found")), Conflict),
    (Response(202, part("409 Conflict")), Conflict),
    (Response(202, part("413 Request Entity Too Large")), TooLarge),
    (Response(413), TooLarge),
    (Response(500, b"busy"), HttpResponseError),
    (Response(202, part("400 Bad Request")), HttpResponseError),
])
def test_transaction_outcomes(response: Response, error: type[Exception]) -> None:
    table, _sent = rest(response)
    with pytest.raises(error) as raised:
        table.transact("pk", [Write("create", "a")])
    if response.status_code == 202 and error is HttpResponseError:  # the failed part's status is named
        assert "a part answered 400" in str(raised.value)


def etag_part(status: str, etag: str | None, content_id: int | None = None, *, cid_in_mime: bool = False) -> bytes:
    """One part of a ``$batch`` response; its Content-ID where the service writes it (among the
    part's HTTP headers) unless ``cid_in_mime``."""
    cid = f"Content-ID: {content_id}\r\n" if content_id is not None else ""
    tag = f"ETag: {etag}\r\n" if etag else ""
    mime, http = (cid, "") if cid_in_mime else ("", cid)
    return (f"--changesetresponse_x\r\nContent-Type: application/http\r\n{mime}\r\n"
            f"HTTP/1.1 {status}\r\n{http}Cache-Control: no-cache\r\n{tag}DataServiceVersion: 3.0;\r\n\r\n\r\n").encode()


WRITES = [Write("create", "order", {"A": 1}), Write("replace", "state", {"B": "x"}, 'W/"1"'), Write("delete", "d")]


def test_each_written_rows_etag_in_request_order() -> None:
    body = (etag_part("204 No Content", 'W/"datetime\'2026-01-01T00%3A00%3A00.1Z\'"')
            + etag_part("204 No Content", 'W/"datetime\'2026-01-01T00%3A00%3A00.2Z\'"')
            + etag_part("204 No Content", None) + b"--changesetresponse_x--\r\n")
    table, _sent = rest(Response(202, body))
    assert table.transact("pk", WRITES) == {"order": 'W/"datetime\'2026-01-01T00%3A00%3A00.1Z\'"',
                                            "state": 'W/"datetime\'2026-01-01T00%3A00%3A00.2Z\'"'}


@pytest.mark.parametrize("cid_in_mime", [False, True])
def test_parts_are_placed_by_their_content_id(cid_in_mime: bool) -> None:
    body = (etag_part("204 No Content", 'W/"s"', 1, cid_in_mime=cid_in_mime)
            + etag_part("204 No Content", 'W/"o"', 0, cid_in_mime=cid_in_mime)
            + etag_part("204 No Content", None, 2, cid_in_mime=cid_in_mime))
    assert etags_of(body, WRITES) == {"order": 'W/"o"', "state": 'W/"s"'}


@pytest.mark.parametrize("case", ["missing", "count"])
def test_what_cannot_be_matched_is_left_out(case: str) -> None:
    if case == "missing":  # a part without an ETag header: no ETag for that row, the others kept
        body = etag_part("204 No Content", None) + etag_part("204 No Content", 'W/"s"') + etag_part("204", None)
        expected = {"state": 'W/"s"'}
    else:  # fewer parts than writes: nothing can be matched, no ETag at all
        body = etag_part("204 No Content", 'W/"o"') + etag_part("204 No Content", 'W/"s"')
        expected = {}
    assert etags_of(body, WRITES) == expected


def test_the_sdk_path_returns_the_etags_submit_transaction_gave() -> None:
    class Client:
        table_name = "orders"

        def submit_transaction(self, operations: list[Any]) -> list[dict[str, str]]:
            assert len(operations) == 3
            return [{"etag": 'W/"o"'}, {"etag": 'W/"s"'}, {}]

    assert SdkTable(Client()).transact("pk", WRITES) == {"order": 'W/"o"', "state": 'W/"s"'}


def test_each_transaction_names_its_own_client_request_id() -> None:
    transport = Capture()
    table = table_for(TableClient.from_connection_string(AZURITE, "orders"), transport)
    for _ in range(2):
        with pytest.raises(ServiceRequestError):
            table.transact("p", [Write("upsert", "r", {"a": 1})])
    ids = {r.headers["x-ms-client-request-id"] for r in transport.sent}
    assert len(ids) == 2 and all(ids)
