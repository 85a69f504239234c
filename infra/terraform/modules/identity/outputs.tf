output "service_account_role_arns" {
  description = "IRSA role ARN of each platform service account (the eks.amazonaws.com/role-arn annotation)."
  value = merge(
    { for role, m in module.workload_irsa : local.service_accounts[role] => m.iam_role_arn },
    { (local.service_accounts["secrets"]) = module.secrets_irsa.iam_role_arn },
  )
}

output "admin_key_secret_arn" {
  description = "Secrets Manager secret of the admin key (JSON: value)."
  value       = aws_secretsmanager_secret.platform["admin-key"].arn
}

output "replica_secret_arn" {
  description = "Secrets Manager secret of the gateway-to-replica shared secret (JSON: value)."
  value       = aws_secretsmanager_secret.platform["replica-secret"].arn
}
