output "bucket_name" {
  description = "Name of the bucket (LORAPLEX_S3_BUCKET)."
  value       = module.bucket.s3_bucket_id
}

output "bucket_arn" {
  description = "ARN of the bucket (the IRSA policies scope to its key prefixes)."
  value       = module.bucket.s3_bucket_arn
}

output "kms_key_arn" {
  description = "KMS key of the bucket's objects (readers need kms:Decrypt, writers GenerateDataKey)."
  value       = module.kms.key_arn
}
