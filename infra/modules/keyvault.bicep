// Key Vault holding the app's one secret: TokenKeys, the MAC keys of its continuation and
// fencing tokens (shared/settings.py). The vault is created here; the secret's value is not
// (no key in a template, a parameter or a deployment's history): an operator sets it once with
// `az keyvault secret set` and rotates it the same way (docs/operating.md, "Token keys"). The app
// reads it through a Key Vault reference (functionapp.bicep) with its managed identity, which
// roles.bicep makes a Key Vault Secrets User of this vault.

@description('Key Vault name (3-24 letters, digits and hyphens; globally unique).')
@minLength(3)
@maxLength(24)
param name string

@description('Azure region.')
param location string

param tags object = {}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_109: Flex Consumption without VNet integration resolves Key Vault references over the public endpoint; RBAC only (no access policies), so only the app's identity and the operators it is granted to read secrets.
  // checkov:skip=CKV_AZURE_189: Same reason as CKV_AZURE_109: public endpoint, Microsoft Entra ID and RBAC only.
  name: name
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
    enabledForDeployment: false
    enabledForDiskEncryption: false
    enabledForTemplateDeployment: false
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

output name string = vault.name
output id string = vault.id
// Ends with '/': a secret's URI is '${vaultUri}secrets/NAME'.
output vaultUri string = vault.properties.vaultUri
