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


def test_the_stack_makes_its_token_key_once_and_keeps_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A fresh clone needs no step: the first start makes a random key (owner-only file in the
    state directory), later starts reuse it, another state directory gets another key."""
    import stat

    from local.stack import TOKEN_KEY_FILE
    from shared.settings import TOKEN_KEYS, parse_token_keys

    first = stack(tmp_path / "a").build_settings()[TOKEN_KEYS]
    keys = parse_token_keys(first)
    assert len(keys.current) == 32 and keys.previous is None
    assert stack(tmp_path / "a").build_settings()[TOKEN_KEYS] == first
    assert stat.S_IMODE((tmp_path / "a" / TOKEN_KEY_FILE).stat().st_mode) == 0o600
    assert stack(tmp_path / "b").build_settings()[TOKEN_KEYS] != first
    assert stack(tmp_path / "c", TokenKeys=first).build_settings()[TOKEN_KEYS] == first  # --set wins
