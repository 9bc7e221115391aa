"""shared.table_batch without Azure: which path is chosen at start-up, the fast path's request
and how it reads a response. The paths' behaviour on real Table Storage is the store contract
(tests/integration/test_store_azurite.py runs it on both)."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableClient

from shared.store import Conflict, TooLarge
from shared.table_batch import FastSender, PublicSender, Write, sender_for

AZURITE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
           "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
           "TableEndpoint=http://127.0.0.1:1/devstoreaccount1;")


def table() -> TableClient:
    return TableClient.from_connection_string(AZURITE, "orders")


def test_fast_path_when_the_sdk_has_what_it_needs() -> None:
    assert isinstance(sender_for(table()), FastSender)
    assert isinstance(sender_for(table(), fast=False), PublicSender)


def test_public_path_when_a_private_name_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import azure.data.tables._serialize as serialize

    client = table()
    monkeypatch.delattr(serialize, "_add_entity_properties")
    assert isinstance(sender_for(client), PublicSender)
    monkeypatch.undo()
    monkeypatch.delattr(client, "_client")
    assert isinstance(sender_for(client), PublicSender)


def test_public_path_when_the_url_carries_a_sas() -> None:
    sas = TableClient(endpoint="https://acct.table.core.windows.net/?sv=2019-02-02&sig=x", table_name="orders")
    assert isinstance(sender_for(sas), PublicSender)


class Response:
    def __init__(self, status: int, body: bytes = b"") -> None:
        self.status_code, self.body = status, body
        self.headers: dict[str, str] = {}
        self.reason, self.content_type = "", "multipart/mixed"

    def read(self) -> bytes:
        return self.body

    def text(self) -> str:
        return self.body.decode()


def fast_sender(*responses: Response) -> tuple[FastSender, list[Any]]:
    sent: list[Any] = []
    queue = list(responses)

    def send_request(request: Any, stream: bool = False) -> Response:
        sent.append(request)
        return queue.pop(0)

    client = table()
    return FastSender(client, lambda e: dict(e), send_request), sent


def part(status: str) -> bytes:
    return f"--changesetresponse_x\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 {status}\r\n\r\n".encode()


def test_fast_request_is_one_changeset_with_the_etags() -> None:
    send, sent = fast_sender(Response(202, part("201 Created") + part("204 No Content") * 3))
    send("p'k", [Write("create", "order", {"A": 1}), Write("replace", "state", {"B": "x"}, 'W/"1"'),
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
def test_fast_response_outcomes(response: Response, error: type[Exception]) -> None:
    send, _sent = fast_sender(response)
    with pytest.raises(error):
        send("pk", [Write("create", "a")])


def etag_part(status: str, etag: str | None, content_id: int | None = None) -> bytes:
    cid = f"Content-ID: {content_id}\r\n" if content_id is not None else ""
    tag = f"ETag: {etag}\r\n" if etag else ""
    return (f"--changesetresponse_x\r\nContent-Type: application/http\r\n{cid}\r\n"
            f"HTTP/1.1 {status}\r\nCache-Control: no-cache\r\n{tag}DataServiceVersion: 3.0;\r\n\r\n\r\n").encode()


WRITES = [Write("create", "order", {"A": 1}), Write("replace", "state", {"B": "x"}, 'W/"1"'), Write("delete", "d")]


def test_fast_path_returns_each_written_rows_etag_in_request_order() -> None:
    body = (etag_part("204 No Content", 'W/"datetime\'2026-01-01T00%3A00%3A00.1Z\'"')
            + etag_part("204 No Content", 'W/"datetime\'2026-01-01T00%3A00%3A00.2Z\'"')
            + etag_part("204 No Content", None) + b"--changesetresponse_x--\r\n")
    send, _sent = fast_sender(Response(202, body))
    assert send("pk", WRITES) == {"order": 'W/"datetime\'2026-01-01T00%3A00%3A00.1Z\'"',
                                  "state": 'W/"datetime\'2026-01-01T00%3A00%3A00.2Z\'"'}


def test_fast_path_places_parts_by_their_content_id() -> None:
    body = (etag_part("204 No Content", 'W/"s"', 1) + etag_part("204 No Content", 'W/"o"', 0)
            + etag_part("204 No Content", None, 2))
    send, _sent = fast_sender(Response(202, body))
    assert send("pk", WRITES) == {"order": 'W/"o"', "state": 'W/"s"'}


@pytest.mark.parametrize("case", ["missing", "count"])
def test_fast_path_leaves_out_what_it_cannot_match(case: str) -> None:
    if case == "missing":  # a part without an ETag header: no ETag for that row, the others kept
        body = etag_part("204 No Content", None) + etag_part("204 No Content", 'W/"s"') + etag_part("204", None)
        expected = {"state": 'W/"s"'}
    else:  # fewer parts than writes: nothing can be matched, no ETag at all
        body = etag_part("204 No Content", 'W/"o"') + etag_part("204 No Content", 'W/"s"')
        expected = {}
    send, _sent = fast_sender(Response(202, body))
    assert send("pk", WRITES) == expected


def test_public_path_returns_the_etags_submit_transaction_gave() -> None:
    class Table:
        def submit_transaction(self, operations: list[Any]) -> list[dict[str, str]]:
            assert len(operations) == 3
            return [{"etag": 'W/"o"'}, {"etag": 'W/"s"'}, {}]

    assert PublicSender(Table())("pk", WRITES) == {"order": 'W/"o"', "state": 'W/"s"'}


def test_fast_request_names_its_own_client_request_id_which_the_pipeline_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """azure-core's RequestIdPolicy would make a uuid1 per request; it keeps an id already set."""
    from azure.core.exceptions import ServiceRequestError
    from azure.core.pipeline.transport import HttpTransport

    seen: list[Any] = []

    class Refuse(HttpTransport):  # type: ignore[type-arg]
        def send(self, request: Any, **kwargs: Any) -> Any:
            seen.append(request)
            raise ServiceRequestError("refused")

        def open(self) -> None: ...
        def close(self) -> None: ...
        def __exit__(self, *args: Any) -> None: ...

    def no_uuid1(*_args: Any) -> Any:
        raise AssertionError("uuid1 made a request id")

    monkeypatch.setattr("uuid.uuid1", no_uuid1)
    client = TableClient.from_connection_string(AZURITE, "orders", transport=Refuse(), retry_total=0)
    sender = sender_for(client)
    assert isinstance(sender, FastSender)
    for _ in range(2):
        with pytest.raises(ServiceRequestError):
            sender("p", [Write("upsert", "r", {"a": 1})])
    ids = [r.headers["x-ms-client-request-id"] for r in seen]
    assert len(ids) == 2 and ids[0] != ids[1] and all(ids)
