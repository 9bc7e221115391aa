"""local.azurite: Azurite from node_modules on loopback, in memory and persistent."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableServiceClient, TableTransactionError

from local.azurite import start_azurite

pytestmark = pytest.mark.integration


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_in_memory_table_crud_and_transaction() -> None:
    az = start_azurite(in_memory=True)
    try:
        assert set(az.ports) == {"blob", "queue", "table"}
        assert "--inMemoryPersistence" in az.proc.args and "--disableTelemetry" in az.proc.args
        proc, conn = az  # unpacks as (Proc, connection string)
        assert proc is az.proc and f"TableEndpoint=http://127.0.0.1:{az.table_port}/" in conn
        assert f"BlobEndpoint=http://127.0.0.1:{az.blob_port}/" in conn
        for port in az.ports.values():
            assert _listening(port)

        service = TableServiceClient.from_connection_string(conn)
        table = service.create_table("orders")
        table.create_entity({"PartitionKey": "o-1", "RowKey": "order", "state": "Pending", "total": "19.98"})
        table.submit_transaction([
            ("update", {"PartitionKey": "o-1", "RowKey": "order", "state": "Processing"}, {"mode": "merge"}),
            ("create", {"PartitionKey": "o-1", "RowKey": "step-0", "state": "Sent"}),
        ])
        rows = {e["RowKey"]: e for e in table.query_entities("PartitionKey eq 'o-1'")}
        assert rows["order"]["state"] == "Processing" and rows["order"]["total"] == "19.98"
        assert rows["step-0"]["state"] == "Sent"

        # A failing transaction changes nothing (it is atomic).
        with pytest.raises(TableTransactionError):
            table.submit_transaction([
                ("update", {"PartitionKey": "o-1", "RowKey": "order", "state": "Processed"}, {"mode": "merge"}),
                ("create", {"PartitionKey": "o-1", "RowKey": "step-0", "state": "duplicate"}),
            ])
        assert table.get_entity("o-1", "order")["state"] == "Processing"
        table_port = az.table_port
    finally:
        az.stop()
    assert not az.proc.alive()
    assert not _listening(table_port)


def test_persistent_location_survives_restart(tmp_path: Path) -> None:
    location = tmp_path / "azurite"
    az = start_azurite(location=location, services=("table",))
    try:
        assert az.services == ("table",) and "azurite-table" in az.proc.args[0]
        assert "--location" in az.proc.args
        service = TableServiceClient.from_connection_string(az.connection_string)
        service.create_table("deadlines").create_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})
        port = az.table_port
        az.restart()  # same port, same folder
        assert az.table_port == port and az.proc.alive()
        entity = TableServiceClient.from_connection_string(az.connection_string).get_table_client(
            "deadlines").get_entity("p", "r")
        assert entity["v"] == 1
    finally:
        az.stop()
    assert any(location.iterdir())


def test_in_memory_loses_data_on_restart() -> None:
    az = start_azurite(in_memory=True, services=("table",))
    try:
        TableServiceClient.from_connection_string(az.connection_string).create_table("gone")
        az.restart()
        with pytest.raises(ResourceNotFoundError):
            TableServiceClient.from_connection_string(az.connection_string).get_table_client(
                "gone").get_entity("p", "r")
    finally:
        az.stop()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        start_azurite(in_memory=True, location=Path("/tmp/x"))
    with pytest.raises(ValueError):
        start_azurite(services=("blob",))
