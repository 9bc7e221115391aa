// Storage account: host storage (AzureWebJobsStorage: timer leases, keys), the Flex Consumption
// deployment container, and the app's state tables. Shared keys are off: every caller uses
// Microsoft Entra ID (the app's managed identity, or your own login).

@description('Storage account name (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param name string

@description('Azure region.')
param location string

@description('Blob container the Flex Consumption plan deploys the app package from.')
param deploymentContainerName string

@description('Tables the app reads and writes (the values of its table settings).')
param tableNames array

param tags object = {}

// Containers the Functions host uses in AzureWebJobsStorage: timer schedule monitor and
// singleton leases (azure-webjobs-hosts) and function keys (azure-webjobs-secrets).
// They are created here so the identity's Blob Data Owner role can be scoped to them.
var hostContainerNames = [
  'azure-webjobs-hosts'
  'azure-webjobs-secrets'
]

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35: Flex Consumption without VNet integration reaches storage over its public endpoint; shared keys are off, so only Entra ID callers get in.
  // checkov:skip=CKV_AZURE_59: Same reason as CKV_AZURE_35: public endpoint, Entra ID only (allowSharedKeyAccess false, no anonymous blob access).
  // checkov:skip=CKV_AZURE_206: Locally redundant storage is enough for leases, the deployment package and order state of this app; use Standard_GZRS in production if required.
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    accessTier: 'Hot'
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: {
          enabled: true
          keyType: 'Account'
        }
        table: {
          enabled: true
          keyType: 'Account'
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource hostContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for containerName in hostContainerNames: {
  parent: blobService
  name: containerName
  properties: {
    publicAccess: 'None'
  }
}]

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for tableName in tableNames: {
  parent: tableService
  name: tableName
}]

output id string = storage.id
output name string = storage.name
output blobEndpoint string = storage.properties.primaryEndpoints.blob
output tableEndpoint string = storage.properties.primaryEndpoints.table
output deploymentContainerName string = deploymentContainer.name
output hostContainerNames array = hostContainerNames
