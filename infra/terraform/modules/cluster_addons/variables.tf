variable "cluster_name" {
  description = "EKS cluster the add-ons run in."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,99}$", var.cluster_name))
    error_message = "cluster_name must be an EKS cluster name (lowercase letters, digits, dashes)."
  }
}

variable "oidc_provider_arn" {
  description = "IAM OIDC provider of the cluster, trusted by the add-ons' IRSA roles."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/", var.oidc_provider_arn))
    error_message = "oidc_provider_arn must be an IAM OIDC provider ARN."
  }
}

variable "region" {
  description = "AWS region of the cluster."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must look like us-east-1."
  }
}

variable "vpc_id" {
  description = "VPC of the cluster (the load balancer controller needs it without IMDS access)."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC ID (vpc-...)."
  }
}

variable "chart_versions" {
  description = "Pinned Helm chart versions: cluster-autoscaler, aws-load-balancer-controller, external-secrets, keda."
  type        = map(string)

  validation {
    condition = (
      length(setsubtract(["cluster-autoscaler", "aws-load-balancer-controller", "external-secrets", "keda"], keys(var.chart_versions))) == 0 &&
      alltrue([for v in values(var.chart_versions) : can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", v))])
    )
    error_message = "chart_versions needs cluster-autoscaler, aws-load-balancer-controller, external-secrets and keda, each an exact X.Y.Z."
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
