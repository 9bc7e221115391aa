"""The declarations agree: shared/settings.py (every setting the app reads), the queue
declaration infra/servicebus-config.json, the Bicep app settings, queues and tables, and
local.settings.json.example. Nothing is declared that nothing reads.

Bicep is read as text (no compiler is needed); the JSON files are parsed. The agents are declared
once, in workflows/agents.json: every agent a workflow (workflows/*.yaml) names must have its queue,
its two settings, its Bicep app settings (a loop over that file) and its function.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from shared.core.workflows.catalog import AGENTS, AGENTS_BY_NAME
from shared.core.workflows.lanes import FAST_LANES, LANED_QUEUES, LANES
from shared.settings import (
    QUEUE_SETTINGS,
    REQUIRED_SETTINGS,
    SETTINGS,
    TABLE_SETTINGS,
    TOKEN_KEYS,
    parse_token_keys,
    webhook_target,
)
from tests.indexed import indexed_functions

from .conftest import (
    INFRA,
    LOCAL_SETTINGS_EXAMPLE,
    REPO_ROOT,
    agent_catalog,
    bicep_agent_loops,
    bicep_app_settings,
    bicep_files,
    bicep_lane_queue_settings,
    bicep_literal,
    bicep_string_array,
    bicep_text,
    config_queues,
    declared_queues,
    fast_lanes,
    strip_comments,
)

# Identity-based form of each connection kind: the endpoint key the app and host read.
ENDPOINT_KEY = {"ServiceBusConnection": "fullyQualifiedNamespace", "StateStorage": "tableServiceUri"}
CONNECTIONS = [s for s in SETTINGS if s.kind == "connection"]
VALUES = [s for s in SETTINGS if s.kind != "connection"]

# Settings the Functions host (not the app) reads, in their identity-based form.
HOST_SETTINGS = {
    "AzureWebJobsStorage__accountName",
    "AzureWebJobsStorage__credential",
    "AzureWebJobsStorage__clientId",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY",  # read by the worker and by shared/observability/telemetry.py
    "PYTHON_ENABLE_OPENTELEMETRY",  # read by the worker
    "PYTHON_THREADPOOL_THREAD_COUNT",  # the worker's invocation threads (README, "Priority lanes")
    "OTEL_TRACES_SAMPLER",  # the host's own spans (one request per invocation): docs/cost.md, "Telemetry"
    "OTEL_TRACES_SAMPLER_ARG",
}


def connection_forms() -> set[str]:
    return {f"{c.name}__{suffix}" for c in CONNECTIONS
            for suffix in (ENDPOINT_KEY[c.name], "credential", "clientId")}


def example_values() -> dict[str, str]:
    assert LOCAL_SETTINGS_EXAMPLE.exists(), "local.settings.json.example is missing"
    doc = json.loads(LOCAL_SETTINGS_EXAMPLE.read_text())
    values = doc["Values"]
    assert all(isinstance(v, str) for v in values.values()), "local.settings.json Values must be strings"
    return values


# --- shared/settings.py itself ----------------------------------------------------------------


def test_every_connection_has_a_known_identity_form() -> None:
    assert {c.name for c in CONNECTIONS} == set(ENDPOINT_KEY)


def test_settings_names_are_unique() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))


# --- Bicep app settings ------------------------------------------------------------------------


def test_bicep_sets_every_setting() -> None:
    bicep = bicep_app_settings()
    missing = [s.name for s in VALUES if s.name not in bicep]
    missing += sorted(connection_forms() - set(bicep))
    assert missing == [], f"settings of shared/settings.py missing from infra/modules/functionapp.bicep: {missing}"


def test_bicep_sets_nothing_that_nothing_reads() -> None:
    allowed = {s.name for s in VALUES} | connection_forms() | HOST_SETTINGS
    extra = sorted(set(bicep_app_settings()) - allowed)
    assert extra == [], f"Bicep app settings that neither the app nor the host reads: {extra}"


def test_bicep_connections_are_identity_based() -> None:
    bicep = bicep_app_settings()
    for conn in CONNECTIONS:
        assert conn.name not in bicep, f"{conn.name} must not be a connection string in Azure"
        assert bicep[f"{conn.name}__credential"] == "'managedidentity'"
        assert bicep[f"{conn.name}__clientId"] == "identityClientId"
    assert bicep["AzureWebJobsStorage__credential"] == "'managedidentity'"
    assert bicep["AzureWebJobsStorage__clientId"] == "identityClientId"
    assert "AzureWebJobsStorage" not in bicep
    assert bicep["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"] == "'ClientId=${identityClientId};Authorization=AAD'"


def test_bicep_exports_telemetry_once_by_identity() -> None:
    """The app configures Azure Monitor itself (shared/observability/telemetry.py), so the worker's own
    configuration is off: both would export everything twice. host.json speaks OpenTelemetry."""
    bicep = bicep_app_settings()
    assert bicep["PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY"] == "'false'"
    assert bicep["PYTHON_ENABLE_OPENTELEMETRY"] == "'true'"
    assert bicep["APPLICATIONINSIGHTS_CONNECTION_STRING"] == "appInsightsConnectionString"
    assert json.loads((INFRA.parent / "host.json").read_text())["telemetryMode"] == "OpenTelemetry"


def test_the_host_samples_its_own_spans_at_the_apps_ratio() -> None:
    """The host's request per invocation, at the ratio the app samples its orders at (one parameter);
    host.json's Application Insights sampling is not read in the OpenTelemetry mode, so none is set."""
    from shared.observability.sampling import DEFAULT_RATIO, RATIO_SETTING

    bicep = bicep_app_settings()
    assert bicep["OTEL_TRACES_SAMPLER"] == "'microsoft.fixed_percentage'"
    assert bicep["OTEL_TRACES_SAMPLER_ARG"] == bicep[RATIO_SETTING] == "telemetrySamplingRatio"
    params = dict(re.findall(r"^param (\w+) \w+ = (.+)$", bicep_text("main.bicep"), re.M))
    assert float(bicep_literal(params["telemetrySamplingRatio"])) == DEFAULT_RATIO
    assert [s.default for s in SETTINGS if s.name == RATIO_SETTING] == [str(DEFAULT_RATIO)]
    assert "applicationInsights" not in json.loads((INFRA.parent / "host.json").read_text())["logging"]


def test_bicep_queue_and_table_settings_match_their_defaults() -> None:
    bicep = bicep_app_settings()
    for spec in (*QUEUE_SETTINGS, *TABLE_SETTINGS):
        assert bicep_literal(bicep[spec.name]) == spec.default, (spec.name, bicep[spec.name])


def test_bicep_parameters_with_defaults_match_settings_py() -> None:
    """A Bicep default is the app's default (a deployment changes either only on purpose)."""
    main = bicep_text("main.bicep")
    bicep = bicep_app_settings()
    params = dict(re.findall(r"^param (\w+) \w+ = (.+)$", main, re.M))
    for spec in VALUES:
        m = re.fullmatch(r"(?:string\()?(\w+)\)?", bicep[spec.name])
        if not m or m.group(1) not in params:
            continue
        default = params[m.group(1)].strip()
        default = bicep_literal(default) if default.startswith("'") else default
        assert default == spec.default, (spec.name, default, spec.default)


def test_every_binding_expression_names_a_setting_bicep_sets() -> None:
    """A `%Name%` in a trigger (queue names, timer schedules such as %RetentionSchedule%) is
    resolved by the host from the app settings: it must be declared and set in Azure."""
    bicep = bicep_app_settings()
    declared = {s.name for s in VALUES}
    sources = [INFRA.parent / "function_app.py", *sorted((INFRA.parent / "functions").glob("*.py"))]
    used = {(path.name, name) for path in sources for name in re.findall(r"['\"]%(\w+)%['\"]", path.read_text())}
    assert used, "no %Setting% binding expression found in functions/"
    for source, name in sorted(used):
        assert name in declared, f"{source}: %{name}% is not a setting of shared/settings.py"
        assert name in bicep, f"{source}: %{name}% is not set by infra/modules/functionapp.bicep"


# --- Queues -------------------------------------------------------------------------------------


def test_every_queue_setting_names_a_declared_queue() -> None:
    queues = config_queues()
    for spec in QUEUE_SETTINGS:
        assert spec.default in queues, f"{spec.name}={spec.default!r} is not a queue of servicebus-config.json"
    values = [s.default for s in QUEUE_SETTINGS]
    assert len(values) == len(set(values)), "two queue settings name the same queue"


def test_every_declared_queue_is_read_by_a_setting() -> None:
    read = {s.default for s in QUEUE_SETTINGS}
    unread = sorted(set(config_queues()) - read)
    assert unread == [], f"queues of servicebus-config.json no setting reads: {unread}"


def test_every_agent_reads_a_queue_setting() -> None:
    queue_settings = {s.name for s in QUEUE_SETTINGS}
    service_urls = {s.name for s in VALUES if s.name.endswith("ServiceUrl")}
    for agent in AGENTS:
        assert agent.queue_setting in queue_settings
        assert agent.service_url_setting in service_urls
    assert {a.service_url_setting for a in AGENTS} == service_urls


# --- Agents (workflows/agents.json) and the workflows that name them ------------------------------


def workflow_agents() -> dict[str, set[str]]:
    """Agent name -> the workflow files (workflows/*.yaml, *.yml) with a step it serves."""
    files = sorted(p for p in (REPO_ROOT / "workflows").iterdir() if p.suffix in (".yaml", ".yml"))
    assert files, "no workflow file in workflows/"
    named: dict[str, set[str]] = {}
    for path in files:
        steps = yaml.safe_load(path.read_text())["steps"]
        for step in (b for s in steps for b in s.get("branches", [s])):  # a parallel step's branches
            if "agent" in step:  # a call (a wait or a delay has no agent)
                named.setdefault(step["agent"], set()).add(path.name)
    return named


def test_the_agents_json_bicep_reads_is_the_apps() -> None:
    assert [(a["name"], a["queueSetting"], a["serviceUrlSetting"]) for a in agent_catalog()] == \
        [(a.name, a.queue_setting, a.service_url_setting) for a in AGENTS]


def test_bicep_sets_every_agents_settings_in_a_loop_over_agents_json() -> None:
    """A new agent needs no Bicep edit: main.bicep loads workflows/agents.json and the Function App
    sets each agent's queue and service URL settings in loops over it, none written out."""
    main = strip_comments(bicep_text("main.bicep"))
    catalog = re.search(r"^var (\w+) = loadJsonContent\('\.\./workflows/agents\.json'\)$", main, re.M)
    assert catalog, "main.bicep does not load workflows/agents.json"
    assert re.search(rf"^var agents = {catalog.group(1)}\.agents$", main, re.M)
    assert re.search(r"^\s+agents: agents$", main, re.M), "main.bicep does not pass the agents to functionapp.bicep"
    functionapp = strip_comments(bicep_text("modules/functionapp.bicep"))
    assert re.search(r"^param agents array$", functionapp, re.M)
    fields = sorted(field for field, _ in bicep_agent_loops().values())
    assert fields == ["queueSetting", "serviceUrlSetting"], bicep_agent_loops()
    for agent in AGENTS:
        for literal in (agent.queue_setting, agent.service_url_setting, agent.default_queue):
            assert f"'{literal}'" not in functionapp, f"functionapp.bicep writes {literal} out: loop over the agents"


def test_every_agent_of_every_workflow_has_a_queue_settings_bicep_and_a_function() -> None:
    triggers = {name: fn["bindings"][0] for name, fn in indexed_functions().items()}
    queues = config_queues()
    settings = {s.name: s for s in SETTINGS}
    bicep = bicep_app_settings()
    named = workflow_agents()
    assert {"inventory", "payment", "shipping", "delivery"} <= set(named), named
    for name, files in sorted(named.items()):
        assert name in AGENTS_BY_NAME, f"{sorted(files)}: agent {name!r} is not declared in workflows/agents.json"
        agent = AGENTS_BY_NAME[name]
        queue = settings[agent.queue_setting]
        assert (queue.kind, queue.default) == ("queue", agent.default_queue), agent
        assert agent.default_queue in queues, f"{name}: no queue {agent.default_queue} in servicebus-config.json"
        assert settings[agent.service_url_setting].required, agent
        assert bicep_literal(bicep[agent.queue_setting]) == agent.default_queue, agent
        assert bicep[agent.service_url_setting] == f"serviceUrls['{agent.service_url_setting}']", agent
        function = f"agent_{name.replace('-', '_')}"
        assert function in triggers, f"{name}: no function {function}"
        assert (triggers[function]["type"], triggers[function]["queueName"]) == \
            ("serviceBusTrigger", f"%{agent.queue_setting}%"), triggers[function]


def test_bicep_deploys_exactly_the_declared_queues() -> None:
    main = bicep_text("main.bicep")
    assert re.search(r"= loadJsonContent\('servicebus-config\.json'\)", main)
    assert "Namespaces[0].Queues" in main
    sb = strip_comments(bicep_text("modules/servicebus.bicep"))
    # The queues are a loop over that declaration, not a second list.
    assert re.search(r"resource \w+ 'Microsoft\.ServiceBus/namespaces/queues@[^']+' = \[for q in queues:", sb)
    # the declared queues, and the priority lanes' copies derived from them (next tests)
    assert "queues: concat(queues, laneQueues)" in main


# --- Priority lanes (workflows/lanes.json) ---------------------------------------------------------

# main.bicep's loop over (fast lanes x work queues), pinned: the test evaluates this exact text.
_LANE_QUEUES = """var laneCatalog = loadJsonContent('../workflows/lanes.json')
var fastLanes = skip(laneCatalog.lanes, 1)
var agentQueueNames = [for agent in agents: 'agent-${agent.name}']
var workQueueNames = concat([
  'scheduler'
  'replies'
], agentQueueNames)
var workQueues = filter(queues, q => contains(workQueueNames, q.Name))
var workQueueCount = length(workQueues)
var laneQueues = [for i in range(0, length(fastLanes) * workQueueCount): {
  Name: '${workQueues[i % workQueueCount].Name}-${fastLanes[i / workQueueCount].name}'
  Properties: workQueues[i % workQueueCount].Properties
}]"""


def bicep_lane_queues() -> dict[str, dict]:
    """main.bicep's laneQueues, evaluated over servicebus-config.json and lanes.json."""
    main = strip_comments(bicep_text("main.bicep"))
    assert _LANE_QUEUES in main, "main.bicep's lane queues are not the loop the tests read"
    work_names = ["scheduler", "replies", *(f"agent-{a['name']}" for a in agent_catalog())]
    work = [(name, props) for name, props in declared_queues().items() if name in work_names]  # filter keeps order
    return {f"{name}-{lane}": props for lane in fast_lanes() for name, props in work}


def test_the_lanes_are_derived_not_declared_twice() -> None:
    """servicebus-config.json declares no lane copy: the emulator's config and Bicep derive them."""
    lane_names = {lane.queue(q) for lane in FAST_LANES for _, q in LANED_QUEUES}
    assert lane_names and not lane_names & set(declared_queues()), sorted(lane_names & set(declared_queues()))
    assert set(config_queues()) == set(declared_queues()) | lane_names


def test_bicep_deploys_the_same_lane_queues_as_the_emulator_gets() -> None:
    derived = {name: props for name, props in config_queues().items() if name not in declared_queues()}
    assert bicep_lane_queues() == derived
    assert derived["scheduler-high"] == declared_queues()["scheduler"]
    assert derived["agent-payment-high"] == declared_queues()["agent-payment"]


def test_bicep_sets_the_same_lane_queue_settings_as_the_app_declares() -> None:
    defaults = {s.name: s.default for s in QUEUE_SETTINGS}
    app = {lane.setting(setting): defaults[lane.setting(setting)] for lane in FAST_LANES for setting, _ in LANED_QUEUES}
    assert app == bicep_lane_queue_settings() != {}
    assert app["SchedulerQueueHigh"] == "scheduler-high" and app["InventoryQueueHigh"] == "agent-inventory-high"
    main = strip_comments(bicep_text("main.bicep"))
    assert re.search(r"^\s+fastLanes: fastLanes$", main, re.M), "main.bicep does not pass the lanes to the app"
    assert re.search(r"^param fastLanes array$", strip_comments(bicep_text("modules/functionapp.bicep")), re.M)


def test_the_lanes_json_bicep_reads_is_the_apps() -> None:
    assert [lane.name for lane in LANES[1:]] == fast_lanes()
    assert [lane.setting(s) for lane in LANES for s, _ in LANED_QUEUES] == [
        s.name for s in QUEUE_SETTINGS if s.name in {lane.setting(b) for lane in LANES for b, _ in LANED_QUEUES}]


def test_every_lane_queue_has_a_trigger_on_its_setting() -> None:
    triggers = {fn["bindings"][0].get("queueName") for fn in indexed_functions().values()}
    for lane in LANES:
        for setting, _ in LANED_QUEUES:
            assert f"%{lane.setting(setting)}%" in triggers, (lane.name, setting)


def test_the_local_emulator_serves_the_lane_queues(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """local/queueconfig.py's file (what the local stack gives the emulator), read by the emulator's loader."""
    from local.queueconfig import QUEUE_CONFIG, write_derived
    from local.servicebus.config import load_config

    path = write_derived(QUEUE_CONFIG, tmp_path / "servicebus-config.json")
    served = {q.name for q in load_config(path).queues}
    assert served == set(config_queues()), sorted(served ^ set(config_queues()))


def test_bicep_maps_every_queue_property() -> None:
    sb = strip_comments(bicep_text("modules/servicebus.bicep"))
    mapped = dict((prop, target) for target, prop in re.findall(r"^\s*(\w+): .*?\bq\.Properties\.(\w+)", sb, re.M))
    declared = {key for props in config_queues().values() for key in props}
    assert declared <= set(mapped), f"queue properties Bicep does not map: {sorted(declared - set(mapped))}"
    for prop, target in mapped.items():
        assert target.lower() == prop.lower(), f"{prop} is mapped to {target}"
    for required in ("MaxDeliveryCount", "LockDuration", "DefaultMessageTimeToLive", "RequiresDuplicateDetection",
                     "DuplicateDetectionHistoryTimeWindow", "RequiresSession", "DeadLetteringOnMessageExpiration"):
        assert required in mapped


# --- Tables -------------------------------------------------------------------------------------


def test_bicep_creates_exactly_the_tables_the_settings_name() -> None:
    created = bicep_string_array(bicep_text("main.bicep"), "tableNames")
    assert sorted(created) == sorted(s.default for s in TABLE_SETTINGS)
    assert len(created) == len(set(created))
    assert "tableNames: tableNames" in bicep_text("main.bicep")
    assert re.search(r"\[for tableName in tableNames:", bicep_text("modules/storage.bicep"))


# --- local.settings.json.example ----------------------------------------------------------------


def test_local_settings_example_has_every_setting() -> None:
    values = example_values()
    missing = [s.name for s in SETTINGS if s.name not in values]
    assert missing == [], f"settings missing from local.settings.json.example: {missing}"


def test_local_settings_example_connections_are_connection_strings() -> None:
    values = example_values()
    for conn in CONNECTIONS:
        value = values[conn.name]
        assert re.search(r"(Endpoint|AccountName)=", value) and ";" in value, (conn.name, value)


def test_local_settings_example_values_match_the_declarations() -> None:
    values = example_values()
    queues = config_queues()
    for spec in QUEUE_SETTINGS:
        assert values[spec.name] in queues, (spec.name, values[spec.name])
        assert values[spec.name] == spec.default, spec.name
    for spec in TABLE_SETTINGS:
        assert values[spec.name] == spec.default, spec.name


def test_required_settings_are_required_in_bicep_and_set_locally() -> None:
    """No default in the app, none in Bicep (a deployment must give one: the serviceUrls parameter,
    keyed by setting name; the token keys: Key Vault); the example gives the local one."""
    assert {s.name for s in REQUIRED_SETTINGS} == {"InventoryServiceUrl", "PaymentServiceUrl", "ShippingServiceUrl",
                                                   "DeliveryServiceUrl", "TokenKeys"}
    main = bicep_text("main.bicep")
    bicep = bicep_app_settings()
    values = example_values()
    given = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]["serviceUrls"]["value"]
    assert re.search(r"^param serviceUrls object$", main, re.M)
    urls = [s for s in REQUIRED_SETTINGS if s.kind == "value"]
    for spec in urls:
        assert bicep[spec.name] == f"serviceUrls['{spec.name}']", (spec.name, bicep[spec.name])
        assert given[spec.name].startswith("https://"), (spec.name, given.get(spec.name))
        assert values[spec.name].startswith("http://127.0.0.1:"), (spec.name, values[spec.name])
    assert set(given) == {s.name for s in urls}, "main.parameters.json serviceUrls: one per agent"


def test_the_secret_settings_are_key_vault_references_in_bicep_and_valid_locally() -> None:
    """A secret setting (TokenKeys) has no value in any template or parameter: Bicep sets it to a
    Key Vault reference; the example's local value is one the app accepts (and no deployment gets)."""
    secrets = [s for s in SETTINGS if s.kind == "secret"]
    assert [s.name for s in secrets] == [TOKEN_KEYS, "WebhookSecret"]
    bicep = bicep_app_settings()
    values = example_values()
    uris = {TOKEN_KEYS: "tokenKeysSecretUri", "WebhookSecret": "webhookSecretUri"}
    for spec in secrets:
        assert bicep[spec.name] == f"'@Microsoft.KeyVault(SecretUri=${{{uris[spec.name]}}})'", bicep[spec.name]
        assert spec.name not in (INFRA / "main.parameters.json").read_text()
    keys = parse_token_keys(values[TOKEN_KEYS])
    assert keys.current == b"local only: not a key for Azure!" and keys.previous is None
    # No webhook locally by default: the secret is not read (a Key Vault reference to a secret never
    # set does no harm in Azure either, while WebhookUrl is empty).
    assert values["WebhookUrl"] == "" and webhook_target(values) is None


def test_local_settings_example_has_nothing_that_nothing_reads() -> None:
    values = example_values()
    declared = {s.name for s in SETTINGS}
    extra = sorted(n for n in values if n not in declared and not n.startswith(("AzureWebJobs", "FUNCTIONS_")))
    assert extra == [], f"local.settings.json.example settings nobody reads: {extra}"


# --- Bicep hygiene --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.name)
def test_no_key_and_no_connection_string(path) -> None:
    text = path.read_text()
    for forbidden in ("listKeys", "listConnectionStrings", "listkeys", "SharedAccessKey", "AccountKey",
                      "primaryConnectionString", "InstrumentationKey", "@secure()"):
        assert forbidden not in text, f"{path.name} contains {forbidden}"
    assert not re.search(r"name: '\w+'\s*\n\s*value: .*(ConnectionString|connectionString)\b(?!')",
                         text.replace("appInsightsConnectionString", "")), path.name


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.name)
def test_every_parameter_is_used(path) -> None:
    text = strip_comments(path.read_text())
    for name in re.findall(r"^param (\w+) ", text, re.M):
        uses = len(re.findall(rf"\b{name}\b", text))
        assert uses >= 2, f"{path.name}: param {name} is declared but never used"


def test_parameters_file_matches_main_bicep() -> None:
    main = bicep_text("main.bicep")
    declared = dict(re.findall(r"^param (\w+) (\w+)(?: = .*)?$", main, re.M))
    required = {name for name in declared if not re.search(rf"^param {name} \w+ = ", main, re.M)}
    given = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert set(given) <= set(declared), f"parameters main.bicep does not declare: {set(given) - set(declared)}"
    assert required <= set(given), f"required parameters missing from main.parameters.json: {required - set(given)}"
    py_type = {"string": str, "int": int, "bool": bool, "object": dict, "array": list}
    for name, entry in given.items():
        assert isinstance(entry["value"], py_type[declared[name]]), name


def test_one_lanes_service_bus_invocations_never_fill_the_worker_threads() -> None:
    """maxConcurrentCalls (host.json, per function and instance) x one lane's Service Bus functions
    < the worker's threads (set in Bicep; the local host's default is the same 32): a saturated
    normal lane leaves threads free, so a high-priority message waits in no invocation queue."""
    host = json.loads((INFRA.parent / "host.json").read_text())
    calls = host["extensions"]["serviceBus"]["maxConcurrentCalls"]
    threads = int(bicep_literal(bicep_app_settings()["PYTHON_THREADPOOL_THREAD_COUNT"]) or 0)
    per_lane = sum(1 for fn in indexed_functions().values() if fn["bindings"][0]["type"] == "serviceBusTrigger") \
        // len(LANES)
    assert per_lane == len(LANED_QUEUES) and threads == 32
    assert calls * per_lane < threads, (calls, per_lane, threads)


def test_deploy_docs_list_every_setting() -> None:
    operating = (INFRA.parent / "docs" / "operating.md").read_text()
    # the table of the "### Settings" section (other tables of the page have backticked first columns too)
    docs = operating[operating.index("\n### Settings\n"):]
    docs = docs[:docs.index("\n#", 1)]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", docs, re.M))
    assert set(rows) == {s.name for s in SETTINGS}, "docs/operating.md's settings table is out of date"
    for spec in VALUES:
        expected = "(required)" if spec.required else f"`{spec.default}`" if spec.default else "(empty)"
        assert rows[spec.name].strip() == expected, (spec.name, rows[spec.name])
