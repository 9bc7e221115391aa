"""Required settings: the remote services' URLs have no default (nothing is safe in Azure); the
app's settings, and so the worker's clients, fail naming any that is missing."""

from __future__ import annotations

import pytest

from shared.runtime import clients as clients_module
from shared.settings import REQUIRED_SETTINGS, SETTINGS, MissingSettingError, Settings

URLS = {s.name: f"https://{s.name.lower()}.example.com" for s in REQUIRED_SETTINGS}


def test_the_service_urls_are_required() -> None:
    assert {s.name for s in REQUIRED_SETTINGS} == {"InventoryServiceUrl", "PaymentServiceUrl", "ShippingServiceUrl",
                                                   "DeliveryServiceUrl"}
    assert all(s.default is None for s in REQUIRED_SETTINGS)


def test_no_setting_defaults_to_a_local_address() -> None:
    for spec in SETTINGS:
        assert not any(h in (spec.default or "") for h in ("127.0.0.1", "localhost", "::1")), spec.name


@pytest.mark.parametrize("name", sorted(URLS))
@pytest.mark.parametrize("value", [None, "", "  "], ids=["unset", "empty", "blank"])
def test_a_missing_url_fails_naming_it(name: str, value: str | None) -> None:
    env = {k: v for k, v in URLS.items() if k != name}
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
                                   "DeliveryServiceUrl")
    assert str(missing.value).startswith(
        "required app settings not set: InventoryServiceUrl, PaymentServiceUrl, ShippingServiceUrl, DeliveryServiceUrl")


def test_given_urls_are_read_as_set() -> None:
    settings = Settings.from_env(URLS)
    assert {name: settings[name] for name in URLS} == URLS
    assert settings["SchedulerQueue"] == "scheduler"  # a setting with a safe default keeps it


def test_the_workers_clients_fail_naming_the_missing_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker builds its settings from its environment once, before any function runs."""
    for name in URLS:
        monkeypatch.setenv(name, URLS[name])
    monkeypatch.delenv("PaymentServiceUrl")
    monkeypatch.setattr(clients_module, "_clients", None)
    with pytest.raises(MissingSettingError, match="PaymentServiceUrl"):
        clients_module.get_clients()
    assert clients_module._clients is None
