// The Function App on the Flex Consumption plan (FC1), Python 3.11, deployed from a blob
// container, running as the user-assigned identity. App settings: identity-based connections
// only (no connection string, no key), plus every non-connection setting of shared/settings.py;
// the one secret, TokenKeys, is a Key Vault reference the platform resolves with that identity.

@description('Function App name (also its default host name).')
param name string

@description('Flex Consumption plan name.')
param planName string

@description('Azure region.')
param location string

@description('Resource id of the user-assigned identity the app runs as.')
param identityId string

@description('Client id of that identity (selects it for every identity-based connection).')
param identityClientId string

@description('Storage account name (AzureWebJobsStorage, deployment container, tables).')
param storageAccountName string

@description('Primary blob endpoint of the storage account, ending in /.')
param blobEndpoint string

@description('Primary table endpoint of the storage account (StateStorage__tableServiceUri).')
param tableEndpoint string

@description('Blob container the plan deploys the app package from.')
param deploymentContainerName string

@description('Service Bus namespace host name, e.g. NAME.servicebus.windows.net.')
param serviceBusFullyQualifiedNamespace string

@description('Application Insights connection string (ingestion endpoint; not a key).')
param appInsightsConnectionString string

@description('URI of the TokenKeys secret in Key Vault, without a version (the app follows its latest version).')
param tokenKeysSecretUri string

@description('URI of the WebhookSecret secret in Key Vault, without a version. Read only when webhookUrl is set.')
param webhookSecretUri string

@description('WebhookUrl: the https URL told when an order ends (Standard Webhooks). Empty: no webhooks.')
param webhookUrl string = ''

@description('WebhookRetrySchedule: the delay after each failed try of a webhook.')
param webhookRetrySchedule string = '5s,5m,30m,2h,5h,10h,10h'

@description('The agents of workflows/agents.json: name, queueSetting, serviceUrlSetting.')
param agents array

@description('The priority lanes of workflows/lanes.json but the first (which uses the work queues as they are).')
param fastLanes array

@description('Base URL of each agent\'s remote service, path prefix included, keyed by its serviceUrlSetting.')
param serviceUrls object

@description('SupervisorSchedule: NCRONTAB (six fields, seconds first) of the Supervisor timer.')
param supervisorSchedule string

@description('MaxFailureCount: FailureCount at which a step goes to Error.')
param maxFailureCount int

@description('BackoffThreshold: FailureCount after which the Supervisor delays the redrive.')
param backoffThreshold int

@description('BackoffBaseSeconds: first redrive delay past the threshold; doubles each time.')
param backoffBaseSeconds int

@description('UnclaimedGraceSeconds: age after which an unclaimed Pending order is rescheduled.')
param unclaimedGraceSeconds int

@description('StepTimeoutSeconds: if not empty, overrides every step timeout (tests only).')
param stepTimeoutSeconds string

@description('MaxRequestBytes: largest accepted order body.')
param maxRequestBytes int

@description('RetentionDays: days a finished order and its history are kept before they are purged.')
@minValue(1)
param retentionDays int

@description('RetentionSchedule: NCRONTAB (six fields, seconds first) of the retention purge timer.')
param retentionSchedule string

@description('TelemetrySamplingRatio: share of orders whose telemetry is exported (the host samples its own spans at the same ratio).')
param telemetrySamplingRatio string

@description('OperatorAuth: key (the master key) or appService (App Service authentication) guards the operator routes.')
param operatorAuth string

@description('OperatorRole: in the appService mode, if set, the role an operator must have.')
param operatorRole string

@description('ViewerRole: in the appService mode, if set, a role that may only read.')
param viewerRole string

@description('Most instances the plan scales out to.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int

@description('Memory of each instance (MB).')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int

param tags object = {}

// Each agent's settings, one loop per kind over workflows/agents.json: its request queue (the
// queue agent-NAME of infra/servicebus-config.json) and its remote service's base URL.
var agentQueueSettings = [for agent in agents: {
  name: agent.queueSetting
  value: 'agent-${agent.name}'
}]

// Each fast priority lane's copy of every work-queue setting (shared/core/workflows/lanes.py): SETTING + Lane
// (SchedulerQueueHigh) naming QUEUE-lane (scheduler-high). One loop over lanes x work queues:
// i / count is the lane, i % count the work queue.
var agentWorkQueues = [for agent in agents: {
  setting: agent.queueSetting
  queue: 'agent-${agent.name}'
}]
var workQueues = concat([
  {
    setting: 'SchedulerQueue'
    queue: 'scheduler'
  }
  {
    setting: 'RepliesQueue'
    queue: 'replies'
  }
], agentWorkQueues)
var workQueueCount = length(workQueues)
var laneQueueSettings = [for i in range(0, length(fastLanes) * workQueueCount): {
  name: '${workQueues[i % workQueueCount].setting}${toUpper(take(fastLanes[i / workQueueCount].name, 1))}${skip(fastLanes[i / workQueueCount].name, 1)}'
  value: '${workQueues[i % workQueueCount].queue}-${fastLanes[i / workQueueCount].name}'
}]

var agentServiceUrlSettings = [for agent in agents: {
  name: agent.serviceUrlSetting
  value: serviceUrls[agent.serviceUrlSetting]
}]

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225: Zone-redundant Flex Consumption exists only in some regions; set zoneRedundant: true where the region offers it.
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource app 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_222: The order API is a public HTTP API by design; each call needs a function key (authLevel FUNCTION), the operator endpoints the master key (authLevel ADMIN).
  // checkov:skip=CKV_AZURE_17: Callers authenticate with function keys over TLS; they hold no client certificates.
  // checkov:skip=CKV_AZURE_212: Flex Consumption scales instances on demand (numberOfWorkers does not apply); every instance can take over.
  // checkov:skip=CKV_AZURE_213: Flex Consumption does not support the App Service health check; the platform replaces unhealthy instances.
  name: name
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    // Key Vault references (TokenKeys) are resolved as the app's user-assigned identity.
    keyVaultReferenceIdentity: identityId
    httpsOnly: true
    clientCertEnabled: false
    publicNetworkAccess: 'Enabled'
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobEndpoint}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      appSettings: concat([
        // Host storage, by identity.
        {
          name: 'AzureWebJobsStorage__accountName'
          value: storageAccountName
        }
        {
          name: 'AzureWebJobsStorage__credential'
          value: 'managedidentity'
        }
        {
          name: 'AzureWebJobsStorage__clientId'
          value: identityClientId
        }
        // Telemetry, by identity (local auth is off on Application Insights).
        {
          name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
          value: appInsightsConnectionString
        }
        {
          name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
          value: 'ClientId=${identityClientId};Authorization=AAD'
        }
        // OpenTelemetry (host.json telemetryMode OpenTelemetry): the app calls configure_azure_monitor()
        // itself (shared/observability/telemetry.py), so the worker must not too, or everything is exported twice.
        // The exporter authenticates with the identity of APPLICATIONINSIGHTS_AUTHENTICATION_STRING.
        {
          name: 'PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY'
          value: 'false'
        }
        // The worker tells the host that the app exports its own telemetry (the capability
        // WorkerOpenTelemetryEnabled): the host then exports none of the Function.* log categories, so
        // the app's log lines go out once (not again as Function.<name>.User) and the host's Executing,
        // Executed and Trigger Details lines (3 per invocation) not at all. docs/cost.md, Telemetry.
        {
          name: 'PYTHON_ENABLE_OPENTELEMETRY'
          value: 'true'
        }
        // Sampling: the app's by order (shared/observability/sampling.py) and the host's own request
        // per invocation at the same ratio (host.json's samplingSettings are not read in the
        // OpenTelemetry mode). The host's is by its own trace ids, not by order.
        {
          name: 'TelemetrySamplingRatio'
          value: telemetrySamplingRatio
        }
        {
          name: 'OTEL_TRACES_SAMPLER'
          value: 'microsoft.fixed_percentage'
        }
        {
          name: 'OTEL_TRACES_SAMPLER_ARG'
          value: telemetrySamplingRatio
        }
        // The worker's invocation threads, shared by every function of an instance. host.json's
        // maxConcurrentCalls (4, per Service Bus function) x one lane's 6 Service Bus functions (24)
        // stays below it, so a high-priority lane's message never waits for a thread behind the
        // normal lane's: their backlog waits in the broker (README, "Priority lanes").
        {
          name: 'PYTHON_THREADPOOL_THREAD_COUNT'
          value: '32'
        }
        // Connection ServiceBusConnection, by identity.
        {
          name: 'ServiceBusConnection__fullyQualifiedNamespace'
          value: serviceBusFullyQualifiedNamespace
        }
        {
          name: 'ServiceBusConnection__credential'
          value: 'managedidentity'
        }
        {
          name: 'ServiceBusConnection__clientId'
          value: identityClientId
        }
        // Connection StateStorage, by identity.
        {
          name: 'StateStorage__tableServiceUri'
          value: tableEndpoint
        }
        {
          name: 'StateStorage__credential'
          value: 'managedidentity'
        }
        {
          name: 'StateStorage__clientId'
          value: identityClientId
        }
        // Queues: names declared in infra/servicebus-config.json (the agents' queues: below).
        {
          name: 'SchedulerQueue'
          value: 'scheduler'
        }
        {
          name: 'RepliesQueue'
          value: 'replies'
        }
        {
          name: 'AlertsQueue'
          value: 'alerts'
        }
        {
          name: 'StatusQueue'
          value: 'order-status'
        }
        {
          name: 'WebhooksQueue'
          value: 'webhooks'
        }
        // Tables: created by storage.bicep (main.bicep tableNames).
        {
          name: 'StateTable'
          value: 'orders'
        }
        {
          name: 'DeadlineTable'
          value: 'deadlines'
        }
        {
          name: 'OrderIndexTable'
          value: 'orderindex'
        }
        // Workflow tuning.
        {
          name: 'SupervisorSchedule'
          value: supervisorSchedule
        }
        {
          name: 'MaxFailureCount'
          value: string(maxFailureCount)
        }
        {
          name: 'BackoffThreshold'
          value: string(backoffThreshold)
        }
        {
          name: 'BackoffBaseSeconds'
          value: string(backoffBaseSeconds)
        }
        {
          name: 'UnclaimedGraceSeconds'
          value: string(unclaimedGraceSeconds)
        }
        {
          name: 'StepTimeoutSeconds'
          value: stepTimeoutSeconds
        }
        {
          name: 'MaxRequestBytes'
          value: string(maxRequestBytes)
        }
        // Retention of finished orders (the retention purge timer).
        {
          name: 'RetentionDays'
          value: string(retentionDays)
        }
        {
          name: 'RetentionSchedule'
          value: retentionSchedule
        }
        // The circuit breaker per remote (shared/breaker): its defaults, fixed here until they are tuned.
        {
          name: 'BreakerFailureThreshold'
          value: '5'
        }
        {
          name: 'BreakerWindowSeconds'
          value: '10'
        }
        {
          name: 'BreakerCoolDownSeconds'
          value: '5'
        }
        {
          name: 'BreakerProbeLeaseSeconds'
          value: '10'
        }
        {
          name: 'BreakerMaxWaitSeconds'
          value: '300'
        }
        {
          name: 'BreakerCacheSeconds'
          value: '1'
        }
        // Calls per second per remote over workflows/agents.json's rateLimit (shared/core/ratelimit):
        // empty, the declared limits (none by default). E.g. 'payment=8/s,shipping=20/s'.
        {
          name: 'RemoteRateLimits'
          value: ''
        }
        // Orders of one customer in flight at most (shared/core/room.py); 0: no cap. The others wait,
        // accepted, and start in submission order when one of the customer's orders ends.
        {
          name: 'CustomerMaxInFlight'
          value: '0'
        }
        // A bulk operation's pace: orders acted on per Supervisor tick (shared/runtime/bulk.py).
        {
          name: 'BulkOrdersPerTick'
          value: '100'
        }
        {
          name: 'BulkMaxInFlight'
          value: '5'
        }
        // The workflow files, shipped in the package (workflows/*.yaml).
        {
          name: 'WorkflowsPath'
          value: 'workflows'
        }
        // Who may use the operator routes and the console (shared/api/auth.py).
        {
          name: 'OperatorAuth'
          value: operatorAuth
        }
        {
          name: 'OperatorRole'
          value: operatorRole
        }
        {
          name: 'ViewerRole'
          value: viewerRole
        }
        // The token MAC keys (shared/settings.py TokenKeys), from Key Vault: never in a template.
        {
          name: 'TokenKeys'
          value: '@Microsoft.KeyVault(SecretUri=${tokenKeysSecretUri})'
        }
        // Webhooks when an order ends (shared/core/webhooks.py): the URL, and its signing secret from Key
        // Vault (an unresolved reference does no harm while WebhookUrl is empty: it is not read).
        {
          name: 'WebhookUrl'
          value: webhookUrl
        }
        {
          name: 'WebhookSecret'
          value: '@Microsoft.KeyVault(SecretUri=${webhookSecretUri})'
        }
        {
          name: 'WebhookRetrySchedule'
          value: webhookRetrySchedule
        }
        // Then each agent's queue and service URL settings (the loops above).
      ], agentQueueSettings, agentServiceUrlSettings, laneQueueSettings)
    }
  }
}

// Deploy with Microsoft Entra ID (az login / func publish use tokens), never basic credentials.
resource ftpCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: app
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: app
  name: 'scm'
  properties: {
    allow: false
  }
}

output name string = app.name
output id string = app.id
output defaultHostName string = app.properties.defaultHostName
