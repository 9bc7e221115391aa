"""The local stack's local.settings.json: every required setting (no default) gets its local value."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from local.stack import Stack, StackError
from shared.settings import REQUIRED_SETTINGS, Settings


def stack(tmp_path, **overrides: str) -> Stack:  # type: ignore[no-untyped-def]
    s = Stack(state_dir=tmp_path, persistent=False, settings_overrides=overrides)
    s.azurite = SimpleNamespace(connection_string="UseDevelopmentStorage=true")  # type: ignore[assignment]
    s.servicebus_connection_string = "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=v;"
    s.remotes_url = "http://127.0.0.1:7999"
    return s


def test_the_stack_gives_the_service_urls_of_its_simulator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    values = stack(tmp_path).build_settings()
    assert values["InventoryServiceUrl"] == "http://127.0.0.1:7999/inventory"
    assert values["PaymentServiceUrl"] == "http://127.0.0.1:7999/payment"
    assert values["ShippingServiceUrl"] == "http://127.0.0.1:7999/shipping"
    assert values["DeliveryServiceUrl"] == "http://127.0.0.1:7999/delivery"
    settings = Settings.from_env(values)  # what the app reads: complete
    assert all(settings[s.name] for s in REQUIRED_SETTINGS)


def test_an_override_may_not_blank_a_required_setting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StackError, match="PaymentServiceUrl"):
        stack(tmp_path, PaymentServiceUrl="").build_settings()
    assert stack(tmp_path, PaymentServiceUrl="http://elsewhere/pay").build_settings()["PaymentServiceUrl"] == \
        "http://elsewhere/pay"
