"""The rate limits' declaration (workflows/agents.json ``rateLimit``) and their setting
(``RemoteRateLimits``): parsed, validated, the setting over the file, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.core.statemachine.config import Config
from shared.core.workflows.catalog import AGENTS, CatalogError, load_agents
from shared.core.workflows.ratelimits import RateLimit, RateLimitError, effective_limits, parse_limits
from shared.settings import InvalidSettingError, Settings, remote_rate_limits

NAMES = ("inventory", "payment", "shipping", "delivery")


def test_the_setting_parses_rates_and_off() -> None:
    assert parse_limits("payment=8/s, shipping = 20/s,delivery=off", NAMES) == {
        "payment": RateLimit(8.0), "shipping": RateLimit(20.0), "delivery": None}
    assert parse_limits("", NAMES) == {} and parse_limits(" , ", NAMES) == {}
    assert parse_limits("payment=0.5/s", NAMES) == {"payment": RateLimit(0.5)}


@pytest.mark.parametrize(("text", "says"), [
    ("payment=8", "is not NAME=N/s or NAME=off"),
    ("payment:8/s", "is not NAME=N/s or NAME=off"),
    ("payment=-1/s", "is not NAME=N/s or NAME=off"),
    ("payment=0/s", "the rate must be > 0"),
    ("billing=8/s", "'billing' is not an agent of workflows/agents.json"),
    ("payment=8/s,payment=9/s", "'payment' is given twice"),
])
def test_a_bad_setting_names_the_setting_and_the_item(text: str, says: str) -> None:
    with pytest.raises(RateLimitError) as caught:
        parse_limits(text, NAMES)
    assert "RemoteRateLimits" in str(caught.value) and says in str(caught.value)


def test_the_setting_overrides_the_declared_rate_and_keeps_its_burst() -> None:
    declared = {"inventory": None, "payment": RateLimit(5, burst=3), "shipping": RateLimit(20), "delivery": None}
    assert effective_limits(declared, "payment=8/s,shipping=off,inventory=2/s") == {
        "payment": RateLimit(8, burst=3), "inventory": RateLimit(2)}
    assert effective_limits(declared, "") == {"payment": RateLimit(5, burst=3), "shipping": RateLimit(20)}


def test_the_default_files_declare_no_limit_and_the_app_has_none() -> None:
    assert all(a.rate_limit is None for a in AGENTS)
    assert remote_rate_limits({"RemoteRateLimits": ""}) == {}


def test_settings_refuse_a_bad_limit_at_start() -> None:
    env = {"ServiceBusConnection": "x", "StateStorage": "x", "TokenKeys": "A" * 44,
           **{a.service_url_setting: "http://x" for a in AGENTS}, "RemoteRateLimits": "payment=fast"}
    with pytest.raises(InvalidSettingError) as caught:
        Settings.from_env(env)
    assert caught.value.name == "RemoteRateLimits" and "payment=fast" in str(caught.value)
    env["RemoteRateLimits"] = "payment=8/s"
    assert remote_rate_limits(Settings.from_env(env).values) == {"payment": RateLimit(8)}
    # the decisions' config has them too (the console's overview shows them)
    assert Config.from_settings(Settings.from_env(env)).rate_limits == {"payment": RateLimit(8)}


def _agents_file(tmp_path: Path, rate_limit: object) -> Path:
    agents = [{"name": "payment", "queueSetting": "PaymentQueue", "serviceUrlSetting": "PaymentServiceUrl",
               "rateLimit": rate_limit}]
    file = tmp_path / "agents.json"
    file.write_text(json.dumps({"agents": agents}))
    return file


def test_the_file_declares_a_limit(tmp_path: Path) -> None:
    (agent,) = load_agents(_agents_file(tmp_path, {"perSecond": 8, "burst": 2}))
    assert agent.rate_limit == RateLimit(8, burst=2)
    (agent,) = load_agents(_agents_file(tmp_path, {"perSecond": 2.5}))
    assert agent.rate_limit == RateLimit(2.5, burst=1)


@pytest.mark.parametrize(("rate_limit", "path"), [
    ({"perSecond": 0}, "agents[0].rateLimit.perSecond"),
    ({"perSecond": "8/s"}, "agents[0].rateLimit.perSecond"),
    ({"perSecond": 8, "burst": 0}, "agents[0].rateLimit.burst"),
    ({"perSecond": 8, "bursts": 2}, "agents[0].rateLimit.bursts"),
    ({"burst": 2}, "agents[0].rateLimit.perSecond"),
])
def test_a_bad_declaration_names_the_file_and_the_field(tmp_path: Path, rate_limit: object, path: str) -> None:
    with pytest.raises(CatalogError) as caught:
        load_agents(_agents_file(tmp_path, rate_limit))
    assert caught.value.path == path and caught.value.file.endswith("agents.json")
