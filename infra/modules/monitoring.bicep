// Log Analytics + Application Insights (local auth off: telemetry is accepted only from
// Entra ID callers, i.e. the app's managed identity), an email action group, and two alerts:
//  - a metric alert when any queue of the namespace holds dead-lettered messages;
//  - a log alert on the Supervisor's alert lines: error-level structured JSON log lines with
//    "event": "alert", orderId, step, reason, failureCount (they land in the traces table).

@description('Base name of the monitoring resources.')
param name string

@description('Azure region.')
param location string

@description('Email address that receives the alerts.')
param alertEmail string

@description('Resource id of the Service Bus namespace watched for dead-lettered messages.')
param serviceBusNamespaceId string

@description('Days Log Analytics keeps the logs.')
@minValue(30)
param retentionInDays int = 30

param tags object = {}

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: 'log-${name}'
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      disableLocalAuth: true
    }
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: 'appi-${name}'
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    DisableLocalAuth: true
    IngestionMode: 'LogAnalytics'
  }
}

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: 'ag-${name}'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: take('ag${name}', 12)
    enabled: true
    emailReceivers: [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

resource deadLetterAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'alert-${name}-deadlettered'
  location: 'global'
  tags: tags
  properties: {
    description: 'A Service Bus queue holds dead-lettered messages: read QUEUE/$DeadLetterQueue (see the README, "Reading the dead-letter queue").'
    severity: 2
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadletteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: actionGroup.id
      }
    ]
  }
}

// The Supervisor logs each alert as an error-level JSON line (also sent to the alerts queue).
var supervisorAlertQuery = '''
traces
| where severityLevel >= 3
| where message has "alert" and message has "event"
| extend alert = parse_json(extract(@"(\{.*\})", 1, message))
| where tostring(alert.event) == "alert"
| project timestamp, orderId = tostring(alert.orderId), step = tostring(alert.step), reason = tostring(alert.reason), failureCount = toint(alert.failureCount), cloud_RoleInstance
'''

resource supervisorAlert 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: 'alert-${name}-supervisor'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'An order alert was raised'
    description: 'A step failed for good (an error reply, or failureCount reached MaxFailureCount) or a compensation failed. See the alerts queue.'
    severity: 1
    enabled: true
    scopes: [
      appInsights.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: false
    criteria: {
      allOf: [
        {
          query: supervisorAlertQuery
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          dimensions: [
            {
              name: 'orderId'
              operator: 'Include'
              values: [
                '*'
              ]
            }
            {
              name: 'step'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

output appInsightsId string = appInsights.id
output appInsightsName string = appInsights.name
// An ingestion endpoint plus the component's id, not a key: with local auth off, ingestion
// needs an Entra ID token as well (APPLICATIONINSIGHTS_AUTHENTICATION_STRING).
output appInsightsConnectionString string = appInsights.properties.ConnectionString
output workspaceId string = workspace.id
output actionGroupId string = actionGroup.id
