variable "region" {
  description = "AWS region of the environment."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must look like us-east-1."
  }
}

variable "bucket_name" {
  description = "Globally unique name of the environment's bucket."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name."
  }
}

variable "endpoint_public_access_cidrs" {
  description = "Operator CIDRs allowed to reach the Kubernetes API endpoint; empty keeps it private."
  type        = list(string)

  validation {
    condition     = alltrue([for c in var.endpoint_public_access_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "endpoint_public_access_cidrs must be valid CIDRs, and not 0.0.0.0/0."
  }
}

variable "cors_allowed_origins" {
  description = "https origins (the console's) allowed to PUT presigned upload parts from a browser."
  type        = list(string)

  validation {
    condition     = alltrue([for o in var.cors_allowed_origins : can(regex("^https://", o))])
    error_message = "cors_allowed_origins must be https:// origins."
  }
}

variable "api_certificate_arn" {
  description = "ACM certificate ARN of the API's hostname: the API and console are served over HTTPS only (HTTP redirects)."
  type        = string

  validation {
    condition = (
      can(regex("^arn:aws(-[a-z]+)*:acm:[a-z]{2}(-[a-z]+)+-[0-9]:[0-9]{12}:certificate/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", var.api_certificate_arn)) &&
      !can(regex(":(111122223333|123456789012|000000000000|444455556666):", var.api_certificate_arn)) &&
      !can(regex("/00000000-0000-0000-0000-000000000000$", var.api_certificate_arn))
    )
    error_message = "api_certificate_arn must be the ARN of a real ACM certificate (arn:aws:acm:REGION:ACCOUNT:certificate/UUID); documentation placeholders are refused."
  }
}

variable "api_allowed_cidrs" {
  description = "Client CIDRs the API's load balancer accepts (0.0.0.0/0 only if you mean the whole internet)."
  type        = list(string)

  validation {
    condition     = length(var.api_allowed_cidrs) > 0 && alltrue([for c in var.api_allowed_cidrs : can(cidrhost(c, 0))])
    error_message = "api_allowed_cidrs must list at least one valid CIDR."
  }
}

variable "budget_emails" {
  description = "Who AWS Budgets mails when the environment's monthly cost passes its budget."
  type        = list(string)

  validation {
    condition     = length(var.budget_emails) > 0 && alltrue([for e in var.budget_emails : can(regex("^[^@ ]+@[^@ ]+\\.[^@ ]+$", e))])
    error_message = "budget_emails must list at least one email address."
  }
}
