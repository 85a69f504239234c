output "address" {
  description = "Hostname of the primary endpoint."
  value       = module.redis.replication_group_primary_endpoint_address
}

output "port" {
  description = "Redis port (TLS)."
  value       = 6379
}

output "auth_secret_arn" {
  description = "Secrets Manager secret holding the AUTH token (JSON: password)."
  value       = aws_secretsmanager_secret.auth_token.arn
}

output "kms_key_arn" {
  description = "KMS key of the cache and of its AUTH token secret."
  value       = module.kms.key_arn
}
