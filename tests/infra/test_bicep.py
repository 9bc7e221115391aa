"""What issue 4 asks of the templates, read from the Bicep text (no compiler is reachable)."""

from __future__ import annotations

import re

import pytest

from .conftest import bicep_files, bicep_text, strip_comments


def resource_blocks(text: str, type_prefix: str) -> dict[str, str]:
    """symbolic name -> body of each resource of that type (top-level, `}` at column 0)."""
    blocks = {}
    head = rf"^resource (\w+) '{re.escape(type_prefix)}@[^']+' (?:existing )?= (?:\[for [^\n]*)?"
    for m in re.finditer(head + r"\{\n(.*?)^\}", text, re.S | re.M):
        blocks[m.group(1)] = m.group(2)
    return blocks


def test_only_inline_modules() -> None:
    for path in bicep_files():
        for target in re.findall(r"^module \w+ '([^']+)'", path.read_text(), re.M):
            assert re.fullmatch(r"modules/\w+\.bicep", target), f"{path.name}: module {target} is not inline"
            assert (path.parent / target).exists()
    modules = {p.name for p in bicep_files() if p.parent.name == "modules"}
    assert modules == {"identity.bicep", "storage.bicep", "servicebus.bicep", "monitoring.bicep",
                       "functionapp.bicep", "roles.bicep", "keyvault.bicep"}


def test_function_app_is_flex_consumption_python_311() -> None:
    text = strip_comments(bicep_text("modules/functionapp.bicep"))
    plan = resource_blocks(text, "Microsoft.Web/serverfarms")["plan"]
    assert "name: 'FC1'" in plan and "tier: 'FlexConsumption'" in plan
    app = resource_blocks(text, "Microsoft.Web/sites")["app"]
    assert "serverFarmId: plan.id" in app
    assert "httpsOnly: true" in app
    assert re.search(r"functionAppConfig: \{.*deployment: \{.*type: 'blobContainer'.*"
                     r"authentication: \{\s*type: 'UserAssignedIdentity'\s*userAssignedIdentityResourceId: identityId",
                     app, re.S)
    assert re.search(r"runtime: \{\s*name: 'python'\s*version: '3\.11'\s*\}", app)
    assert re.search(r"scaleAndConcurrency: \{\s*maximumInstanceCount: \w+\s*instanceMemoryMB: \w+", app)
    assert re.search(r"type: 'UserAssigned'\s*userAssignedIdentities: \{\s*'\$\{identityId\}': \{\}", app)
    # Flex Consumption rejects these as app settings (they live in functionAppConfig).
    assert "FUNCTIONS_WORKER_RUNTIME" not in text and "FUNCTIONS_EXTENSION_VERSION" not in text


def test_storage_account_is_entra_only() -> None:
    storage = resource_blocks(strip_comments(bicep_text("modules/storage.bicep")),
                              "Microsoft.Storage/storageAccounts")["storage"]
    for setting in ("allowSharedKeyAccess: false", "allowBlobPublicAccess: false", "minimumTlsVersion: 'TLS1_2'",
                    "supportsHttpsTrafficOnly: true"):
        assert setting in storage


def test_service_bus_is_standard_without_local_auth() -> None:
    ns = resource_blocks(strip_comments(bicep_text("modules/servicebus.bicep")),
                         "Microsoft.ServiceBus/namespaces")["namespace"]
    assert "name: 'Standard'" in ns
    assert "disableLocalAuth: true" in ns
    assert "minimumTlsVersion: '1.2'" in ns


def test_monitoring_has_entra_only_app_insights_and_both_alerts() -> None:
    text = bicep_text("modules/monitoring.bicep")
    blocks = resource_blocks(text, "Microsoft.Insights/components")
    assert "DisableLocalAuth: true" in blocks["appInsights"]
    assert "WorkspaceResourceId: workspace.id" in blocks["appInsights"]
    metric = resource_blocks(text, "Microsoft.Insights/metricAlerts")["deadLetterAlert"]
    assert "metricName: 'DeadletteredMessages'" in metric
    assert "operator: 'GreaterThan'" in metric and "threshold: 0" in metric
    assert "serviceBusNamespaceId" in metric and "actionGroup.id" in metric
    log = resource_blocks(text, "Microsoft.Insights/scheduledQueryRules")["supervisorAlert"]
    assert "query: supervisorAlertQuery" in log and "appInsights.id" in log and "actionGroup.id" in log
    query = re.search(r"var supervisorAlertQuery = '''(.*?)'''", text, re.S).group(1)
    assert query.strip().startswith("traces")
    for field in ("orderId", "step", "reason", "failureCount"):
        assert f"alert.{field}" in query
    assert 'tostring(alert.event) == "alert"' in query and "severityLevel >= 3" in query
    group = resource_blocks(text, "Microsoft.Insights/actionGroups")["actionGroup"]
    assert "emailAddress: alertEmail" in group


ROLES = {
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "namespace",  # Azure Service Bus Data Sender
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "namespace",  # Azure Service Bus Data Receiver
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "storage",  # Storage Table Data Contributor
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "deploymentContainer",  # Storage Blob Data Owner
    "3913510d-42f4-4e42-8a64-420c390055eb": "appInsights",  # Monitoring Metrics Publisher
    "4633458b-17de-408a-b874-0445c86b69e6": "vault",  # Key Vault Secrets User (read TokenKeys)
}


def test_role_assignments_are_least_privilege_and_named_by_guid() -> None:
    text = strip_comments(bicep_text("modules/roles.bicep"))
    role_vars = dict((guid, var) for var, guid in re.findall(
        r"^var (\w+) = subscriptionResourceId\('Microsoft\.Authorization/roleDefinitions', '([0-9a-f-]{36})'\)",
        text, re.M))
    assert set(role_vars) == set(ROLES), "only the six least-privilege roles"
    assignments = resource_blocks(text, "Microsoft.Authorization/roleAssignments")
    scopes_by_role: dict[str, set[str]] = {}
    for name, body in assignments.items():
        m = re.search(r"name: guid\((\w+(?:\[i\])?)\.id, principalId, (\w+)\)", body)
        assert m, f"{name} is not named guid(scope.id, principalId, roleDefinitionId)"
        scope, role = m.groups()
        assert f"scope: {scope}\n" in body, f"{name}: named after {scope} but scoped elsewhere"
        assert f"roleDefinitionId: {role}\n" in body and "principalId: principalId" in body
        scopes_by_role.setdefault(role, set()).add(scope)
    for guid, scope in ROLES.items():
        assert scope in scopes_by_role[role_vars[guid]], (guid, scopes_by_role[role_vars[guid]])
    # Blob Data Owner never on the whole account: the deployment and host containers only.
    assert scopes_by_role[role_vars["b7e6dc6d-f1e8-4753-8033-0f276bb0955b"]] == {"deploymentContainer",
                                                                                   "hostContainers[i]"}


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.name)
def test_no_registry_modules(path) -> None:
    assert not re.search(r"'(br|ts)[:/]", path.read_text())


def test_token_keys_come_from_key_vault_by_the_apps_identity() -> None:
    """TokenKeys is a Key Vault reference to a versionless secret URI of the vault main.bicep
    creates (RBAC only, soft delete and purge protection on), resolved as the app's identity,
    which may read that vault's secrets and nothing more; no template holds the key."""
    vault = resource_blocks(strip_comments(bicep_text("modules/keyvault.bicep")), "Microsoft.KeyVault/vaults")["vault"]
    for setting in ("enableRbacAuthorization: true", "enableSoftDelete: true", "enablePurgeProtection: true",
                    "enabledForTemplateDeployment: false"):
        assert setting in vault
    assert "accessPolicies" not in vault and "secrets" not in vault
    for path in bicep_files():
        assert "Microsoft.KeyVault/vaults/secrets" not in path.read_text(), f"{path.name} holds a secret value"
    functionapp = strip_comments(bicep_text("modules/functionapp.bicep"))
    assert "keyVaultReferenceIdentity: identityId" in resource_blocks(functionapp, "Microsoft.Web/sites")["app"]
    main = strip_comments(bicep_text("main.bicep"))
    assert "tokenKeysSecretUri: '${keyVault.outputs.vaultUri}secrets/${tokenKeysSecretName}'" in main
    assert re.search(r"^var tokenKeysSecretName = 'TokenKeys'$", main, re.M)
    assert "keyVaultName: keyVault.outputs.name" in main


def test_the_webhook_secret_comes_from_the_same_key_vault() -> None:
    """WebhookSecret is a Key Vault reference to the versionless secret WebhookSecret of the same vault
    (an operator sets it, as TokenKeys); WebhookUrl is a parameter, empty by default: no webhooks."""
    main = strip_comments(bicep_text("main.bicep"))
    assert "webhookSecretUri: '${keyVault.outputs.vaultUri}secrets/${webhookSecretName}'" in main
    assert re.search(r"^var webhookSecretName = 'WebhookSecret'$", main, re.M)
    assert re.search(r"^param webhookUrl string = ''$", main, re.M)
    functionapp = strip_comments(bicep_text("modules/functionapp.bicep"))
    assert "value: '@Microsoft.KeyVault(SecretUri=${webhookSecretUri})'" in functionapp
