"""With only the identity-based settings Bicep gives the app (no connection string anywhere),
the app's client factory (shared/runtime/clients.py) builds its Table Storage and Service Bus clients
with azure-identity credentials, against the configured endpoints. No Azure call is made:
building a client does not connect.
"""

from __future__ import annotations

import json
import os
import re

import azure.identity
import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential, TokenCredential
from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

import shared.runtime.clients as clients_module
from shared.settings import SETTINGS
from tests.unit.harness import TEST_TOKEN_KEYS

from .conftest import INFRA, bicep_app_settings, bicep_literal

CLIENT_ID = "11111111-2222-3333-4444-555555555555"
NAMESPACE = "sb-orders-example.servicebus.windows.net"
TABLE_URI = "https://storderexample.table.core.windows.net/"

# Values for the Bicep expressions that are not literals (outputs of other modules).
BICEP_EXPRESSIONS = {
    "identityClientId": CLIENT_ID,
    "serviceBusFullyQualifiedNamespace": NAMESPACE,
    "tableEndpoint": TABLE_URI,
    "storageAccountName": "storderexample",
    "appInsightsConnectionString": "InstrumentationKey=00000000-0000-0000-0000-000000000000;"
                                   "IngestionEndpoint=https://example.in.applicationinsights.azure.com/",
}
DEFAULTS = {s.name: s.default for s in SETTINGS}
# What App Service hands the app for a Key Vault reference (TokenKeys): the secret's value.
KEY_VAULT_SECRET = TEST_TOKEN_KEYS
# The example deployment's parameters: the required settings (no default) come from there.
RAW_PARAMETERS = {name: p["value"]
                  for name, p in json.loads((INFRA / "main.parameters.json").read_text())["parameters"].items()}
PARAMETERS = {name: str(value) for name, value in RAW_PARAMETERS.items()}


def azure_environment() -> dict[str, str]:
    """The app settings as Azure sets them from infra/modules/functionapp.bicep."""
    env = {}
    for name, expr in bicep_app_settings().items():
        literal = bicep_literal(expr)
        if literal is not None:
            env[name] = literal
        elif expr in BICEP_EXPRESSIONS:
            env[name] = BICEP_EXPRESSIONS[expr]
        elif "${identityClientId}" in expr:
            env[name] = expr.strip("'").replace("${identityClientId}", CLIENT_ID)
        elif expr in PARAMETERS:
            env[name] = PARAMETERS[expr]
        elif expr.startswith("'@Microsoft.KeyVault("):  # the platform hands the app the secret's value
            env[name] = KEY_VAULT_SECRET
        elif m := re.fullmatch(r"(\w+)\['(\w+)'\]", expr):  # an entry of an object parameter (serviceUrls)
            env[name] = str(RAW_PARAMETERS[m.group(1)][m.group(2)])
        else:
            env[name] = DEFAULTS[name] or ""  # a parameter whose default is the app's default
    return env


@pytest.fixture
def identity_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in list(os.environ):
        if name.startswith(("ServiceBusConnection", "StateStorage", "AzureWebJobsStorage")):
            monkeypatch.delenv(name)
    env = azure_environment()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(clients_module.get_clients, "value", None)  # the worker's clients, built from this env
    yield env
    monkeypatch.setattr(clients_module.get_clients, "value", None)


@pytest.fixture
def managed_identity_kwargs(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Records how the real ManagedIdentityCredential is constructed."""
    calls: list[dict] = []
    real = azure.identity.ManagedIdentityCredential

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs):
            calls.append(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(azure.identity, "ManagedIdentityCredential", Recording)
    monkeypatch.setattr(clients_module, "ManagedIdentityCredential", Recording, raising=False)
    return calls


def assert_identity_credential(credential: object) -> None:
    assert isinstance(credential, TokenCredential), type(credential)
    assert any(c.__module__.startswith("azure.identity.") for c in type(credential).__mro__), type(credential)
    assert not isinstance(credential, AzureNamedKeyCredential | AzureSasCredential)


def test_environment_has_no_connection_string(identity_env: dict[str, str]) -> None:
    for name in ("ServiceBusConnection", "StateStorage", "AzureWebJobsStorage"):
        assert name not in identity_env
    for value in identity_env.values():
        assert "AccountKey=" not in value and "SharedAccessKey" not in value


def test_clients_use_the_managed_identity(identity_env: dict[str, str], managed_identity_kwargs: list[dict]) -> None:
    clients = clients_module.get_clients()
    settings = clients.settings
    assert settings.service_bus is not None and settings.service_bus.uses_identity
    assert settings.state_storage is not None and settings.state_storage.uses_identity

    tables = clients.table_service()
    assert tables.url.rstrip("/") == TABLE_URI.rstrip("/")
    assert tables.account_name == "storderexample"
    assert_identity_credential(tables.credential)
    assert isinstance(tables.credential, ManagedIdentityCredential)

    bus = clients.service_bus()
    assert bus.fully_qualified_namespace == NAMESPACE
    assert_identity_credential(bus._credential)
    assert isinstance(bus._credential, ManagedIdentityCredential)

    # Both credentials select the user-assigned identity Bicep names (ServiceBusConnection__clientId ...).
    assert [kw.get("client_id") for kw in managed_identity_kwargs] == [CLIENT_ID, CLIENT_ID]
    clients.close()


def test_developer_login_uses_default_azure_credential(monkeypatch: pytest.MonkeyPatch,
                                                      identity_env: dict[str, str]) -> None:
    """Local `func start` against a real namespace: only the endpoints, your az login does the rest."""
    for name in list(identity_env):
        if name.endswith(("__credential", "__clientId")):
            monkeypatch.delenv(name)
    clients = clients_module.get_clients()
    bus = clients.service_bus()
    tables = clients.table_service()
    assert isinstance(bus._credential, DefaultAzureCredential)
    assert isinstance(tables.credential, DefaultAzureCredential)
    assert bus.fully_qualified_namespace == NAMESPACE
    clients.close()


def test_a_connection_string_would_not_use_identity(monkeypatch: pytest.MonkeyPatch,
                                                    identity_env: dict[str, str]) -> None:
    """The check above can tell the two forms apart: a connection string yields a key credential."""
    monkeypatch.setenv("ServiceBusConnection",
                       "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=RootManageSharedAccessKey;"
                       "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;")
    bus = clients_module.get_clients().service_bus()
    assert not any(c.__module__.startswith("azure.identity.") for c in type(bus._credential).__mro__)
    bus.close()
