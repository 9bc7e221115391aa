// Order processing on Azure Functions (Flex Consumption, Python 3.11).
//
//   az deployment group create -g RG -f infra/main.bicep -p infra/main.parameters.json
//
// Everything is inline (no registry modules): it builds offline with a Bicep compiler.
// Identity-based connections only: the app runs as one user-assigned managed identity with
// least-privilege roles; no connection string with a key and no key exist anywhere. The app's one
// secret (TokenKeys, its token MAC keys) is in a Key Vault this template creates: an operator
// sets its value (docs/operating.md, "Token keys"); the app reads it by a Key Vault reference.
targetScope = 'resourceGroup'

@description('Short base name of every resource (lowercase letters, digits, hyphens).')
@minLength(3)
@maxLength(16)
param appName string = 'orders'

@description('Azure region of every resource. It must offer the Flex Consumption plan.')
param location string = resourceGroup().location

@description('Email address that receives dead-letter and Supervisor alerts.')
param alertEmail string

@description('Base URL of each agent\'s remote service, path prefix included, keyed by the agent\'s serviceUrlSetting in workflows/agents.json (InventoryServiceUrl, PaymentServiceUrl, ShippingServiceUrl, DeliveryServiceUrl...). Every agent needs one: the app does not start without it.')
param serviceUrls object

@description('SupervisorSchedule: NCRONTAB (six fields, seconds first) of the Supervisor timer.')
param supervisorSchedule string = '*/15 * * * * *'

@description('MaxFailureCount: FailureCount at which a step goes to Error.')
param maxFailureCount int = 3

@description('BackoffThreshold: FailureCount after which the Supervisor delays the redrive.')
param backoffThreshold int = 1

@description('BackoffBaseSeconds: first redrive delay past the threshold; doubles each time.')
param backoffBaseSeconds int = 5

@description('UnclaimedGraceSeconds: age after which an unclaimed Pending order is rescheduled.')
param unclaimedGraceSeconds int = 30

@description('StepTimeoutSeconds: if not empty, overrides every step timeout. Leave empty in Azure.')
param stepTimeoutSeconds string = ''

@description('MaxRequestBytes: largest accepted order body.')
param maxRequestBytes int = 65536

@description('RetentionDays: days a finished order (Processed, or Error with nothing left to do) and its history are kept before the retention timer purges them. Held and attention orders are never purged.')
@minValue(1)
param retentionDays int = 30

@description('RetentionSchedule: NCRONTAB (six fields, seconds first) of the retention purge timer.')
param retentionSchedule string = '0 17 * * * *'

@description('TelemetrySamplingRatio: share of orders (0 to 1) whose telemetry is exported, decided once per order by its trace id; failed, held and compensating orders are kept from the failure on, warnings and errors always. The host samples its own request per invocation at the same ratio. docs/cost.md, Telemetry.')
param telemetrySamplingRatio string = '0.05'

@description('OperatorAuth: the gate of the operator routes and the console. key: the master key. appService: App Service authentication (turn it on, allowing unauthenticated requests for the key-holding clients, before choosing this; the operator routes answer 503 while it is off).')
@allowed([
  'key'
  'appService'
])
param operatorAuth string = 'key'

@description('OperatorRole: in the appService mode, if set, the role (or group id) an operator must have.')
param operatorRole string = ''

@description('ViewerRole: in the appService mode, if set, a role (or group id) that may only read.')
param viewerRole string = ''

@description('WebhookUrl: the https URL told when an order ends (a signed POST, Standard Webhooks; docs/operating.md, Webhooks). Empty: no webhooks. Its secret is the WebhookSecret secret of the Key Vault, set by an operator.')
param webhookUrl string = ''

@description('WebhookRetrySchedule: the delay after each failed try of a webhook (N s, m or h, comma-separated).')
param webhookRetrySchedule string = '5s,5m,30m,2h,5h,10h,10h'

@description('Most instances the Flex Consumption plan scales out to.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('Memory of each instance (MB).')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Tags on every resource.')
param tags object = {}

// The one queue declaration, shared with the Service Bus emulator used locally.
var serviceBusConfig = loadJsonContent('servicebus-config.json')
var queues = serviceBusConfig.UserConfig.Namespaces[0].Queues

// The one declaration of the agents, read by the app too (shared/core/workflows/catalog.py): the Function
// App sets each agent's queue and service URL settings in a loop over it, so a new agent (a line
// there, its queue in servicebus-config.json, its URL in serviceUrls) needs no Bicep edit.
var agentCatalog = loadJsonContent('../workflows/agents.json')
var agents = agentCatalog.agents

// The priority lanes, read by the app too (shared/core/workflows/lanes.py). The first lane uses the work queues
// as they are; every other lane gets a copy of each work queue (the scheduler's, the replies, each
// agent's), named QUEUE-LANE (scheduler-high), with that queue's properties. One loop over
// lanes x work queues (Bicep has no nested loops): i / count is the lane, i % count the queue.
var laneCatalog = loadJsonContent('../workflows/lanes.json')
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
}]

// Tables the app reads: the values of the table settings (StateTable, DeadlineTable,
// OrderIndexTable).
var tableNames = [
  'orders'
  'deadlines'
  'orderindex'
]

var suffix = uniqueString(resourceGroup().id, appName)
var storageAccountName = take('st${toLower(replace(appName, '-', ''))}${suffix}', 24)
var keyVaultName = take('kv-${appName}-${suffix}', 24)
// The secret an operator sets in that vault (versionless: the app follows its latest version).
var tokenKeysSecretName = 'TokenKeys'
var webhookSecretName = 'WebhookSecret'
var deploymentContainerName = 'app-package-${take(suffix, 8)}'

module identity 'modules/identity.bicep' = {
  name: 'identity'
  params: {
    name: 'id-${appName}-${suffix}'
    location: location
    tags: tags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    name: storageAccountName
    location: location
    deploymentContainerName: deploymentContainerName
    tableNames: tableNames
    tags: tags
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    name: 'sb-${appName}-${suffix}'
    location: location
    queues: concat(queues, laneQueues)
    tags: tags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    name: '${appName}-${suffix}'
    location: location
    alertEmail: alertEmail
    serviceBusNamespaceId: serviceBus.outputs.id
    tags: tags
  }
}

module keyVault 'modules/keyvault.bicep' = {
  name: 'keyvault'
  params: {
    name: keyVaultName
    location: location
    tags: tags
  }
}

module roles 'modules/roles.bicep' = {
  name: 'roles'
  params: {
    principalId: identity.outputs.principalId
    serviceBusNamespaceName: serviceBus.outputs.name
    storageAccountName: storage.outputs.name
    deploymentContainerName: storage.outputs.deploymentContainerName
    hostContainerNames: storage.outputs.hostContainerNames
    appInsightsName: monitoring.outputs.appInsightsName
    keyVaultName: keyVault.outputs.name
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  params: {
    name: 'func-${appName}-${suffix}'
    planName: 'plan-${appName}-${suffix}'
    location: location
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageAccountName: storage.outputs.name
    blobEndpoint: storage.outputs.blobEndpoint
    tableEndpoint: storage.outputs.tableEndpoint
    deploymentContainerName: storage.outputs.deploymentContainerName
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    appInsightsConnectionString: monitoring.outputs.appInsightsConnectionString
    tokenKeysSecretUri: '${keyVault.outputs.vaultUri}secrets/${tokenKeysSecretName}'
    webhookSecretUri: '${keyVault.outputs.vaultUri}secrets/${webhookSecretName}'
    webhookUrl: webhookUrl
    webhookRetrySchedule: webhookRetrySchedule
    agents: agents
    fastLanes: fastLanes
    serviceUrls: serviceUrls
    supervisorSchedule: supervisorSchedule
    maxFailureCount: maxFailureCount
    backoffThreshold: backoffThreshold
    backoffBaseSeconds: backoffBaseSeconds
    unclaimedGraceSeconds: unclaimedGraceSeconds
    stepTimeoutSeconds: stepTimeoutSeconds
    maxRequestBytes: maxRequestBytes
    retentionDays: retentionDays
    retentionSchedule: retentionSchedule
    telemetrySamplingRatio: telemetrySamplingRatio
    operatorAuth: operatorAuth
    operatorRole: operatorRole
    viewerRole: viewerRole
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    tags: tags
  }
  // The host starts with its roles in place (storage, Service Bus, telemetry, Key Vault).
  dependsOn: [
    roles
  ]
}

output functionAppName string = functionApp.outputs.name
output functionAppUrl string = 'https://${functionApp.outputs.defaultHostName}'
output serviceBusNamespace string = serviceBus.outputs.fullyQualifiedNamespace
output storageAccountName string = storage.outputs.name
output tableServiceUri string = storage.outputs.tableEndpoint
output appInsightsName string = monitoring.outputs.appInsightsName
output identityClientId string = identity.outputs.clientId
output identityPrincipalId string = identity.outputs.principalId
output keyVaultName string = keyVault.outputs.name
output tokenKeysSecretName string = tokenKeysSecretName
output webhookSecretName string = webhookSecretName
