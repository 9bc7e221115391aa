"""Required settings: the remote services' URLs and the token keys have no default (nothing is
safe in Azure); the app's settings, and so the worker's clients, fail naming any that is missing,
or a token key that is not of its form."""

from __future__ import annotations

import base64

import pytest

from shared.runtime import clients as clients_module
from shared.settings import (
    REQUIRED_SETTINGS,
    SETTINGS,
    TOKEN_KEYS,
    InvalidSettingError,
    MissingSettingError,
    Settings,
    parse_token_keys,
)
from tests.unit.harness import TEST_TOKEN_KEYS

URLS = {s.name: f"https://{s.name.lower()}.example.com" for s in REQUIRED_SETTINGS if s.name != TOKEN_KEYS}
REQUIRED = {**URLS, TOKEN_KEYS: TEST_TOKEN_KEYS}


def test_the_service_urls_and_the_token_keys_are_required() -> None:
    assert {s.name for s in REQUIRED_SETTINGS} == {"InventoryServiceUrl", "PaymentServiceUrl", "ShippingServiceUrl",
                                                   "DeliveryServiceUrl", "TokenKeys"}
    assert all(s.default is None for s in REQUIRED_SETTINGS)


def test_no_setting_defaults_to_a_local_address() -> None:
    for spec in SETTINGS:
        assert not any(h in (spec.default or "") for h in ("127.0.0.1", "localhost", "::1")), spec.name


@pytest.mark.parametrize("name", sorted(REQUIRED))
@pytest.mark.parametrize("value", [None, "", "  "], ids=["unset", "empty", "blank"])
def test_a_missing_url_fails_naming_it(name: str, value: str | None) -> None:
    env = {k: v for k, v in REQUIRED.items() if k != name}
    if value is not None:
        env[name] = value
    with pytest.raises(MissingSettingError, match=rf"\b{name}\b") as missing:
        Settings.from_env(env)
    assert missing.value.names == (name,)
    assert isinstance(missing.value, LookupError)


def test_every_missing_setting_is_named_at_once() -> None:
    with pytest.raises(MissingSettingError) as missing:
        Settings.from_env({})
    assert missing.value.names == ("InventoryServiceUrl", "PaymentServiceUrl", "ShippingServiceUrl",
                                   "DeliveryServiceUrl", "TokenKeys")
    assert str(missing.value).startswith("required app settings not set: InventoryServiceUrl, PaymentServiceUrl, "
                                         "ShippingServiceUrl, DeliveryServiceUrl, TokenKeys")


def test_given_urls_are_read_as_set() -> None:
    settings = Settings.from_env(REQUIRED)
    assert {name: settings[name] for name in REQUIRED} == REQUIRED
    assert settings["SchedulerQueue"] == "scheduler"  # a setting with a safe default keeps it


def test_the_workers_clients_fail_naming_the_missing_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker builds its settings from its environment once, before any function runs."""
    for name in REQUIRED:
        monkeypatch.setenv(name, REQUIRED[name])
    monkeypatch.delenv("PaymentServiceUrl")
    monkeypatch.setattr(clients_module.get_clients, "value", None)
    with pytest.raises(MissingSettingError, match="PaymentServiceUrl"):
        clients_module.get_clients()
    assert clients_module.get_clients.value is None


# --------------------------------------------------------------------------- TokenKeys
def _key(n: int = 32, fill: int = 7, urlsafe: bool = False) -> str:
    raw = bytes([fill]) * (n - 1) + b"\xff"  # '/' in standard base64, '_' in URL-safe
    return (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode()


def test_token_keys_are_the_current_and_optionally_the_previous() -> None:
    one = Settings.from_env({**REQUIRED, TOKEN_KEYS: _key()}).token_keys
    assert one.current == bytes([7]) * 31 + b"\xff" and one.previous is None
    two = Settings.from_env({**REQUIRED, TOKEN_KEYS: f" {_key(fill=1)} , {_key(48, 2, urlsafe=True).rstrip('=')} "})
    assert two.token_keys.current == bytes([1]) * 31 + b"\xff"
    assert two.token_keys.previous == bytes([2]) * 47 + b"\xff"
    assert "\\x" not in repr(two.token_keys) and "current=" not in repr(two.token_keys)  # never shown


@pytest.mark.parametrize(("value", "reason"), [
    ("c2hvcnQ=", "the current key has 5 bytes, fewer than 32"),
    (_key(31), "the current key has 31 bytes, fewer than 32"),
    (f"{_key()},{_key(16)}", "the previous key has 16 bytes, fewer than 32"),
    (f"{_key()},", "the previous key is empty"),
    (f",{_key()}", "the current key is empty"),
    (f"{_key()},{_key()},{_key()}", "3 keys given, at most 2"),
    ("not base64 at all!", "the current key is not base64"),
    ("ab=cd" * 12, "the current key is not base64"),
    ("k1:" + _key(), "the current key is not base64"),
    ("@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/TokenKeys)",
     "the Key Vault reference was not resolved"),
])
def test_a_bad_token_keys_value_stops_the_start_naming_the_setting_not_the_value(value: str, reason: str) -> None:
    with pytest.raises(InvalidSettingError, match="^app setting TokenKeys: ") as bad:
        Settings.from_env({**REQUIRED, TOKEN_KEYS: value})
    assert bad.value.name == TOKEN_KEYS and reason in str(bad.value)
    for part in value.split(","):
        if len(part) > 8:
            assert part not in str(bad.value)  # a key (even a wrong one) is never in a message or a log
    with pytest.raises(InvalidSettingError):
        parse_token_keys(value)


def test_the_workers_clients_fail_on_a_bad_token_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in REQUIRED:
        monkeypatch.setenv(name, REQUIRED[name])
    monkeypatch.setenv(TOKEN_KEYS, _key(16))
    monkeypatch.setattr(clients_module.get_clients, "value", None)
    with pytest.raises(InvalidSettingError, match="TokenKeys"):
        clients_module.get_clients()
    assert clients_module.get_clients.value is None


SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_no_webhook_url_no_webhook_and_the_secret_is_not_read() -> None:
    """A deployment with no WebhookUrl starts whatever WebhookSecret holds (in Azure, a Key Vault
    reference to a secret nobody set is passed on as it is)."""
    reference = "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/WebhookSecret)"
    env = {**REQUIRED, "WebhookSecret": reference}
    assert Settings.from_env(env).webhook is None


def test_a_webhook_target_is_read() -> None:
    env = {**REQUIRED, "WebhookUrl": "https://hooks.example/orders", "WebhookSecret": SECRET}
    target = Settings.from_env(env).webhook
    assert target is not None and target.url == "https://hooks.example/orders" and len(target.key) == 24
    local = Settings.from_env({**REQUIRED, "WebhookUrl": "http://127.0.0.1:8080/h", "WebhookSecret": SECRET}).webhook
    assert local is not None


@pytest.mark.parametrize(("values", "name", "reason"), [
    ({"WebhookUrl": "https://hooks.example/h"}, "WebhookSecret", "does not start with whsec_"),
    ({"WebhookUrl": "https://hooks.example/h", "WebhookSecret": "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, "WebhookSecret",
     "does not start with whsec_"),
    ({"WebhookUrl": "https://hooks.example/h", "WebhookSecret": "whsec_not*base64"}, "WebhookSecret", "not base64"),
    ({"WebhookUrl": "https://hooks.example/h", "WebhookSecret": "whsec_QUJD"}, "WebhookSecret", "fewer than 16"),
    ({"WebhookUrl": "https://hooks.example/h",
      "WebhookSecret": "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/WebhookSecret)"},
     "WebhookSecret", "Key Vault reference was not resolved"),
    ({"WebhookUrl": "http://hooks.example/h", "WebhookSecret": SECRET}, "WebhookUrl", "use https"),
    ({"WebhookUrl": "hooks.example/h", "WebhookSecret": SECRET}, "WebhookUrl", "absolute https"),
    ({"WebhookRetrySchedule": "5s,soon"}, "WebhookRetrySchedule", "not a delay"),
])
def test_a_bad_webhook_setting_stops_the_start_naming_it_never_the_secret(values: dict[str, str], name: str,
                                                                          reason: str) -> None:
    with pytest.raises(InvalidSettingError) as e:
        Settings.from_env({**REQUIRED, **values})
    assert e.value.name == name and reason in str(e.value)
    assert "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" not in str(e.value)
