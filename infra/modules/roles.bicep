// Least-privilege role assignments for the app's managed identity. Each assignment is named
// guid(scope.id, principalId, roleDefinitionId), so redeploying is idempotent and two
// assignments never collide.

@description('Principal (object) id of the app identity.')
param principalId string

@description('Service Bus namespace the app sends to and receives from.')
param serviceBusNamespaceName string

@description('Storage account holding host storage, the deployment container and the state tables.')
param storageAccountName string

@description('Blob container the Flex Consumption plan deploys from.')
param deploymentContainerName string

@description('Host containers of AzureWebJobsStorage (timer leases, keys).')
param hostContainerNames array

@description('Application Insights component the app sends telemetry to.')
param appInsightsName string

@description('Key Vault holding the app\'s TokenKeys secret.')
param keyVaultName string

// Built-in role definition ids (the same in every tenant).
var serviceBusDataSender = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39')
var serviceBusDataReceiver = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0')
var storageTableDataContributor = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3')
var storageBlobDataOwner = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b')
var monitoringMetricsPublisher = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '3913510d-42f4-4e42-8a64-420c390055eb')
var keyVaultSecretsUser = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '4633458b-17de-408a-b874-0445c86b69e6')

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' existing = {
  name: serviceBusNamespaceName
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: deploymentContainerName
}

resource hostContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = [for containerName in hostContainerNames: {
  parent: blobService
  name: containerName
}]

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' existing = {
  name: keyVaultName
}

// Service Bus triggers receive; the scheduler, agents and supervisor send. The console's
// GET /api/deadletters and the overview's queue depths only peek (queues and their
// $DeadLetterQueue): Data Receiver at namespace scope covers them, no Manage right is needed.
resource sbSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace.id, principalId, serviceBusDataSender)
  scope: namespace
  properties: {
    principalId: principalId
    roleDefinitionId: serviceBusDataSender
    principalType: 'ServicePrincipal'
  }
}

resource sbReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace.id, principalId, serviceBusDataReceiver)
  scope: namespace
  properties: {
    principalId: principalId
    roleDefinitionId: serviceBusDataReceiver
    principalType: 'ServicePrincipal'
  }
}

// Order state, deadline and search index tables (StateStorage: every table of main.bicep
// tableNames), and the host's diagnostic events table (AzureWebJobsStorage). Scoped to the
// account, so a table added to tableNames is covered; the account holds nothing but this app's data.
resource tableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, principalId, storageTableDataContributor)
  scope: storage
  properties: {
    principalId: principalId
    roleDefinitionId: storageTableDataContributor
    principalType: 'ServicePrincipal'
  }
}

// The Flex Consumption plan reads the app package from this container only.
resource deploymentBlobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(deploymentContainer.id, principalId, storageBlobDataOwner)
  scope: deploymentContainer
  properties: {
    principalId: principalId
    roleDefinitionId: storageBlobDataOwner
    principalType: 'ServicePrincipal'
  }
}

// The host keeps timer schedule status, singleton leases and function keys in these containers.
resource hostBlobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (containerName, i) in hostContainerNames: {
  name: guid(hostContainers[i].id, principalId, storageBlobDataOwner)
  scope: hostContainers[i]
  properties: {
    principalId: principalId
    roleDefinitionId: storageBlobDataOwner
    principalType: 'ServicePrincipal'
  }
}]

// Telemetry with local auth off is accepted only from a Monitoring Metrics Publisher.
resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, principalId, monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    principalId: principalId
    roleDefinitionId: monitoringMetricsPublisher
    principalType: 'ServicePrincipal'
  }
}

// The TokenKeys Key Vault reference: read secrets only (no list of keys, no write). Scoped to the
// vault, which holds nothing but this app's secret (the secret itself is set by an operator after
// the deployment, so it cannot be a scope here).
resource keyVaultSecretsReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(vault.id, principalId, keyVaultSecretsUser)
  scope: vault
  properties: {
    principalId: principalId
    roleDefinitionId: keyVaultSecretsUser
    principalType: 'ServicePrincipal'
  }
}
