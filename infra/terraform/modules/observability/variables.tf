variable "name" {
  description = "Prefix of the log groups and roles (e.g. loraplex-dev)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,30}$", var.name))
    error_message = "name must be 3-31 characters of lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "oidc_provider_arn" {
  description = "IAM OIDC provider of the cluster (Fluent Bit's IRSA role trusts it)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/", var.oidc_provider_arn))
    error_message = "oidc_provider_arn must be an IAM OIDC provider ARN."
  }
}

variable "region" {
  description = "AWS region the log groups live in."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must look like us-east-1."
  }
}

variable "log_retention_days" {
  description = "Days to keep the containers' logs in CloudWatch."
  type        = number

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch accepts (1, 3, 5, 7, 14, 30, 60, 90, ...)."
  }
}

variable "prometheus_retention_days" {
  description = "Days of metrics Prometheus keeps."
  type        = number

  validation {
    condition     = var.prometheus_retention_days >= 1 && var.prometheus_retention_days <= 90
    error_message = "prometheus_retention_days must be 1-90."
  }
}

variable "prometheus_storage_gb" {
  description = "Size of Prometheus's gp3 volume."
  type        = number

  validation {
    condition     = var.prometheus_storage_gb >= 10 && var.prometheus_storage_gb <= 2000
    error_message = "prometheus_storage_gb must be 10-2000."
  }
}

variable "chart_versions" {
  description = "Pinned Helm chart versions: kube-prometheus-stack, aws-for-fluent-bit, dcgm-exporter."
  type        = map(string)

  validation {
    condition = (
      length(setsubtract(["kube-prometheus-stack", "aws-for-fluent-bit", "dcgm-exporter"], keys(var.chart_versions))) == 0 &&
      alltrue([for v in values(var.chart_versions) : can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", v))])
    )
    error_message = "chart_versions needs kube-prometheus-stack, aws-for-fluent-bit and dcgm-exporter, each an exact X.Y.Z."
  }
}

variable "tags" {
  description = "Tags added to every AWS resource."
  type        = map(string)

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) > 0 && length(k) <= 128 && length(v) <= 256])
    error_message = "tags need keys of 1-128 and values of at most 256 characters (AWS limits)."
  }
}
