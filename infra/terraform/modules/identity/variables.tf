variable "name" {
  description = "Prefix of the roles, policies and secrets (e.g. loraplex-dev)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,30}$", var.name))
    error_message = "name must be 3-31 characters of lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "namespace" {
  description = "Kubernetes namespace of the platform's service accounts."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.namespace)) && length(var.namespace) <= 63
    error_message = "namespace must be a valid Kubernetes namespace name."
  }
}

variable "oidc_provider_arn" {
  description = "IAM OIDC provider of the cluster, trusted by every IRSA role."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/", var.oidc_provider_arn))
    error_message = "oidc_provider_arn must be an IAM OIDC provider ARN."
  }
}

variable "bucket_arn" {
  description = "ARN of the platform's bucket."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9][a-z0-9.-]+$", var.bucket_arn))
    error_message = "bucket_arn must be an S3 bucket ARN."
  }
}

variable "bucket_kms_key_arn" {
  description = "KMS key of the bucket's objects."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:", var.bucket_kms_key_arn))
    error_message = "bucket_kms_key_arn must be a KMS key ARN."
  }
}

variable "external_secret_arns" {
  description = "Secrets made elsewhere that the platform's SecretStore may read (the RDS master secret, the Redis AUTH token)."
  type        = map(string)

  validation {
    condition     = alltrue([for a in values(var.external_secret_arns) : can(regex("^arn:aws[a-z-]*:secretsmanager:", a))])
    error_message = "external_secret_arns must be Secrets Manager ARNs."
  }
}

variable "external_secret_kms_key_arns" {
  description = "KMS keys those secrets are encrypted with."
  type        = list(string)

  validation {
    condition     = alltrue([for a in var.external_secret_kms_key_arns : can(regex("^arn:aws[a-z-]*:kms:", a))])
    error_message = "external_secret_kms_key_arns must be KMS key ARNs."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) > 0 && length(k) <= 128 && length(v) <= 256])
    error_message = "tags need keys of 1-128 and values of at most 256 characters (AWS limits)."
  }
}
