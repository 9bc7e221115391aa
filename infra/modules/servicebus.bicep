// Service Bus namespace (Standard) with every queue of infra/servicebus-config.json, the
// one queue declaration (the official emulator's Config.json format), so the emulator used
// locally and Azure have the same queues with the same properties. Local (SAS) auth is off.

@description('Service Bus namespace name.')
param name string

@description('Azure region.')
param location string

@description('Queues in the emulator Config.json format: [{ Name, Properties: { MaxDeliveryCount, ... } }].')
param queues array

param tags object = {}

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' = [for q in queues: {
  parent: namespace
  name: q.Name
  properties: {
    maxDeliveryCount: q.Properties.MaxDeliveryCount
    lockDuration: q.Properties.LockDuration
    defaultMessageTimeToLive: q.Properties.DefaultMessageTimeToLive
    requiresDuplicateDetection: q.Properties.RequiresDuplicateDetection
    duplicateDetectionHistoryTimeWindow: q.Properties.DuplicateDetectionHistoryTimeWindow
    requiresSession: q.Properties.RequiresSession
    deadLetteringOnMessageExpiration: q.Properties.DeadLetteringOnMessageExpiration
    forwardTo: empty(q.Properties.ForwardTo) ? null : q.Properties.ForwardTo
    forwardDeadLetteredMessagesTo: empty(q.Properties.ForwardDeadLetteredMessagesTo) ? null : q.Properties.ForwardDeadLetteredMessagesTo
  }
}]

output id string = namespace.id
output name string = namespace.name
// https://NAME.servicebus.windows.net:443/ -> NAME.servicebus.windows.net (any cloud).
output fullyQualifiedNamespace string = split(replace(namespace.properties.serviceBusEndpoint, 'https://', ''), ':')[0]
