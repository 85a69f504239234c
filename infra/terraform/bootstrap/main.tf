# Run once per account, with local state: the bucket the environments keep their state in.
# Versioned (an overwritten state can be recovered), KMS-encrypted, private, TLS-only.
# Locking needs no table: the S3 backend's use_lockfile writes a lock object beside the state.

module "kms" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/kms/aws"
  version = "3.1.1"

  description             = "loraplex Terraform state"
  deletion_window_in_days = 30
  enable_key_rotation     = true
  aliases                 = ["loraplex-terraform-state"]
}

module "state_bucket" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/s3-bucket/aws"
  version = "4.6.0"

  bucket        = var.state_bucket_name
  force_destroy = false

  versioning = { enabled = true }

  server_side_encryption_configuration = {
    rule = {
      bucket_key_enabled = true
      apply_server_side_encryption_by_default = {
        sse_algorithm     = "aws:kms"
        kms_master_key_id = module.kms.key_arn
      }
    }
  }

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true

  control_object_ownership = true
  object_ownership         = "BucketOwnerEnforced"

  attach_deny_insecure_transport_policy = true

  lifecycle_rule = [
    {
      id                                     = "keep-recent-state-versions"
      enabled                                = true
      filter                                 = {}
      abort_incomplete_multipart_upload_days = 1
      noncurrent_version_expiration          = { days = 90 }
    },
  ]
}
