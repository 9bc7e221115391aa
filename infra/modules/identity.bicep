// The one identity the Function App runs as. Every data-plane connection (host storage,
// deployment container, Service Bus, state tables, Application Insights) authenticates with it.

@description('Name of the user-assigned managed identity.')
param name string

@description('Azure region.')
param location string

param tags object = {}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

output id string = identity.id
output name string = identity.name
output principalId string = identity.properties.principalId
output clientId string = identity.properties.clientId
