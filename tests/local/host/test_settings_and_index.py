import json
import logging
import textwrap
import uuid
from datetime import timedelta
from pathlib import Path

import azure.functions as func
import pytest

from local.host.app import index_functions, load_app
from local.host.http_server import response_parts
from local.host.settings import (
    SettingError,
    load_host_config,
    load_local_settings,
    make_async_credential,
    parse_set_args,
    parse_timespan,
    resolve,
    resolve_connection,
    worker_environment,
)


def test_resolve_percent_settings():
    s = {"Q": "orders", "R": "v1"}
    assert resolve("%Q%", s) == "orders"
    assert resolve("api/%R%/items/{id}", s) == "api/v1/items/{id}"
    assert resolve({"a": ["%Q%", 1], "b": None}, s) == {"a": ["orders", 1], "b": None}
    assert resolve("100%", s) == "100%"
    with pytest.raises(SettingError, match="Missing"):
        resolve("%Missing%", s)


def test_timespan():
    assert parse_timespan("00:05:00", timedelta(0)) == timedelta(minutes=5)
    assert parse_timespan("1.02:03:04.5", timedelta(0)) == timedelta(days=1, hours=2, minutes=3, seconds=4.5)
    assert parse_timespan(None, timedelta(seconds=7)) == timedelta(seconds=7)
    with pytest.raises(SettingError):
        parse_timespan("5 minutes", timedelta(0))


def test_host_json_defaults_and_values(tmp_path: Path):
    cfg = load_host_config(tmp_path)
    assert cfg.route_prefix == "api"
    assert cfg.service_bus.max_concurrent_calls == 16
    assert cfg.service_bus.prefetch_count == 0
    assert cfg.service_bus.auto_complete_messages is True
    assert cfg.service_bus.max_auto_lock_renewal_duration == timedelta(minutes=5)
    (tmp_path / "host.json").write_text(json.dumps({
        "version": "2.0",
        "logging": {"logLevel": {"default": "Warning"}},
        "extensions": {"http": {"routePrefix": ""},
                       "serviceBus": {"MaxConcurrentCalls": 3, "prefetchCount": 20, "autoCompleteMessages": False,
                                      "maxAutoLockRenewalDuration": "00:00:30"}}}))
    cfg = load_host_config(tmp_path)
    assert cfg.route_prefix == ""
    assert cfg.service_bus.max_concurrent_calls == 3
    assert cfg.service_bus.prefetch_count == 20
    assert cfg.service_bus.auto_complete_messages is False
    assert cfg.service_bus.max_auto_lock_renewal_duration == timedelta(seconds=30)
    assert cfg.log_level == logging.WARNING
    # the functions' lines are the Function category's (the longest prefix), the default's otherwise
    (tmp_path / "host.json").write_text(json.dumps({
        "version": "2.0", "logging": {"logLevel": {"default": "Warning", "Function": "Information"}}}))
    assert load_host_config(tmp_path).log_level == logging.INFO


def test_app_settings_override_host_json_as_in_azure(tmp_path: Path):
    """AzureFunctionsJobHost__path__to__key (an app setting) overrides that host.json value."""
    (tmp_path / "host.json").write_text(json.dumps({"extensions": {"serviceBus": {"maxConcurrentCalls": 16}}}))
    env = {"AzureFunctionsJobHost__extensions__ServiceBus__maxConcurrentCalls": "2",
           "AzureFunctionsJobHost__extensions__serviceBus__prefetchCount": "5", "Unrelated": "x"}
    cfg = load_host_config(tmp_path, env)
    assert (cfg.service_bus.max_concurrent_calls, cfg.service_bus.prefetch_count) == (2, 5)
    assert load_host_config(tmp_path, {}).service_bus.max_concurrent_calls == 16
    # no host.json at all: the override still applies
    (tmp_path / "host.json").unlink()
    assert load_host_config(tmp_path, {"AzureFunctionsJobHost__extensions__http__routePrefix": "x"}).route_prefix == "x"


def test_host_json_extension_4_layout(tmp_path: Path):
    (tmp_path / "host.json").write_text(json.dumps({"extensions": {"serviceBus": {
        "messageHandlerOptions": {"maxConcurrentCalls": 7, "autoComplete": False,
                                  "maxAutoRenewDuration": "00:01:00"}}}}))
    sb = load_host_config(tmp_path).service_bus
    assert (sb.max_concurrent_calls, sb.auto_complete_messages) == (7, False)
    assert sb.max_auto_lock_renewal_duration == timedelta(minutes=1)


def test_local_settings_and_environment(tmp_path: Path):
    p = tmp_path / "local.settings.json"
    p.write_text("\ufeff" + json.dumps({"IsEncrypted": False, "Values": {"A": "1", "B": 2, "C": "from-file"}}),
                 encoding="utf-8")
    values = load_local_settings(p)["Values"]
    assert values == {"A": "1", "B": "2", "C": "from-file"}
    env, skipped = worker_environment({"C": "from-env", "PATH": "/bin"}, values, parse_set_args(["B=9", "D=x=y"]))
    assert env["A"] == "1" and env["B"] == "9" and env["D"] == "x=y" and env["PATH"] == "/bin"
    assert env["C"] == "from-env" and skipped == ["C"]  # Core Tools: the environment wins over Values
    env, _ = worker_environment({"C": "from-env"}, values, {"C": "from-set"})
    assert env["C"] == "from-set"
    with pytest.raises(SettingError):
        parse_set_args(["novalue"])


def test_the_example_settings_give_the_app_its_required_urls(tmp_path: Path):
    """local.settings.json.example, as the host hands it to the worker, starts the app's settings;
    without a service URL (no default: nothing is safe in Azure) they fail naming it."""
    from local.procs import REPO_ROOT
    from shared.settings import REQUIRED_SETTINGS, MissingSettingError, Settings

    values = load_local_settings(REPO_ROOT / "local.settings.json.example")["Values"]
    env, _ = worker_environment({}, values, {})
    settings = Settings.from_env(env)
    for spec in REQUIRED_SETTINGS:
        assert settings[spec.name] == values[spec.name]
        without = {k: v for k, v in values.items() if k != spec.name}
        env, _ = worker_environment({}, without, {})
        with pytest.raises(MissingSettingError, match=spec.name) as missing:
            Settings.from_env(env)
        assert missing.value.names == (spec.name,)
        env, _ = worker_environment({}, values, parse_set_args([f"{spec.name}="]))  # set, but empty
        with pytest.raises(MissingSettingError, match=spec.name):
            Settings.from_env(env)


def test_connections():
    cs = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;"
    assert resolve_connection("SB", {"SB": cs}).connection_string == cs
    assert resolve_connection("SB", {"AzureWebJobsSB": cs}).connection_string == cs
    c = resolve_connection("SB", {"SB__fullyQualifiedNamespace": "ns.servicebus.windows.net",
                                  "SB__credential": "managedidentity", "SB__clientId": "abc"})
    assert c.uses_identity and c.fully_qualified_namespace == "ns.servicebus.windows.net"
    assert (c.credential, c.client_id) == ("managedidentity", "abc")
    c2 = resolve_connection("SB", {"SB:fullyQualifiedNamespace": "sb://ns2.servicebus.windows.net/"})
    assert c2.fully_qualified_namespace == "ns2.servicebus.windows.net"
    with pytest.raises(SettingError):
        resolve_connection("SB", {"Other": cs})


def test_identity_credentials():
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    mi = make_async_credential(resolve_connection("SB", {
        "SB__fullyQualifiedNamespace": "ns", "SB__credential": "managedidentity", "SB__clientId": "cid"}))
    assert isinstance(mi.credential, ManagedIdentityCredential)
    d = make_async_credential(resolve_connection("SB", {"SB__fullyQualifiedNamespace": "ns"}))
    assert isinstance(d.credential, DefaultAzureCredential)


def _write_app(tmp_path: Path, body: str) -> tuple[Path, str]:
    name = f"app_{uuid.uuid4().hex[:8]}.py"  # a fresh module name per test
    (tmp_path / name).write_text(textwrap.dedent(body))
    return tmp_path, name


def test_index_resolves_settings_and_reports_bad_functions(tmp_path: Path):
    app_dir, script = _write_app(tmp_path, """
        import azure.functions as func
        app = func.FunctionApp()

        @app.route(route="%Prefix%/items/{id}", methods=["GET"])
        def get_item(req): return "x"

        @app.service_bus_queue_trigger(arg_name="msg", queue_name="%Q%", connection="SB")
        async def on_msg(msg: func.ServiceBusMessage, context): pass

        @app.service_bus_queue_trigger(arg_name="msg", queue_name="%Undefined%", connection="SB")
        def broken(msg): pass

        @app.queue_trigger(arg_name="m", queue_name="q", connection="Storage")
        def storage_queue(m): pass

        @app.timer_trigger(arg_name="t", schedule="%S%")
        def tick(t): pass
    """)
    app, _ = load_app(app_dir, script)
    specs, errors = index_functions(app, {"Prefix": "v1", "Q": "orders", "S": "*/5 * * * * *"})
    by_name = {s.name: s for s in specs}
    assert set(by_name) == {"get_item", "on_msg", "tick"}
    assert by_name["get_item"].trigger["route"] == "v1/items/{id}"
    assert by_name["get_item"].return_binding is not None
    assert by_name["on_msg"].trigger["queueName"] == "orders"
    assert by_name["on_msg"].is_async and by_name["on_msg"].context_param == "context"
    assert by_name["on_msg"].trigger_annotation is func.ServiceBusMessage
    assert by_name["tick"].trigger["schedule"] == "*/5 * * * * *"
    assert any(e.startswith("broken:") and "Undefined" in e for e in errors)
    assert any(e.startswith("storage_queue:") and "queueTrigger" in e for e in errors)


def test_load_app_needs_exactly_one_function_app(tmp_path: Path):
    app_dir, script = _write_app(tmp_path, """
        import azure.functions as func
        a = func.FunctionApp()
        b = func.FunctionApp()
    """)
    with pytest.raises(Exception, match="more than one"):
        load_app(app_dir, script)
    app_dir, script = _write_app(tmp_path, "x = 1\n")
    with pytest.raises(Exception, match="no FunctionApp"):
        load_app(app_dir, script)


def test_response_parts():
    assert response_parts(func.HttpResponse("hi")) == (200, [("Content-Type", "text/plain; charset=utf-8")], b"hi")
    status, headers, body = response_parts(func.HttpResponse(b"{}", status_code=202, mimetype="application/json",
                                                             headers={"X-A": "1"}))
    assert (status, body) == (202, b"{}")
    assert ("X-A", "1") in headers and ("Content-Type", "application/json") in headers
    status, headers, _ = response_parts(func.HttpResponse("x", headers={"Content-Type": "text/csv"}))
    assert [h for h in headers if h[0].lower() == "content-type"] == [("Content-Type", "text/csv")]
    assert response_parts(None)[0] == 204
    assert response_parts("s")[2] == b"s"
    assert response_parts({"a": 1})[2] == b'{"a": 1}'


def test_async_credential_adapter_calls_the_sync_credential():
    import asyncio

    from local.host.settings import AsyncCredentialAdapter

    class Fake:
        closed = False

        def get_token(self, *scopes, **kw):
            return ("token", scopes)

        def close(self):
            self.closed = True

    fake = Fake()

    async def go():
        async with AsyncCredentialAdapter(fake) as cred:
            return await cred.get_token("https://servicebus.azure.net/.default")

    assert asyncio.run(go()) == ("token", ("https://servicebus.azure.net/.default",))
    assert fake.closed
