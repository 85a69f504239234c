# Object storage: the platform's one bucket. Versioned, SSE-KMS with a bucket key, public
# access blocked, TLS-only, incomplete multipart uploads aborted after a day (a client that
# abandons a presigned upload leaves no parts billed for ever), old versions expired.

module "kms" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/kms/aws"
  version = "3.1.1"

  description             = "${var.bucket_name}: objects (adapters and base models)"
  deletion_window_in_days = 30
  enable_key_rotation     = true
  aliases                 = ["${var.bucket_name}-s3"]

  tags = var.tags
}

module "bucket" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/s3-bucket/aws"
  version = "4.6.0"

  bucket        = var.bucket_name
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
  attach_require_latest_tls_policy      = true

  lifecycle_rule = [
    {
      id                                     = "abort-incomplete-multipart-uploads"
      enabled                                = true
      filter                                 = {}
      abort_incomplete_multipart_upload_days = 1
    },
    {
      id      = "expire-noncurrent-versions"
      enabled = true
      filter  = {}
      noncurrent_version_expiration = {
        days = var.noncurrent_version_days
      }
    },
  ]

  cors_rule = length(var.cors_allowed_origins) == 0 ? [] : [
    {
      allowed_methods = ["PUT"]
      allowed_origins = var.cors_allowed_origins
      allowed_headers = ["*"]
      expose_headers  = ["ETag"]
      max_age_seconds = 3600
    },
  ]

  tags = var.tags
}
