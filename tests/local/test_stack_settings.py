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


def test_the_stack_makes_its_function_keys_once_per_state_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Keys are checked by default: made on first use (owner-only), kept for the next start, named in
    stack.json as host.keys.master and host.keys.function; another state directory gets others."""
    import stat

    from local.host.keys import KEY_HEADER

    a = Stack(state_dir=tmp_path / "a", persistent=False)
    assert a.keys is not None and stat.S_IMODE(a.keys_path.stat().st_mode) == 0o600
    assert stack(tmp_path / "a").keys == a.keys and stack(tmp_path / "b").keys != a.keys
    a.write_stack_json()  # owner-only, as the keys file: it names the keys
    assert stat.S_IMODE(a.stack_json_path.stat().st_mode) == 0o600
    described = a.describe()["host"]["keys"]
    assert (described["master"], described["function"]) == (a.keys.master, a.keys.function)
    assert a.key_headers() == {KEY_HEADER: a.keys.master} and a.key_headers("function") == {KEY_HEADER: a.keys.function}
    assert a.key_headers("anonymous") == {} and a.session().headers[KEY_HEADER] == a.keys.master


def test_without_keys_nothing_is_made_or_sent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = Stack(state_dir=tmp_path, persistent=False, keys=False)
    assert s.keys is None and not s.keys_path.exists()
    assert s.key_headers() == {} and s.describe()["host"]["keys"] is None


def test_the_banner_gives_the_console_with_its_key_and_a_curl_line_with_the_function_key(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    from local.stack import banner

    s = stack(tmp_path)
    s.base_url = "http://127.0.0.1:7071"
    assert s.keys is not None
    text = banner(s)
    assert f"http://127.0.0.1:7071/api/console?code={s.keys.master}" in text
    assert f"curl -H 'x-functions-key: {s.keys.function}' http://127.0.0.1:7071/api/orders/" in text
    keyless = Stack(state_dir=tmp_path / "none", persistent=False, keys=False)
    keyless.base_url = s.base_url
    assert "?code=" not in banner(keyless) and "x-functions-key" not in banner(keyless)
    assert "telemetry:" not in text
    s.telemetry_url = "http://127.0.0.1:7099"
    assert "telemetry:   http://127.0.0.1:7099/_stats" in banner(s)


def test_the_app_service_mode_gets_the_stand_in_for_app_service_authentication(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The stack sets WEBSITE_AUTH_ENABLED as App Service does when its authentication is on; the key
    mode does not get it, and an override (to see the mode refuse) wins."""
    assert stack(tmp_path, OperatorAuth="appService").build_settings()["WEBSITE_AUTH_ENABLED"] == "True"
    assert "WEBSITE_AUTH_ENABLED" not in stack(tmp_path).build_settings()
    off = stack(tmp_path, OperatorAuth="appService", WEBSITE_AUTH_ENABLED="False").build_settings()
    assert off["WEBSITE_AUTH_ENABLED"] == "False"


def test_with_telemetry_the_apps_connection_string_points_at_the_receiver(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    from local.telemetry import connection_string

    s = stack(tmp_path)
    assert "APPLICATIONINSIGHTS_CONNECTION_STRING" not in s.build_settings()
    s.telemetry_url = "http://127.0.0.1:7099"
    values = s.build_settings()
    assert values["APPLICATIONINSIGHTS_CONNECTION_STRING"] == connection_string("http://127.0.0.1:7099")
    assert "IngestionEndpoint=http://127.0.0.1:7099/;LiveEndpoint=http://127.0.0.1:7099/" in \
        values["APPLICATIONINSIGHTS_CONNECTION_STRING"]
    assert values["APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL"] == "true"
    assert values["APPLICATIONINSIGHTS_CONTROLPLANE_DISABLED"] == "true"
