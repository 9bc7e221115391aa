"""Settings as the Functions host reads them: host.json, local.settings.json, ``%Name%``, connections."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger("local.host")

_PERCENT = re.compile(r"%([^%\s]+)%")


class SettingError(ValueError):
    """A binding names a setting that is not defined, or a setting has a bad value."""


def load_json_file(path: Path) -> dict[str, Any]:
    """Read a JSON file; the host tolerates a UTF-8 BOM."""
    text = path.read_text(encoding="utf-8-sig")
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise SettingError(f"{path}: expected a JSON object")
    return data


def load_local_settings(path: Path | None) -> dict[str, Any]:
    if path is None or not path.exists():
        if path is not None:
            log.warning("settings file %s not found; using the environment only", path)
        return {"Values": {}}
    data = load_json_file(path)
    values = data.get("Values") or {}
    if not isinstance(values, dict):
        raise SettingError(f"{path}: Values must be an object")
    data["Values"] = {str(k): "" if v is None else str(v) for k, v in values.items()}
    return data


def worker_environment(
    base: Mapping[str, str], values: Mapping[str, str], overrides: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The worker's environment, built as Core Tools does.

    ``Values`` become environment variables, except those already defined in the environment
    (Core Tools prints "Skipping 'X' from local settings as it's already defined in current
    environment variables"). ``--set`` overrides both. Returns the env and the skipped names.
    """
    env = dict(base)
    skipped = []
    for k, v in values.items():
        if k in env and env[k] != v:
            skipped.append(k)
            continue
        env[k] = v
    env.update(overrides)
    return env, skipped


def parse_set_args(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SettingError(f"--set expects Name=Value, got {item!r}")
        out[name] = value
    return out


def resolve(value: Any, settings: Mapping[str, str]) -> Any:
    """Replace every ``%Name%`` in a binding property by the app setting ``Name``.

    Works on strings, and recursively on lists and dicts. An undefined setting is an error,
    as in the host ("'%X%' does not resolve to a value").
    """
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in settings:
                raise SettingError(f"'%{name}%' does not resolve to a value (no app setting {name!r})")
            return settings[name]
        return _PERCENT.sub(sub, value)
    if isinstance(value, list):
        return [resolve(v, settings) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, settings) for k, v in value.items()}
    return value


def parse_timespan(value: Any, default: timedelta) -> timedelta:
    """Parse a .NET TimeSpan (``[d.]hh:mm:ss[.fff]``) as host.json writes them."""
    if value is None or value == "":
        return default
    if isinstance(value, (int, float)):
        return timedelta(seconds=float(value))
    m = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d+))?", str(value).strip())
    if not m:
        raise SettingError(f"not a TimeSpan: {value!r}")
    days, h, mi, s, frac = m.groups()
    return timedelta(days=int(days or 0), hours=int(h), minutes=int(mi), seconds=int(s),
                     microseconds=int((frac or "0")[:6].ljust(6, "0")))


@dataclass(frozen=True)
class ServiceBusOptions:
    max_concurrent_calls: int = 16
    prefetch_count: int = 0
    auto_complete_messages: bool = True
    max_auto_lock_renewal_duration: timedelta = timedelta(minutes=5)
    max_concurrent_sessions: int = 8
    session_idle_timeout: timedelta | None = None


@dataclass(frozen=True)
class HostConfig:
    route_prefix: str = "api"
    service_bus: ServiceBusOptions = ServiceBusOptions()
    log_level: int = logging.INFO
    raw: Mapping[str, Any] | None = None


_LEVELS = {
    "trace": logging.DEBUG, "debug": logging.DEBUG, "information": logging.INFO,
    "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL,
    "none": logging.CRITICAL + 10,
}


def _ci_get(d: Mapping[str, Any] | None, key: str, default: Any = None) -> Any:
    """host.json keys are case-insensitive."""
    if not isinstance(d, Mapping):
        return default
    for k, v in d.items():
        if k.lower() == key.lower():
            return v
    return default


def _as_bool(v: Any, default: bool) -> bool:
    if v is None:
        return default
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes")


HOST_JSON_OVERRIDE = "AzureFunctionsJobHost__"


def apply_host_overrides(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """host.json with the app settings that override it, as the host reads them:
    ``AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls=4`` sets that value
    (keys matched case-insensitively, missing objects created; the value stays a string)."""
    out = json.loads(json.dumps(raw))
    for name, value in sorted(env.items()):
        if not name.lower().startswith(HOST_JSON_OVERRIDE.lower()):
            continue
        path = [p for p in name[len(HOST_JSON_OVERRIDE):].split("__") if p]
        node = out
        for key in path[:-1]:
            found = next((k for k in node if k.lower() == key.lower()), None)
            if found is None or not isinstance(node[found], dict):
                found = found or key
                node[found] = {}
            node = node[found]
        if path:
            node[next((k for k in node if k.lower() == path[-1].lower()), path[-1])] = value
    return out


def load_host_config(app_dir: Path, env: Mapping[str, str] | None = None) -> HostConfig:
    path = app_dir / "host.json"
    raw = load_json_file(path) if path.exists() else {}
    raw = apply_host_overrides(raw if isinstance(raw, dict) else {}, os.environ if env is None else env)
    ext = _ci_get(raw, "extensions", {})
    http = _ci_get(ext, "http", {})
    prefix = _ci_get(http, "routePrefix", "api")
    prefix = "" if prefix is None else str(prefix).strip("/")
    sb = _ci_get(ext, "serviceBus", {}) or {}
    # Extension 4.x wrote these under messageHandlerOptions / sessionHandlerOptions.
    mho = _ci_get(sb, "messageHandlerOptions", {}) or {}
    sho = _ci_get(sb, "sessionHandlerOptions", {}) or {}

    def pick(name: str, *alts: Mapping[str, Any]) -> Any:
        v = _ci_get(sb, name)
        for a in alts:
            if v is None:
                v = _ci_get(a, name)
        return v

    idle = pick("sessionIdleTimeout", sho)
    auto_complete = pick("autoCompleteMessages", mho)
    if auto_complete is None:
        auto_complete = _ci_get(mho, "autoComplete")
    renewal = pick("maxAutoLockRenewalDuration", mho, sho)
    if renewal is None:
        renewal = _ci_get(mho, "maxAutoRenewDuration") or _ci_get(sho, "maxAutoRenewDuration")
    options = ServiceBusOptions(
        max_concurrent_calls=int(pick("maxConcurrentCalls", mho) or 16),
        prefetch_count=int(pick("prefetchCount") or 0),
        auto_complete_messages=_as_bool(auto_complete, True),
        max_auto_lock_renewal_duration=parse_timespan(renewal, timedelta(minutes=5)),
        max_concurrent_sessions=int(pick("maxConcurrentSessions", sho) or 8),
        session_idle_timeout=parse_timespan(idle, timedelta(0)) if idle else None,
    )
    # The functions' log lines (the app's and the host's Executing/Executed) are the Function.*
    # categories in Azure: the level of "Function", else the default's, as .NET's longest-prefix rule
    levels = _ci_get(_ci_get(raw, "logging", {}), "logLevel", {})
    level_cfg = _ci_get(levels, "Function") or _ci_get(levels, "default")
    level = _LEVELS.get(str(level_cfg).lower(), logging.INFO) if level_cfg else logging.INFO
    return HostConfig(route_prefix=prefix, service_bus=options, log_level=level, raw=raw)


@dataclass(frozen=True)
class ConnectionInfo:
    """A connection named by a binding's ``connection`` property."""

    name: str
    connection_string: str | None = None
    fully_qualified_namespace: str | None = None
    credential: str | None = None
    client_id: str | None = None

    @property
    def uses_identity(self) -> bool:
        return self.connection_string is None


def resolve_connection(name: str, settings: Mapping[str, str]) -> ConnectionInfo:
    """Find a connection as the host does: a connection string under the name (or
    ``AzureWebJobs<name>``), or identity-based settings ``<name>__fullyQualifiedNamespace``
    (+ ``__credential``, ``__clientId``). ``:`` and ``__`` are the same separator."""
    norm = {k.replace(":", "__"): v for k, v in settings.items()}
    for candidate in (name, f"AzureWebJobs{name}"):
        cs = norm.get(candidate)
        if cs:
            return ConnectionInfo(name, connection_string=cs)
        fqns = norm.get(f"{candidate}__fullyQualifiedNamespace")
        if fqns:
            fqns = re.sub(r"^(sb|https?)://", "", fqns).rstrip("/")
            return ConnectionInfo(
                name,
                fully_qualified_namespace=fqns,
                credential=norm.get(f"{candidate}__credential") or None,
                client_id=norm.get(f"{candidate}__clientId") or None,
            )
    raise SettingError(
        f"connection {name!r}: no setting {name!r} (connection string) nor {name}__fullyQualifiedNamespace")


class AsyncCredentialAdapter:
    """An async token credential over a sync azure-identity credential.

    azure-identity's own async credentials need aiohttp, which the app does not install; the
    async Service Bus client only needs ``await get_token(...)``."""

    def __init__(self, credential: Any) -> None:
        self.credential = credential

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        import asyncio

        return await asyncio.to_thread(self.credential.get_token, *scopes, **kwargs)

    async def close(self) -> None:
        close = getattr(self.credential, "close", None)
        if close:
            close()

    async def __aenter__(self) -> AsyncCredentialAdapter:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def make_credential(conn: ConnectionInfo) -> Any:
    """azure-identity credential for an identity-based connection, as the host picks it:
    ``__credential=managedidentity`` (with ``__clientId``) or DefaultAzureCredential."""
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    if (conn.credential or "").lower() == "managedidentity":
        return ManagedIdentityCredential(client_id=conn.client_id) if conn.client_id else ManagedIdentityCredential()
    if conn.client_id:
        return DefaultAzureCredential(managed_identity_client_id=conn.client_id)
    return DefaultAzureCredential()


def make_async_credential(conn: ConnectionInfo) -> AsyncCredentialAdapter:
    return AsyncCredentialAdapter(make_credential(conn))
