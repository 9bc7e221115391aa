"""Connection strings for the local stack, in the exact forms the official tools use.

The app reads these as ordinary settings; nothing in the app knows they point at local
processes, so `func start` with the official Service Bus emulator and Azurite swaps in
through settings alone.
"""

from __future__ import annotations

# Azurite's well-known development account (public, documented, not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def servicebus_connection_string(host: str, port: int) -> str:
    """The official Service Bus emulator's connection string form (TLS off, port kept)."""
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )


def azurite_connection_string(host: str, table_port: int, blob_port: int | None = None) -> str:
    parts = [
        "DefaultEndpointsProtocol=http",
        f"AccountName={AZURITE_ACCOUNT}",
        f"AccountKey={AZURITE_KEY}",
        f"TableEndpoint=http://{host}:{table_port}/{AZURITE_ACCOUNT}",
    ]
    if blob_port is not None:
        parts.append(f"BlobEndpoint=http://{host}:{blob_port}/{AZURITE_ACCOUNT}")
    return ";".join(parts) + ";"
