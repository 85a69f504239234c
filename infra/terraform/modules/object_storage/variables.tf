variable "bucket_name" {
  description = "Globally unique name of the platform's bucket (adapters under tenants/, base models under models/)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name)) && !can(regex("\\.\\.", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name (3-63 lowercase letters, digits, dots, dashes)."
  }
}

variable "noncurrent_version_days" {
  description = "Days a replaced or deleted object's old version is kept before it expires."
  type        = number

  validation {
    condition     = var.noncurrent_version_days >= 1 && var.noncurrent_version_days <= 3650
    error_message = "noncurrent_version_days must be 1-3650."
  }
}

variable "cors_allowed_origins" {
  description = "Origins allowed to PUT presigned upload parts from a browser (the console's URL); empty allows none."
  type        = list(string)

  validation {
    condition     = alltrue([for o in var.cors_allowed_origins : can(regex("^https://[a-z0-9.-]+(:[0-9]+)?$", o))])
    error_message = "cors_allowed_origins must be https:// origins without a path."
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
