output "address" {
  description = "Hostname of the PostgreSQL endpoint."
  value       = module.db.db_instance_address
}

output "port" {
  description = "PostgreSQL port."
  value       = module.db.db_instance_port
}

output "name" {
  description = "Database name."
  value       = module.db.db_instance_name
}

output "instance_identifier" {
  description = "RDS instance identifier (point-in-time restore names it)."
  value       = module.db.db_instance_identifier
}

output "master_secret_arn" {
  description = "Secrets Manager secret (JSON username/password) RDS manages for the master user."
  value       = module.db.db_instance_master_user_secret_arn
}

output "kms_key_arn" {
  description = "KMS key of the storage and of the master secret."
  value       = module.kms.key_arn
}
