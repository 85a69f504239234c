variable "cluster_name" {
  description = "EKS cluster whose GPU nodes Karpenter launches (also the discovery tag's value)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,38}$", var.cluster_name))
    error_message = "cluster_name must be 3-39 characters of lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "oidc_provider_arn" {
  description = "The cluster's IAM OIDC provider (the controller's IRSA role trusts it)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/", var.oidc_provider_arn))
    error_message = "oidc_provider_arn must be an IAM OIDC provider ARN."
  }
}

variable "chart_version" {
  description = "Pinned version of the karpenter Helm chart (oci://public.ecr.aws/karpenter)."
  type        = string

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.chart_version))
    error_message = "chart_version must be an exact X.Y.Z."
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
