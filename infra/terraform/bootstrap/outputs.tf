output "state_bucket" {
  description = "Bucket to pass as -backend-config=bucket=... to the environments."
  value       = module.state_bucket.s3_bucket_id
}
