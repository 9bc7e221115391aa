"""The one declaration of the app's settings.

Every app setting the app reads is declared here, under the same name it has as an Azure
app setting (and in local.settings.json ``Values``). Queue settings default to the queue
names declared in ``infra/servicebus-config.json`` (the official emulator's Config.json
format); the consistency tests check that the two agree, and that Bicep and
``local.settings.json.example`` carry the same set.

Connections are prefixes, as the Functions host reads them: ``ServiceBusConnection`` is
either a connection string, or identity-based settings under
``ServiceBusConnection__fullyQualifiedNamespace`` (+ ``__credential``, ``__clientId``);
``StateStorage`` is either a connection string or ``StateStorage__tableServiceUri``
(+ ``__credential``, ``__clientId``).

Each agent of ``workflows/agents.json`` (``shared.core.workflows.catalog``) brings two settings, derived
here rather than written out: its queue setting (default ``agent-{name}``, the queue
``infra/servicebus-config.json`` declares) and its service URL setting (required). A new remote
service is one line in that file plus its queue. Each priority lane of ``workflows/lanes.json``
(``shared.core.workflows.lanes``) but the first brings a copy of every work-queue setting (``SchedulerQueueHigh``,
default ``scheduler-high``).

A value setting declared with no default (the remote services' URLs: nothing is a safe
default for them in Azure; ``TokenKeys``) is required: ``Settings.from_env`` raises
``MissingSettingError``, naming it, when it is unset or empty. ``local.settings.json.example`` and
the local stack give them their local values.

``TokenKeys`` (kind ``secret``) is the MAC key of the app's opaque tokens (continuation and
fencing tokens, ``shared.core.sealed``): ``<current>[,<previous>]``, each the base64 of at least
32 random bytes. The current key signs; a token by either key is accepted (two-key rotation,
docs/operating.md). In Azure it is a Key Vault reference; no key is in the code. A value that is
not of that form stops the start (``InvalidSettingError``, naming the setting, never the value).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from shared.core.room import CapError, customer_cap
from shared.core.sealed import MIN_KEY_BYTES, Keys
from shared.core.webhooks import DEFAULT_SCHEDULE, WebhookSettingError, parse_schedule, parse_secret
from shared.core.workflows.catalog import AGENTS
from shared.core.workflows.lanes import FAST_LANES, LANED_QUEUES
from shared.core.workflows.ratelimits import RateLimit, RateLimitError, effective_limits


@dataclass(frozen=True)
class SettingSpec:
    name: str
    default: str | None
    description: str
    # "queue": the value names a queue in infra/servicebus-config.json.
    # "table": the value names a table. "connection": a connection prefix.
    # "secret": a value Azure takes from Key Vault (a Key Vault reference), never in code or logs.
    kind: str = "value"

    @property
    def required(self) -> bool:
        """A value with no default: the app does not start without it."""
        return self.default is None and self.kind != "connection"


# Connection prefixes (not read as plain values; see Connection below).
SERVICE_BUS_CONNECTION = "ServiceBusConnection"
STATE_STORAGE_CONNECTION = "StateStorage"
TOKEN_KEYS = "TokenKeys"
WEBHOOK_URL = "WebhookUrl"
WEBHOOK_SECRET = "WebhookSecret"

SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec(SERVICE_BUS_CONNECTION, None, "Service Bus connection (string or identity prefix)", "connection"),
    SettingSpec(STATE_STORAGE_CONNECTION, None, "Table Storage connection (string or identity prefix)", "connection"),
    SettingSpec("SchedulerQueue", "scheduler", "Queue the Scheduler is told about new/redriven orders on", "queue"),
    SettingSpec("RepliesQueue", "replies", "Queue agents reply on", "queue"),
    *(SettingSpec(a.queue_setting, a.default_queue, f"{a.name.capitalize()} agent's request queue", "queue")
      for a in AGENTS),
    # Each priority lane's copy of every work queue (workflows/lanes.json: SchedulerQueueHigh...).
    *(SettingSpec(lane.setting(setting), lane.queue(queue), f"{setting}, {lane.name}-priority lane", "queue")
      for lane in FAST_LANES for setting, queue in LANED_QUEUES),
    SettingSpec("AlertsQueue", "alerts", "Operator alerts queue", "queue"),
    SettingSpec("StatusQueue", "order-status",
                "The status queue the deployment provides (status goes only to a statusQueue an order names)", "queue"),
    SettingSpec("WebhooksQueue", "webhooks", "Webhook deliveries: each try of each delivery (shared.core.webhooks)",
                "queue"),
    SettingSpec("StateTable", "orders", "Table holding order and state rows", "table"),
    SettingSpec("DeadlineTable", "deadlines", "Deadline index the Supervisor sweeps", "table"),
    SettingSpec("OrderIndexTable", "orderindex", "Search index of orders (by time, customer, category, finish day)",
                "table"),
    *(SettingSpec(a.service_url_setting, None, f"{a.name.capitalize()} service base URL") for a in AGENTS),
    SettingSpec(TOKEN_KEYS, None, "MAC keys of the continuation and fencing tokens: <current>[,<previous>], "
                "each base64 of at least 32 random bytes (a Key Vault reference in Azure)", "secret"),
    SettingSpec(WEBHOOK_URL, "", "The URL told when an order ends (a signed POST, Standard Webhooks); https outside "
                "local dev; empty: no webhook (nothing written, nothing sent)"),
    SettingSpec(WEBHOOK_SECRET, "", "The webhooks' signing secret: whsec_ + the base64 of at least 16 random bytes "
                "(a Key Vault reference in Azure); read only when WebhookUrl is set", "secret"),
    SettingSpec("WebhookRetrySchedule", DEFAULT_SCHEDULE,
                "The delay after each failed try of a webhook (N s, m or h, comma-separated); a try more than "
                "delays, then the delivery is failed (listed for an operator, who may send it again)"),
    SettingSpec("SupervisorSchedule", "*/15 * * * * *", "NCRONTAB schedule of the Supervisor timer"),
    SettingSpec("MaxFailureCount", "3", "FailureCount at which a step goes to Error"),
    SettingSpec("BackoffThreshold", "1", "FailureCount after which the Supervisor delays the redrive"),
    SettingSpec("BackoffBaseSeconds", "5", "First redrive delay past the backoff threshold; doubles each time"),
    SettingSpec("UnclaimedGraceSeconds", "30", "Age after which an unclaimed Pending order is rescheduled"),
    SettingSpec("StepTimeoutSeconds", "", "If set, overrides every step's timeout (short timeouts for tests)"),
    SettingSpec("MaxRequestBytes", "65536", "Largest accepted order body"),
    SettingSpec("RetentionDays", "30", "Days a finished order (and its history) is kept before it is purged"),
    SettingSpec("RetentionSchedule", "0 17 * * * *", "NCRONTAB schedule of the retention purge timer"),
    SettingSpec("BreakerFailureThreshold", "5",
                "Failures of one remote in a row (no answer between them), within the breaker's window, "
                "that open its circuit breaker"),
    SettingSpec("BreakerWindowSeconds", "10",
                "Window in which a remote's failures are counted toward opening its breaker"),
    SettingSpec("BreakerCoolDownSeconds", "5",
                "Time an open breaker waits before one instance sends a probe call"),
    SettingSpec("BreakerProbeLeaseSeconds", "10",
                "A probe that has not reported by then is replaced by another instance's"),
    SettingSpec("BreakerMaxWaitSeconds", "300",
                "Longest a step waits on an open breaker, from its first wait; then it fails for good, once"),
    SettingSpec("BreakerCacheSeconds", "1",
                "How long an instance reuses a breaker row it read closed with no failure counted (0: read "
                "it on every call); another instance's opening is seen up to this much later"),
    SettingSpec("RemoteRateLimits", "",
                "Calls per second per remote, shared by every instance, over workflows/agents.json's rateLimit: "
                "NAME=N/s or NAME=off, comma-separated (payment=8/s,shipping=20/s); empty: the declared limits"),
    SettingSpec("CustomerMaxInFlight", "0",
                "Orders of one customer past submission and not yet ended, at most; the others are accepted and "
                "wait for a slot, in submission order (a whole number up to 400; 0 or empty: no cap)"),
    SettingSpec("BulkOrdersPerTick", "100",
                "Orders a bulk operation acts on per Supervisor tick (its pace: live traffic keeps its latency)"),
    SettingSpec("BulkMaxInFlight", "5",
                "A bulk operation puts no more orders in flight once this many are, live traffic's included"),
    SettingSpec("WorkflowsPath", "workflows",
                "Directory of the workflow files (<name>.v<version>.yaml); relative to the app's root"),
    SettingSpec("TelemetrySamplingRatio", "0.05",
                "Share of orders (0 to 1) whose telemetry is exported, decided once per order by its trace id; "
                "an order that fails, is held or compensates is kept from then on, warnings and errors always "
                "(docs/cost.md, Telemetry)"),
    SettingSpec("OperatorAuth", "key",
                "Gate of the operator routes and the console: key (the master key) or appService (App Service "
                "authentication's signed-in user)"),
    SettingSpec("OperatorRole", "", "In the appService mode, if set: the role (or group id) an operator must have"),
    SettingSpec("ViewerRole", "",
                "In the appService mode, if set: a role (or group id) that may only read: search, history, the "
                "console's views and the dead letters"),
)

SETTING_NAMES = frozenset(s.name for s in SETTINGS)
if len(SETTING_NAMES) != len(SETTINGS):  # an agent's setting named like another setting
    _twice = sorted({s.name for s in SETTINGS if sum(t.name == s.name for t in SETTINGS) > 1})
    raise ValueError(f"settings declared twice (shared/settings.py, workflows/agents.json): {', '.join(_twice)}")
QUEUE_SETTINGS = tuple(s for s in SETTINGS if s.kind == "queue")
TABLE_SETTINGS = tuple(s for s in SETTINGS if s.kind == "table")
REQUIRED_SETTINGS = tuple(s for s in SETTINGS if s.required)


class MissingSettingError(LookupError):
    """Required app settings (no default) are unset or empty; ``names`` lists them."""

    def __init__(self, names: list[str]) -> None:
        self.names = tuple(names)
        plural = len(self.names) > 1
        super().__init__(f"required app setting{'s' if plural else ''} not set: {', '.join(self.names)} "
                         f"(no default is safe in Azure: set {'them' if plural else 'it'} as app "
                         f"setting{'s' if plural else ''}, or in local.settings.json Values locally)")


class InvalidSettingError(ValueError):
    """An app setting is set to a value the app cannot use; ``name`` is the setting."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        super().__init__(f"app setting {name}: {reason}")


_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")


def new_token_key() -> str:
    """A fresh key for ``TokenKeys``: the base64 of 32 random bytes (what ``openssl rand -base64 32``
    prints). Every local stack makes its own so; Azure's is in Key Vault."""
    import secrets

    return base64.b64encode(secrets.token_bytes(MIN_KEY_BYTES)).decode("ascii")


def parse_token_keys(raw: str) -> Keys:
    """The keys of a ``TokenKeys`` value, ``<current>[,<previous>]``, each base64 (standard or
    URL-safe, padding optional) of at least ``MIN_KEY_BYTES`` bytes. ``InvalidSettingError`` names
    the setting and what is wrong, never the value."""
    form = (f"expected <current>[,<previous>], each the base64 of at least {MIN_KEY_BYTES} random bytes "
            "(docs/operating.md, \"Token keys\")")
    parts = [p.strip() for p in raw.split(",")]
    if len(parts) > 2:
        raise InvalidSettingError(TOKEN_KEYS, f"{len(parts)} keys given, at most 2 (current, previous); {form}")
    keys: list[bytes] = []
    for which, part in zip(("current", "previous"), parts, strict=False):
        if not part:
            raise InvalidSettingError(TOKEN_KEYS, f"the {which} key is empty; {form}")
        if part.startswith("@Microsoft.KeyVault("):
            raise InvalidSettingError(TOKEN_KEYS, "the Key Vault reference was not resolved (does the secret exist, "
                                      "and may the app's identity read it?); docs/operating.md, \"Token keys\"")
        if not _BASE64.fullmatch(part):
            raise InvalidSettingError(TOKEN_KEYS, f"the {which} key is not base64; {form}")
        standard = part.replace("-", "+").replace("_", "/").rstrip("=")
        try:
            key = base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidSettingError(TOKEN_KEYS, f"the {which} key is not base64; {form}") from None
        if len(key) < MIN_KEY_BYTES:
            raise InvalidSettingError(TOKEN_KEYS, f"the {which} key has {len(key)} bytes, fewer than {MIN_KEY_BYTES}; "
                                      f"{form}")
        keys.append(key)
    return Keys(current=keys[0], previous=keys[1] if len(keys) > 1 else None)


@dataclass(frozen=True)
class Connection:
    """A connection read from a setting prefix: a connection string, or identity-based settings."""

    name: str
    connection_string: str | None = None
    endpoint: str | None = None  # fullyQualifiedNamespace or tableServiceUri
    credential: str | None = None  # e.g. "managedidentity"
    client_id: str | None = None

    @property
    def uses_identity(self) -> bool:
        return self.connection_string is None


def read_connection(env: Mapping[str, str], name: str, endpoint_key: str) -> Connection:
    value = env.get(name)
    if value:
        return Connection(name=name, connection_string=value)
    endpoint = env.get(f"{name}__{endpoint_key}")
    if not endpoint:
        raise KeyError(f"setting {name} (a connection string) or {name}__{endpoint_key} is required")
    return Connection(
        name=name,
        endpoint=endpoint,
        credential=env.get(f"{name}__credential"),
        client_id=env.get(f"{name}__clientId"),
    )


@dataclass(frozen=True)
class Settings:
    values: Mapping[str, str] = field(default_factory=dict)
    service_bus: Connection | None = None
    state_storage: Connection | None = None

    def __getitem__(self, name: str) -> str:
        if name not in SETTING_NAMES:
            raise KeyError(f"{name} is not a declared setting (shared/settings.py)")
        return self.values[name]

    def int(self, name: str) -> int:
        return int(self[name])

    def decimal(self, name: str) -> Decimal:
        return Decimal(self[name])

    @property
    def webhook(self) -> WebhookTarget | None:
        """Where the webhooks go, or None (checked by ``from_env``)."""
        return webhook_target(self.values)

    @property
    def token_keys(self) -> Keys:
        """The MAC keys of ``TokenKeys`` (checked by ``from_env``)."""
        return parse_token_keys(self[TOKEN_KEYS])

    def queues(self) -> dict[str, str]:
        """Every queue's setting name -> the queue's name (every lane's work queues included)."""
        return {s.name: self[s.name] for s in QUEUE_SETTINGS}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings in ``env`` (default: the process environment, where the host puts them).

        Raises ``MissingSettingError`` naming every required setting that is unset or empty, and
        ``InvalidSettingError`` for a ``TokenKeys`` that is not of its form."""
        env = os.environ if env is None else env
        values: dict[str, str] = {}
        missing: list[str] = []
        for spec in SETTINGS:
            if spec.kind == "connection":
                continue
            raw = env.get(spec.name)
            if spec.required and not (raw or "").strip():
                missing.append(spec.name)
                continue
            values[spec.name] = raw if raw is not None else (spec.default or "")
        if missing:
            raise MissingSettingError(missing)
        parse_token_keys(values[TOKEN_KEYS])  # a bad key stops the start, naming the setting
        remote_rate_limits(values)  # so does a rate limit that is not NAME=N/s or NAME=off
        customer_max_in_flight(values)  # and a cap that is not a whole number up to 400
        webhook_target(values)  # and a webhook URL, secret or schedule the app cannot use
        service_bus = _maybe(lambda: read_connection(env, SERVICE_BUS_CONNECTION, "fullyQualifiedNamespace"))
        state_storage = _maybe(lambda: read_connection(env, STATE_STORAGE_CONNECTION, "tableServiceUri"))
        return cls(values=values, service_bus=service_bus, state_storage=state_storage)


def remote_rate_limits(values: Mapping[str, str]) -> dict[str, RateLimit]:
    """Each limited remote's limit: ``RemoteRateLimits`` over workflows/agents.json's ``rateLimit``.
    Raises :class:`InvalidSettingError` naming the setting and the item that is wrong."""
    declared = {a.name: a.rate_limit for a in AGENTS}
    try:
        return effective_limits(declared, values.get("RemoteRateLimits", ""))
    except RateLimitError as e:
        raise InvalidSettingError("RemoteRateLimits", e.reason) from None


def customer_max_in_flight(values: Mapping[str, str]) -> int:
    """``CustomerMaxInFlight`` (0: no cap). Raises :class:`InvalidSettingError` naming the setting."""
    try:
        return customer_cap(values.get("CustomerMaxInFlight", ""))
    except CapError as e:
        raise InvalidSettingError("CustomerMaxInFlight", e.reason) from None


@dataclass(frozen=True)
class WebhookTarget:
    """Where the webhooks go (``WebhookUrl``) and their signing key (``WebhookSecret``)."""

    url: str
    key: bytes


# Local dev (the local stack, tests): an http URL of this host is allowed; anything else is https.
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def webhook_target(values: Mapping[str, str]) -> WebhookTarget | None:
    """The webhook target, or None when ``WebhookUrl`` is empty (then ``WebhookSecret`` is not read:
    a Key Vault reference to a secret never set does no harm). Raises :class:`InvalidSettingError`
    naming the setting (never the secret's value). The URL comes from this setting only: never from
    an order (no server-side request forgery)."""
    try:
        parse_schedule(values.get("WebhookRetrySchedule", ""))
    except WebhookSettingError as e:
        raise InvalidSettingError("WebhookRetrySchedule", str(e)) from None
    url = (values.get(WEBHOOK_URL) or "").strip()
    if not url:
        return None
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    host = host if host.startswith("[") else host.split(":", 1)[0]
    if scheme not in ("https", "http") or not host:
        raise InvalidSettingError(WEBHOOK_URL, "expected an absolute https:// URL")
    if scheme == "http" and host not in _LOCAL_HOSTS:
        raise InvalidSettingError(WEBHOOK_URL, "an http URL is only for local dev (127.0.0.1, localhost): "
                                  "use https")
    try:
        key = parse_secret((values.get(WEBHOOK_SECRET) or "").strip())
    except WebhookSettingError as e:
        raise InvalidSettingError(WEBHOOK_SECRET, f"{e} (it is required when WebhookUrl is set)") from None
    return WebhookTarget(url, key)


def _maybe(fn):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except KeyError:
        return None


def setting_from_env(name: str, env: Mapping[str, str] | None = None) -> str:
    """One setting's value (its default when unset), for what is fixed when the app is indexed."""
    spec = next((s for s in SETTINGS if s.name == name), None)
    if spec is None:
        raise KeyError(f"{name} is not a declared setting (shared/settings.py)")
    env = os.environ if env is None else env
    value = env.get(name)
    return value if value is not None else (spec.default or "")


def queue_names() -> dict[str, str]:
    """Setting name -> default queue name, for every queue setting."""
    return {s.name: s.default or "" for s in QUEUE_SETTINGS}


def instance_id(env: Mapping[str, str] | None = None) -> str:
    """This host instance's id: ``WEBSITE_INSTANCE_ID`` (set by the platform in Azure, and by
    the local host per instance), else host name + pid. Not an app setting: the platform's."""
    import socket

    env = os.environ if env is None else env
    return env.get("WEBSITE_INSTANCE_ID") or f"{socket.gethostname()}-{os.getpid()}"
